// `megamoe bench layer`: times one MoE layer forward for a shape, a weight format and a routing, on
// one or more backends side by side (ratios to the first), optionally checked against `reference`.
//
// NOTES:
//   * Effective TFLOP/s = 2 * rows * H * I * 3 / t, rows = routed (token, expert) pairs (id >= 0):
//     GEMM-1 is [rows, H] x [H, 2I], GEMM-2 [rows, I] x [I, H].
//   * Weights: `distinct_experts` random experts (each its own seeded stream, built in parallel; normal,
//     scaled 1/sqrt(K), quantized with
//     formats::quantize); expert e uses pool[e % distinct_experts]. CPU backends (needs_gpu false)
//     are built with num_experts = distinct_experts and ids taken mod distinct_experts: the same
//     arithmetic for every token, without E dense copies in host memory.
//   * Routing: softmax top-k (route_reference, renormalised) over logits log(p_e) + Gumbel noise, which
//     samples k distinct experts per token with probability p: uniform (p_e = 1/E), zipf
//     (p_e ~ 1/(e+1)^1.2 over a seeded permutation of the experts), one-rank (only the experts of
//     rank 0, [0, E/ranks)).
//   * Routing has its own seeded stream (independent of the weights), so `--floor-only` computes the
//     very routing a timed run uses without generating weights. Every rank routes the same tokens.
//   * Floor = max over ranks r of max(compute, weight read, NVLink) of rank r, with the measured H200
//     ceilings of docs/perf.md (FP8 1420 TFLOP/s, BF16 780, W4A8 run as FP8; HBM 4.2 TB/s; NVLink
//     370 GB/s per direction per GPU, measured on 2 GPUs and assumed for a GPU's NVSwitch ports on
//     4 / 8): compute = FLOPs of the rows rank r receives (ranks x its share of the shared routing);
//     weight read = rank r's local experts with >= 1 routed row x their packed bytes incl. scales;
//     NVLink = max(bytes out, bytes in) of rank r / 370 GB/s, counting the least any EP scheme moves:
//     each token once to every other rank holding one of its experts (FP8 row + scales; BF16 row for
//     bf16 weights) and one BF16 partial row back per (token, such rank). ratio_to_floor = median /
//     floor; the JSON also has each term (floor_compute_us, floor_weights_us, floor_nvlink_us) and
//     which one bounds (floor_bound).
//   * NVLink GB/s = (nvlink_bytes_out + nvlink_bytes_in) / t, bytes of rank 0 from the NVLink floor's
//     model above (layer_nvlink_bytes: the least any EP scheme moves, not what a backend's padding or
//     protocol adds), both directions summed (so the H200 ceiling is 2 x 370 GB/s). t = the median
//     "dispatch" + "combine" phase times for a backend that reports them (`staged`), else the
//     median forward (`mega`, whose transfers overlap its GEMMs). 0 on one rank (nothing crosses NVLink).
//   * Split: GPU backends run with MoeBackend::set_phase_timing(true); "split µs" gives the median of
//     each phase of last_phase_times() over the timed forwards (dispatch / gemm1 / gemm2 / combine for
//     `staged`; stage / offsets / pull / gemm1 / gemm2 / combine_wait / reduce for `mega`, each up to
//     the latest CTA passing its end: src/moe/mega_phase_times.h), "-" for backends without phases
//     (`reference`). JSON: phases_us, and for `mega` also phases_cta_mean_us (per-CTA means).
//   * `mega` rows name the path their forwards took (--mega-path: fused kernel or split = the staged
//     pipeline on mega's weights); with "both" each token count has a mega[fused] and a mega[split] row.
//   * --check runs `reference` on the first `check_tokens` tokens and compares each backend's rows.
#pragma once

#include "bench/gpu_clock_probe.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "megamoe/moe.h"
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
  // The path(s) `mega` rows run (src/moe/mega_path_heuristics.h): "auto" (its heuristic, decided on
  // the token count every rank runs, passed as MoeInputs::max_tokens_any_rank), "fused", "split", or
  // "both" (two rows per token count: fused and split). Other backends ignore it.
  std::string mega_path = "auto";
};

