// `megamoe eval gsm8k`: 5-shot GSM8K accuracy against an OpenAI-compatible completions endpoint.
// The work is in server/client/gsm8k_eval.h.
#include <cstdio>
#include <filesystem>

#include "megamoe/error.h"
#include "server/client/gsm8k_eval.h"
#include "tools/megamoe/cli_util.h"
#include "tools/megamoe/command.h"

namespace {

struct EvalFlags {
  megamoe::client::Gsm8kOptions options;
  std::string base_url, host = "127.0.0.1", output;
  int port = 8000;
};

// ../shared/data/gsm8k relative to the repository root: found from the working directory (the
// README runs commands from the root) or from the binary's location (<root>/build/megamoe).
std::string default_data_path() {
  const std::string relative = "../shared/data/gsm8k";
  if (std::filesystem::exists(relative + "/test.jsonl")) return relative;
  const std::string root = megamoe::tool::repo_root_from_executable();
  if (!root.empty() && std::filesystem::exists(root + "/" + relative + "/test.jsonl")) return root + "/" + relative;
  return relative;
}

int run(EvalFlags& f) {
  auto& o = f.options;
  o.base_url = !f.base_url.empty() ? f.base_url : "http://" + f.host + ":" + std::to_string(f.port);
  if (o.data_path.empty()) o.data_path = default_data_path();
  const nlohmann::json result = megamoe::client::run_gsm8k_eval(o);
  std::printf("gsm8k %d-shot on %s: %d questions\n", o.num_shots, result["model"].get<std::string>().c_str(),
              result["num_questions"].get<int>());
  std::printf("  accuracy        %.4f (%d correct)\n", result["accuracy"].get<double>(), result["num_correct"].get<int>());
  std::printf("  invalid rate    %.4f (%d without an integer)\n", result["invalid_rate"].get<double>(),
              result["num_invalid"].get<int>());
  std::printf("  failed requests %d\n", result["num_failed_requests"].get<int>());
  std::printf("  questions/s     %.2f (%.1f s)\n", result["questions_per_s"].get<double>(), result["latency_s"].get<double>());
  if (!f.output.empty()) {
    megamoe::tool::write_json_file(f.output, result);
    std::printf("saved %s\n", f.output.c_str());
  }
  return result["num_failed_requests"].get<int>() == 0 ? 0 : 1;
}

}  // namespace

MEGAMOE_SUBCOMMAND("eval", "gsm8k", "5-shot GSM8K accuracy of an OpenAI-compatible completions endpoint",
                   [](CLI::App& app) -> std::function<int()> {
                     auto f = std::make_shared<EvalFlags>();
                     auto& o = f->options;
                     app.add_option("--base-url", f->base_url, "server URL (overrides --host/--port)");
                     app.add_option("--host", f->host, "server host")->capture_default_str();
                     app.add_option("--port", f->port, "server port")->capture_default_str();
                     app.add_option("--model", o.model, "model name (default: the server's first)");
                     app.add_option("--data-path", o.data_path, "directory with train.jsonl and test.jsonl (default ../shared/data/gsm8k from the repo root)");
                     app.add_option("--num-questions", o.num_questions, "first N test questions (0: all)")->capture_default_str();
                     app.add_option("--num-shots", o.num_shots, "few-shot examples from train")->capture_default_str();
                     app.add_option("--max-tokens", o.max_tokens, "tokens per answer")->capture_default_str();
                     app.add_option("--concurrency,--parallel", o.concurrency, "requests in flight")->capture_default_str();
                     app.add_option("--output,--save-result", f->output, "write the result JSON here");
                     app.add_flag("--save-detailed", o.save_detailed, "per-question replies in the JSON");
                     app.add_option("--request-timeout", o.request_timeout_s, "seconds per request")->capture_default_str();
                     return [f] { return run(*f); };
                   });
