// `megamoe bench layer`: times one MoE layer forward for a shape, a weight format and a routing, on
// one or more backends side by side (ratios to the first), optionally checked against `reference`.
//
// NOTES:
//   * Effective TFLOP/s = 2 * rows * H * I * 3 / t, rows = routed (token, expert) pairs (id >= 0):
//     GEMM-1 is [rows, H] x [H, 2I], GEMM-2 [rows, I] x [I, H].
//   * Weights: `distinct_experts` random experts (seeded, normal, scaled 1/sqrt(K), quantized with
//     formats::quantize); expert e uses pool[e % distinct_experts]. CPU backends (needs_gpu false)
//     are built with num_experts = distinct_experts and ids taken mod distinct_experts: the same
//     arithmetic for every token, without E dense copies in host memory.
//   * Routing: softmax top-k (route_reference, renormalised) over logits log(p_e) + Gumbel noise, which
//     samples k distinct experts per token with probability p: uniform (p_e = 1/E), zipf
//     (p_e ~ 1/(e+1)^1.2 over a seeded permutation of the experts), one-rank (only the experts of
//     rank 0, [0, E/ranks)).
//   * Floor (per rank) = max(FLOPs / dense tensor rate, expert weight bytes touched / HBM bandwidth) with
//     the measured H200 ceilings of docs/perf.md (FP8 1420 TFLOP/s, BF16 780, W4A8 run as FP8; HBM
//     4.2 TB/s); weight bytes = this rank's local experts with >= 1 routed row (rank 0's, from the
//     shared routing) x their packed bytes incl. scales. ratio_to_floor = median / floor.
//   * --check runs `reference` on the first `check_tokens` tokens and compares each backend's rows.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "megamoe/types.h"

namespace megamoe::bench {

struct LayerShape {
  std::string name;
  int hidden = 0, intermediate = 0, experts = 0, top_k = 0;
};
const std::vector<LayerShape>& layer_presets();
// Throws megamoe::Error listing the presets when `name` is unknown.
LayerShape find_layer_preset(std::string_view name);

enum class RoutingPattern { kUniform, kZipf, kOneRank };
RoutingPattern parse_routing_pattern(std::string_view name);
std::string_view routing_pattern_name(RoutingPattern pattern);

struct LayerBenchOptions {
  LayerShape shape;
  WeightFormat format = WeightFormat::kFp8Block;
  Activation activation{};
  bool apply_topk_in_fc1 = false;
  std::vector<int> tokens{64};
  RoutingPattern routing = RoutingPattern::kUniform;
  std::vector<std::string> backends{"reference"};
  int ranks = 1;
  bool check = false;
  int check_tokens = 32;
  int iters = 5;
  int warmup = 1;
  int distinct_experts = 8;
  uint64_t seed = 1;
};

struct LayerCaseResult {
  std::string backend;
  int tokens = 0;
  int64_t rows = 0;  // routed (token, expert) pairs
  double median_us = 0, min_us = 0, tflops = 0;
  double ratio_to_first = 0;  // this backend's time / the first backend's time, same tokens
  double floor_us = 0, ratio_to_floor = 0;  // see the NOTES above
  bool checked = false, check_passed = false;
  double check_rel_l2 = 0, check_max_abs = 0;
};

// Validates the options (clear megamoe::Error naming the option), runs every (tokens, backend) case,
// prints one line per case as it finishes.
std::vector<LayerCaseResult> run_layer_bench(const LayerBenchOptions& options);
void print_layer_table(const LayerBenchOptions& options, const std::vector<LayerCaseResult>& results);
// Per-rank floor in µs (see the NOTES above) for `rows` routed pairs and `touched_experts` local experts.
double layer_floor_us(const LayerShape& shape, WeightFormat format, int64_t rows, int touched_experts);
nlohmann::json layer_results_json(const LayerBenchOptions& options, const std::vector<LayerCaseResult>& results);

}  // namespace megamoe::bench
