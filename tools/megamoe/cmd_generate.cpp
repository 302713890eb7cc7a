// `megamoe generate`: load a model (CPU or GPU runner, `--device`) and continue prompts given as token
// ids (a smoke test of checkpoints, --load-format dummy geometries and --moe-backend; the server does
// text). With --data-parallel-size N --enable-expert-parallel and a GPU backend, the command starts
// one process per GPU (src/ep/launcher.cpp): each rank runs its own prompt (attention data parallel)
// and the MoE layers shard the experts over the ranks, every rank stepping through every layer.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#ifdef MEGAMOE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include <nlohmann/json.hpp>

#include "engine/cli_options.h"
#include "engine/generate.h"
#include "engine/gpu_model.h"
#include "megamoe/ep.h"
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
  std::vector<std::string> prompt_ids;
  int random_prompt_len = 0;
  megamoe::engine::SamplingParams sampling;
  int prefill_chunk = 0;
  int data_parallel_size = 1;
  bool enable_expert_parallel = false;
  int repeat = 1;
  std::string logits_out;  // JSON: prompt, generated ids and the logits each was sampled from
};

int run(GenerateArgs& args) {
  using clock = std::chrono::steady_clock;
  MEGAMOE_CHECK(args.data_parallel_size >= 1 && args.data_parallel_size <= megamoe::kMaxEpRanks,
                "--data-parallel-size ", args.data_parallel_size, " must be in [1, ", megamoe::kMaxEpRanks, "]");
  MEGAMOE_CHECK(args.repeat >= 1, "--repeat ", args.repeat, " must be >= 1");
  megamoe::engine::RunnerOptions options = args.engine.resolve();
  const bool multi_rank = args.data_parallel_size > 1;
  megamoe::LaunchedRank launched;
  const bool is_rank = megamoe::launched_rank_from_env(&launched);
  if (multi_rank) {
    MEGAMOE_CHECK(args.enable_expert_parallel, "--data-parallel-size ", args.data_parallel_size,
                  " needs --enable-expert-parallel (generate runs DP attention + EP MoE, one process per GPU)");
    MEGAMOE_CHECK(megamoe::engine::resolve_runner_device(options) == "cuda", "--data-parallel-size ",
                  args.data_parallel_size, " in generate runs the GPU runner: use --device cuda or a GPU --moe-backend "
                  "(the CPU runner's expert parallelism is served by `megamoe serve`)");
    if (!is_rank) return megamoe::relaunch_self_on_ranks(args.data_parallel_size);
    MEGAMOE_CHECK(launched.ranks == args.data_parallel_size, "launched with ", launched.ranks,
                  " ranks but --data-parallel-size is ", args.data_parallel_size);
  }
  const int rank = multi_rank ? launched.rank : 0;
#ifdef MEGAMOE_WITH_CUDA
  std::unique_ptr<megamoe::EpGroup> group;
#endif
  if (multi_rank) {
#ifdef MEGAMOE_WITH_CUDA
    group = megamoe::EpGroup::bootstrap(launched.rank, launched.ranks, launched.rendezvous);
    options.ep = group.get();
#else
    MEGAMOE_FAIL("--data-parallel-size ", args.data_parallel_size, " needs a CUDA build");
#endif
    options.load.progress = rank == 0 && options.load.progress;
    // NOTES: ranks step together through every layer; generation stops at max_tokens on all of
    // them (an EOS on one rank would leave the others waiting in the MoE collective).
    args.sampling.ignore_eos = true;
  }

  // Rank r runs prompt r (mod the prompts given); --random-prompt-len draws seeded ids instead.
  const auto start = clock::now();
  auto runner = megamoe::engine::make_model_runner(args.engine.model, options);
  const auto loaded = clock::now();
  std::vector<int32_t> prompt;
  if (args.random_prompt_len > 0) {
    std::mt19937_64 rng(static_cast<uint64_t>(options.load.seed) * 1000003u + static_cast<uint64_t>(rank));
    std::uniform_int_distribution<int32_t> id(0, runner->info().vocab_size - 1);
    for (int i = 0; i < args.random_prompt_len; ++i) prompt.push_back(id(rng));
  } else {
    prompt = parse_ids(args.prompt_ids.empty() ? std::string("1,2,3,4") : args.prompt_ids[rank % args.prompt_ids.size()]);
  }
  megamoe::engine::GenerateOptions generate_options;
  generate_options.prefill_chunk = args.prefill_chunk;
  std::vector<std::vector<float>> sampled_logits;
  std::vector<int32_t> out;
  double best_prefill = 1e30, best_decode_step = 1e30, total_seconds = 0;
  for (int r = 0; r < args.repeat; ++r) {
    megamoe::engine::GenerateStats stats;
    generate_options.stats = &stats;
    sampled_logits.clear();
    generate_options.sampled_logits = args.logits_out.empty() ? nullptr : &sampled_logits;
    const auto t0 = clock::now();
    out = megamoe::engine::generate(*runner, prompt, args.sampling, generate_options);
    total_seconds = std::chrono::duration<double>(clock::now() - t0).count();
    best_prefill = std::min(best_prefill, stats.prefill_seconds);
    if (out.size() > 1) best_decode_step = std::min(best_decode_step, stats.decode_seconds / (out.size() - 1));
  }
  std::string memory = runner->memory_report();
#ifdef MEGAMOE_WITH_CUDA
  if (!memory.empty()) {
    // NOTES: the runner allocates up front (weights, workspaces, activations, KV cache) and frees
    // nothing while it runs, so memory in use after the run is the run's peak (cuDNN plan workspaces
    // and graphs included).
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      char line[160];
      std::snprintf(line, sizeof(line), "\npeak device memory: %.2f GiB of %.2f GiB",
                    (total_bytes - free_bytes) / 1073741824.0, total_bytes / 1073741824.0);
      memory += line;
    }
  }
