// `megamoe bench serve`: a load generator for OpenAI-compatible completion endpoints, shaped like
// vLLM's `vllm bench serve` (random dataset, request rate or unlimited, concurrency cap, warmups)
// and saving its result JSON keys, so megamoe and vLLM runs compare line by line.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace megamoe::client {

struct BenchServeOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string model;                     // "" -> the endpoint's first model
  std::string tokenizer;                 // tokenizer.json (or its directory): prompt token ids avoid its specials
  int random_vocab_size = 1000;          // used when no tokenizer is given
  std::string dataset_name = "random";
  int random_input_len = 1024;
  int random_output_len = 128;
  double random_range_ratio = 0.0;
  int num_prompts = 1000;
  int num_warmups = 0;
  int max_concurrency = 0;               // 0: as many as prompts
  double request_rate = std::numeric_limits<double>::infinity();
  bool ignore_eos = false;
  double temperature = 0.0;
  uint64_t seed = 0;
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl"};
  std::vector<double> metric_percentiles = {99};
  bool save_detailed = false;
  bool show_progress = true;
  double request_timeout_s = 600;
};

// Runs the benchmark; returns the result JSON (vLLM keys). Throws megamoe::Error on bad options.
nlohmann::json run_bench_serve(const BenchServeOptions& options);
// The human-readable summary table of a result.
std::string format_bench_summary(const nlohmann::json& result, const BenchServeOptions& options);

// numpy-style percentile (linear interpolation), q in [0, 100]; 0 for an empty list.
double percentile(std::vector<double> values, double q);

}  // namespace megamoe::client