// The floor of one forward and its three terms (see the NOTES above), in µs.
struct LayerFloor {
  double compute_us = 0, weights_us = 0, nvlink_us = 0;
  double us() const;
  const char* bound() const;  // "compute", "weights" or "nvlink": the largest term
};

struct LayerCaseResult {
  std::string backend;  // `mega` rows: "mega[<path>]" when forced, "mega[auto:<path>]" under the heuristic
  std::string path;     // the path the timed forwards took (MoeBackend::last_forward_path); "" for one-path backends
  int tokens = 0;
  int64_t rows = 0;  // routed (token, expert) pairs
  double median_us = 0, min_us = 0, tflops = 0;
  // Rank 0's timed forwards in launch order (µs) and their 90th percentile: whether a spread between
  // medians is a few slow iterations or a slow run shows here (the JSON keeps them all).
  std::vector<double> iter_us;
  double p90_us = 0;
  std::vector<GpuClockSample> iter_clocks;  // after each timed forward (GpuClockProbe; empty without NVML)
  double ratio_to_first = 0;  // this backend's time / the first backend's time, same tokens
  double floor_us = 0, ratio_to_floor = 0;  // see the NOTES above
  LayerFloor floor;
  double nvlink_bytes_out = 0, nvlink_bytes_in = 0, nvlink_gbps = 0;  // rank 0; see the NOTES above
  std::vector<MoeBackend::PhaseTime> phases;  // per-phase median µs; empty without phase timing
  bool checked = false, check_passed = false;
  double check_rel_l2 = 0, check_max_abs = 0;
};

// Validates the options (clear megamoe::Error naming the option), runs every (tokens, backend) case,
// prints one line per case as it finishes.
std::vector<LayerCaseResult> run_layer_bench(const LayerBenchOptions& options);
void print_layer_table(const LayerBenchOptions& options, const std::vector<LayerCaseResult>& results);
// Checks what must hold before ranks are launched: --ranks in [1, kMaxEpRanks], experts a multiple of
// the ranks, and for one-rank routing at least top_k experts per rank. Throws megamoe::Error naming
// the option and the limit.
void validate_layer_ranks(const LayerBenchOptions& options);
// Per-rank floor in µs (see the NOTES above) for `rows` routed pairs and `touched_experts` local experts,
// compute and weight read only.
double layer_floor_us(const LayerShape& shape, WeightFormat format, int64_t rows, int touched_experts);
// The floor of one forward on `ranks` ranks that all route `ids` ([tokens, top_k], -1 = padding).
LayerFloor layer_floor(const LayerShape& shape, WeightFormat format, int ranks, const std::vector<int32_t>& ids);
// Bytes rank `rank` sends (out) and receives (in) over NVLink in one forward on `ranks` ranks that
// all route `ids`, as the NVLink floor counts them (see the NOTES above).
struct LayerNvlinkBytes {
  double out = 0, in = 0;
};
LayerNvlinkBytes layer_nvlink_bytes(const LayerShape& shape, WeightFormat format, int ranks,
                                    const std::vector<int32_t>& ids, int rank = 0);
// "disp 410 / g1 4050 / g2 2030 / comb 900" (µs, rounded), "-" when `phases` is empty.
std::string phase_split_text(const std::vector<MoeBackend::PhaseTime>& phases);
// `--floor-only`: the routing of every token count of `options` and its floor, without weights,
// backends or GPUs (rows = routed pairs of one rank's tokens).
struct LayerFloorRow {
  int tokens = 0;
  int64_t rows = 0;
  LayerFloor floor;
};
std::vector<LayerFloorRow> layer_floors(const LayerBenchOptions& options);
void print_layer_floors(const LayerBenchOptions& options, const std::vector<LayerFloorRow>& rows);
nlohmann::json layer_floors_json(const LayerBenchOptions& options, const std::vector<LayerFloorRow>& rows);
nlohmann::json layer_results_json(const LayerBenchOptions& options, const std::vector<LayerCaseResult>& results);

}  // namespace megamoe::bench
