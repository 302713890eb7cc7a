// Which path a `mega` forward takes: "fused" (the one persistent kernel, sm90_mega_moe.cuh) or "split"
// (the staged pipeline -- dispatch kernel, grouped GEMM 1, grouped GEMM 2, combine kernel --
// staged_pipeline.h, on mega's own weight slabs). Plain C++ (CI tests it).
//
// Measured on 2 x H200 (`megamoe bench layer`, µs per forward, uniform routing; mega = fused kernel):
//                     tokens/rank  rows/local expert   fused    staged
//   dsv3 FP8              128             8             1448     1518
//   (H 7168, I 2048,     2048           128             3051     2630
//    E 256, top-8)       8192           512             9545     8019
//   qwen3-30b FP8         128            16              187     ~227
//   (H 2048, I 768,      2048           256              593     ~450
//    E 128, top-8)       8192          1024             1814    ~1221
// The fused kernel wins at 8-16 rows per local expert (its overlap of dispatch, GEMMs and combine
// hides the latency that dominates there); the staged pipeline wins from ~128 rows up (its grouped
// GEMMs run larger, better-fed tiles). The crossover lies between 16 and 128 rows; the default
// threshold 32 is the geometric middle-ish first guess, to be refined with `--mega-path both`.
// W4A8 (session 9, `--mega-path both`, dsv3 nvfp4, 2 ranks, after the standalone W4A8 kernels' v3/v4):
//                     tokens/rank  rows/local expert   fused    split
//   dsv3 nvfp4            128             8             1761     1609
//                         512            32             1871     1661
//                        2048           128             4258     3475
// the split path wins at every size (the standalone W4A8 GEMMs stage their scales in shared memory and
// GEMM 1 runs the four-warpgroup small-M kernel; the fused kernel has neither), so W4A8 layers take it
// from one row per local expert up (kMegaFusedMaxRowsPerExpertW4a8 = 0; below one row, unmeasured,
// and without an agreed count: fused).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace megamoe {

enum class MegaPath : uint8_t { kFused, kSplit };
// kAuto: the heuristic below; kFused / kSplit: always that path.
enum class MegaPathMode : uint8_t { kAuto, kFused, kSplit };

// Fused when the estimated rows per local expert <= this, split above: FP8 and BF16 weights, and W4A8
// (nvfp4, mxfp4) weights (mega_fused_max_rows_per_expert picks by format).
constexpr int64_t kMegaFusedMaxRowsPerExpert = 32;
constexpr int64_t kMegaFusedMaxRowsPerExpertW4a8 = 0;
// kMegaFusedMaxRowsPerExpertW4a8 for W4A8 formats, else kMegaFusedMaxRowsPerExpert.
int64_t mega_fused_max_rows_per_expert(bool w4a8_weights);

const char* mega_path_name(MegaPath path);            // "fused" / "split"
const char* mega_path_mode_name(MegaPathMode mode);   // "auto" / "fused" / "split"
// "auto" | "fused" | "split" (exactly); anything else: megamoe::Error naming `field` and the choices.
MegaPathMode parse_mega_path_mode(std::string_view text, std::string_view field);
// The mode a MEGAMOE_MEGA_PATH value asks for: null or empty = auto, else parse_mega_path_mode.
MegaPathMode mega_path_mode_from_env_value(const char* value);
// MEGAMOE_MEGA_PATH, read once per process (unset or empty = auto; a bad value throws on first use).
// NOTES: it must be the same on every rank: the allocation of the split path's scratch and the path
// of each forward are collective decisions.
MegaPathMode mega_path_mode_from_env();

// Rows per local expert that uniform routing of `tokens` tokens per rank gives: tokens * top_k / local
// experts (>= 0; top_k and local experts clamped to >= 1).
int64_t mega_rows_per_local_expert(int64_t tokens, int top_k, int local_experts);

// The token count a forward's path is decided on. Both paths are collective (every rank must launch
// the same one, or the ranks wait for each other in different protocols until the timeout), so it
// must be a value every rank agrees on WITHOUT a host synchronisation (the forward is asynchronous and
// CUDA-graph capturable; exchanging the per-rank counts would need a device -> host copy per call):
//   one rank                         -> `tokens` (this forward's T: nobody else to agree with);
//   max_tokens_any_rank >= 0 given   -> it (MoeInputs::max_tokens_any_rank: the caller's promise that
//                                       it is the same on every rank and >= every rank's T, e.g. the
//                                       benchmark's or an engine's batch size per rank);
//   otherwise                        -> 0, i.e. the fused kernel (mega's behaviour before the split path).
// NOTES: a capacity fallback (MoeConfig::max_tokens_per_rank is the same everywhere) was the first
// draft; it made the choice static per layer, so a multi-GPU decode engine configured with a large
// capacity would have run every small decode step down the split path. Callers that know the batch
// (the benchmark; an engine that agrees on its step sizes) pass max_tokens_any_rank. Ranks with zero
// tokens take the agreed path like every other rank. The split scratch is still allocated when the
// capacity makes the split path reachable (mega_split_reachable), since a caller may pass it.
int64_t mega_agreed_tokens(int ranks, int64_t tokens, int64_t max_tokens_any_rank, int64_t capacity);

// The path of a forward whose agreed token count is `agreed_tokens` (agreed <= 0 -> fused for any
// threshold: no agreed count, or no tokens). fused_max_rows: mega_fused_max_rows_per_expert(format).
MegaPath choose_mega_path(MegaPathMode mode, int64_t agreed_tokens, int top_k, int local_experts,
                          int64_t fused_max_rows = kMegaFusedMaxRowsPerExpert);
// Whether any forward of a layer with this capacity can take the split path, i.e. whether the layer
// needs the staged pipeline's scratch (the EP dispatcher's window and buffers, docs/mega.md "Split path").
bool mega_split_reachable(MegaPathMode mode, int64_t capacity, int top_k, int local_experts,
                          int64_t fused_max_rows = kMegaFusedMaxRowsPerExpert);

}  // namespace megamoe