#endif
  const int graphs = runner->decode_graphs_captured();
  const long long replays = static_cast<long long>(runner->decode_graph_replays());
  runner.reset();  // the MoE backends use the group
#ifdef MEGAMOE_WITH_CUDA
  if (group) group->destroy();
#endif
  if (!args.logits_out.empty()) {
    // One file per rank with data parallelism: PATH.rank<r>.
    const std::string path = multi_rank ? args.logits_out + ".rank" + std::to_string(rank) : args.logits_out;
    std::ofstream file(path);
    MEGAMOE_CHECK(file.good(), "--logits-out: cannot write '", path, "'");
    file << nlohmann::json{{"rank", rank}, {"prompt", prompt}, {"generated", out}, {"logits", sampled_logits}}.dump()
         << "\n";
    MEGAMOE_CHECK(file.good(), "--logits-out: writing '", path, "' failed");
  }
  std::string prefix = multi_rank ? "rank " + std::to_string(rank) + " " : "";
  std::printf("%sgenerated:", prefix.c_str());
  for (int32_t id : out) std::printf(" %d", id);
  std::printf("\n%sload %.2f s, generate %.3f s (%zu prompt + %zu new tokens), prefill %.4f s = %.0f tokens/s "
              "(best of %d)\n",
              prefix.c_str(), std::chrono::duration<double>(loaded - start).count(), total_seconds, prompt.size(),
              out.size(), best_prefill, static_cast<double>(prompt.size()) / best_prefill, args.repeat);
  if (!memory.empty()) {
    std::printf("%sdecode graphs: %d captured, %lld replays%s; decode %.3f ms per step (best of %d)\n", prefix.c_str(),
                graphs, replays, options.enforce_eager ? " (--enforce-eager)" : "",
                best_decode_step < 1e29 ? best_decode_step * 1000 : 0.0, args.repeat);
    std::istringstream lines(memory);
    for (std::string line; std::getline(lines, line);) std::printf("%s%s\n", prefix.c_str(), line.c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

MEGAMOE_SUBCOMMAND("", "generate", "continue prompts of token ids with the CPU or GPU model runner",
                   [](CLI::App& app) -> std::function<int()> {
  auto args = std::make_shared<GenerateArgs>();
  args->sampling.temperature = 0.0f;
  megamoe::engine::add_engine_options(app, args->engine);
  app.add_option("--prompt-ids", args->prompt_ids,
                 "comma-separated token ids (default 1,2,3,4); repeat the flag to give data-parallel rank r prompt r");
  app.add_option("--random-prompt-len", args->random_prompt_len,
                 "instead of --prompt-ids: seeded random ids of this length (per rank)");
  app.add_option("--max-tokens", args->sampling.max_tokens, "tokens to generate")->capture_default_str();
  app.add_option("--temperature", args->sampling.temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-p", args->sampling.top_p, "nucleus mass")->capture_default_str();
  app.add_option("--sampling-seed", args->sampling.seed, "-1 = nondeterministic")->capture_default_str();
  app.add_flag("--ignore-eos", args->sampling.ignore_eos, "keep going after an EOS token");
  app.add_option("--prefill-chunk", args->prefill_chunk, "prefill in chunks of this many tokens (0 = whole)");
  app.add_option("--data-parallel-size", args->data_parallel_size,
                 "ranks (one process per GPU; needs --enable-expert-parallel)")
      ->capture_default_str();
  app.add_flag("--enable-expert-parallel", args->enable_expert_parallel, "shard the experts over the ranks");
  app.add_option("--logits-out", args->logits_out,
                 "write the prompt, the generated ids and the logits each was sampled from as JSON "
                 "(PATH.rank<r> per rank with --data-parallel-size)");
  app.add_option("--repeat", args->repeat, "run the generation this many times (timing: best prefill)")
      ->capture_default_str();
  return [args] { return run(*args); };
});
