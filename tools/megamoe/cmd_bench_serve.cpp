// `megamoe bench serve`: load generator for any OpenAI-compatible completions endpoint (flags and
// result JSON keys shaped like `vllm bench serve`). The work is in server/client/bench_serve.h.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "megamoe/error.h"
#include "server/client/bench_serve.h"
#include "tools/megamoe/cli_util.h"
#include "tools/megamoe/command.h"

namespace {

struct BenchServeFlags {
  megamoe::client::BenchServeOptions options;
  std::string base_url, host = "127.0.0.1", endpoint = "/v1/completions", request_rate = "inf";
  std::string percentile_metrics = "ttft,tpot,itl", metric_percentiles = "99";
  int port = 8000;
  bool save_result = false, disable_tqdm = false;
  std::string result_dir, result_filename;
};

int run(BenchServeFlags& f) {
  using megamoe::tool::split_commas;
  auto& o = f.options;
  MEGAMOE_CHECK(f.endpoint == "/v1/completions", "--endpoint '", f.endpoint, "' is unsupported (/v1/completions)");
  o.base_url = !f.base_url.empty() ? f.base_url : "http://" + f.host + ":" + std::to_string(f.port);
  if (f.request_rate == "inf") {
    o.request_rate = std::numeric_limits<double>::infinity();
  } else {
    try {
      o.request_rate = std::stod(f.request_rate);
    } catch (const std::exception&) {
      MEGAMOE_FAIL("--request-rate '", f.request_rate, "' must be a number or inf");
    }
  }
  o.percentile_metrics = split_commas(f.percentile_metrics);
  o.metric_percentiles.clear();
  for (const std::string& p : split_commas(f.metric_percentiles)) {
    double value = -1;
    try {
      value = std::stod(p);
    } catch (const std::exception&) {
    }
    MEGAMOE_CHECK(value >= 0 && value <= 100, "--metric-percentiles entry '", p, "' must be in [0, 100]");
    o.metric_percentiles.push_back(value);
  }
  o.show_progress = !f.disable_tqdm;
  const nlohmann::json result = megamoe::client::run_bench_serve(o);
  std::printf("%s", megamoe::client::format_bench_summary(result, o).c_str());
  if (f.save_result || o.save_detailed) {
    std::string name = f.result_filename;
    if (name.empty()) {
      const std::string rate = std::isfinite(o.request_rate) ? std::to_string(o.request_rate) : "inf";
      std::string model = result["model_id"].get<std::string>();
      for (char& c : model)
        if (c == '/') c = '_';
      name = "megamoe-" + rate + "qps-" + model + "-" + result["date"].get<std::string>() + ".json";
    }
    const std::filesystem::path path = std::filesystem::path(f.result_dir.empty() ? "." : f.result_dir) / name;
    megamoe::tool::write_json_file(path.string(), result);
    std::printf("saved %s\n", path.string().c_str());
  }
  return result["failed"].get<int>() == 0 ? 0 : 1;
}

}  // namespace

MEGAMOE_SUBCOMMAND("bench", "serve", "load-test an OpenAI-compatible completions endpoint (vLLM bench serve flags)",
                   [](CLI::App& app) -> std::function<int()> {
                     auto f = std::make_shared<BenchServeFlags>();
                     auto& o = f->options;
                     app.add_option("--base-url", f->base_url, "server URL, e.g. http://127.0.0.1:8000 (overrides --host/--port)");
                     app.add_option("--host", f->host, "server host")->capture_default_str();
                     app.add_option("--port", f->port, "server port")->capture_default_str();
                     app.add_option("--endpoint", f->endpoint, "API path")->capture_default_str();
                     app.add_option("--model", o.model, "model name (default: the server's first)");
                     app.add_option("--tokenizer", o.tokenizer, "tokenizer.json or its directory: random prompts avoid its special tokens");
                     app.add_option("--random-vocab-size", o.random_vocab_size, "token id range without --tokenizer")->capture_default_str();
                     app.add_option("--dataset-name", o.dataset_name, "dataset (random)")->capture_default_str();
                     app.add_option("--random-input-len", o.random_input_len, "prompt tokens")->capture_default_str();
                     app.add_option("--random-output-len", o.random_output_len, "max tokens per request")->capture_default_str();
                     app.add_option("--random-range-ratio", o.random_range_ratio, "lengths drawn from [len*(1-r), len*(1+r)]")->capture_default_str();
                     app.add_option("--num-prompts", o.num_prompts, "requests to send")->capture_default_str();
                     app.add_option("--num-warmups", o.num_warmups, "requests sent first and not measured")->capture_default_str();
                     app.add_option("--max-concurrency", o.max_concurrency, "requests in flight at most (default: all)");
                     app.add_option("--request-rate", f->request_rate, "requests/s (Poisson) or inf")->capture_default_str();
                     app.add_flag("--ignore-eos", o.ignore_eos, "generate exactly the output length");
                     app.add_option("--temperature", o.temperature, "sampling temperature")->capture_default_str();
                     app.add_option("--seed", o.seed, "random seed of prompts and arrivals")->capture_default_str();
                     app.add_option("--percentile-metrics", f->percentile_metrics, "ttft,tpot,itl,e2el")->capture_default_str();
                     app.add_option("--metric-percentiles", f->metric_percentiles, "e.g. 50,90,99")->capture_default_str();
                     app.add_flag("--save-result", f->save_result, "save the result JSON");
                     app.add_flag("--save-detailed", o.save_detailed, "also save per-request lists (implies --save-result)");
                     app.add_option("--result-dir", f->result_dir, "directory of the result file");
                     app.add_option("--result-filename", f->result_filename, "result file name");
                     app.add_flag("--disable-tqdm", f->disable_tqdm, "no progress bar");
                     app.add_option("--request-timeout", o.request_timeout_s, "seconds per request")->capture_default_str();
                     return [f] { return run(*f); };
                   });
