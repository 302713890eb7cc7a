// `megamoe generate`: load a model with the CPU runner and continue prompts given as token ids (a smoke
// test of checkpoints, --load-format dummy geometries and --moe-backend; the server does text).
#include <chrono>
#include <cstdio>
#include <sstream>

#include "engine/cli_options.h"
#include "engine/generate.h"
#include "megamoe/error.h"
#include "tools/megamoe/command.h"

namespace {

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    try {
      ids.push_back(static_cast<int32_t>(std::stol(item)));
    } catch (const std::exception&) {
      MEGAMOE_FAIL("--prompt-ids: '", item, "' is not an integer token id");
    }
  }
  MEGAMOE_CHECK(!ids.empty(), "--prompt-ids is empty");
  return ids;
}

struct GenerateArgs {
  megamoe::engine::EngineCliOptions engine;
  std::string prompt_ids = "1,2,3,4";
  megamoe::engine::SamplingParams sampling;
  int prefill_chunk = 0;
};

}  // namespace

MEGAMOE_SUBCOMMAND("", "generate", "continue a prompt of token ids with the CPU model runner",
                   [](CLI::App& app) -> std::function<int()> {
  auto args = std::make_shared<GenerateArgs>();
  args->sampling.temperature = 0.0f;
  megamoe::engine::add_engine_options(app, args->engine);
  app.add_option("--prompt-ids", args->prompt_ids, "comma-separated token ids")->capture_default_str();
  app.add_option("--max-tokens", args->sampling.max_tokens, "tokens to generate")->capture_default_str();
  app.add_option("--temperature", args->sampling.temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-p", args->sampling.top_p, "nucleus mass")->capture_default_str();
  app.add_option("--sampling-seed", args->sampling.seed, "-1 = nondeterministic")->capture_default_str();
  app.add_flag("--ignore-eos", args->sampling.ignore_eos, "keep going after an EOS token");
  app.add_option("--prefill-chunk", args->prefill_chunk, "prefill in chunks of this many tokens (0 = whole)");
  return [args] {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    auto runner = megamoe::engine::make_cpu_model_runner(args->engine.model, args->engine.resolve());
    const auto loaded = clock::now();
    const std::vector<int32_t> prompt = parse_ids(args->prompt_ids);
    megamoe::engine::GenerateOptions options;
    options.prefill_chunk = args->prefill_chunk;
    const std::vector<int32_t> out = megamoe::engine::generate(*runner, prompt, args->sampling, options);
    const auto done = clock::now();
    std::printf("generated:");
    for (int32_t id : out) std::printf(" %d", id);
    std::printf("\nload %.2f s, generate %.3f s (%zu prompt + %zu new tokens)\n",
                std::chrono::duration<double>(loaded - start).count(),
                std::chrono::duration<double>(done - loaded).count(), prompt.size(), out.size());
    return 0;
  };
});
