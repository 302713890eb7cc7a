// The `mega` MoE backend (GPU, expert parallel): one persistent kernel per forward does dispatch, both
// expert GEMMs and combine (src/kernels/sm90_mega_moe.cuh). See docs/mega.md.
#pragma once

#include <memory>
#include <string>

#include "megamoe/moe.h"
#include "mega_path_heuristics.h"  // same directory: also found from bench/ (root include path)

namespace megamoe {

// Most local experts (num_experts / ranks) `mega` accepts: its kernel's shared memory holds 4 pipeline
// stages of 128 x 256 tiles, the BF16 staging / SwiGLU exchange, the scale ring (FP8) or the decoded FP8
// weight double buffers (W4A8), and four expert tables of E + 1 ints (static_asserts in mega_backend.cu
// and mega_w4a8.cu; W4A8 nvfp4 at 128 x 256 would allow 563, docs/mega.md "W4A8").
constexpr int kMegaMaxLocalExperts = 512;

// What `mega` runs: FP8-block, BF16 and W4A8 (nvfp4, mxfp4) weights, SiLU-and-mul and clamped SwiGLU, apply_topk_in_fc1, 1..8 ranks.
Capabilities mega_capabilities();
// Empty when `mega` can run `config` on `ranks` ranks, else every reason (naming the field and the
// limit, and for an unsupported weight format why it is not supported yet). Plain C++ (CI tests it).
std::string mega_reject_reason(const MoeConfig& config, int ranks);

// `ep` may be null: the backend then bootstraps a private single-rank group. Throws megamoe::Error
// with mega_reject_reason() when the configuration is unsupported.
// `workspace` (may be null: a private one) holds the window and scratch layers share (moe.h).
// Each forward takes the fused kernel or the split path (the staged pipeline on the same weights) as
// `path_mode` says (mega_path_heuristics.h); without it, MEGAMOE_MEGA_PATH (default auto). The split
// path's scratch is allocated only when a forward can take it (docs/mega.md "Split path"); kSplit
// throws when `staged` cannot run the configuration. Same mode on every rank.
std::unique_ptr<MoeBackend> make_mega_backend(const MoeConfig& config, EpGroup* ep,
                                              std::shared_ptr<MoeWorkspace> workspace = nullptr);
std::unique_ptr<MoeBackend> make_mega_backend(const MoeConfig& config, EpGroup* ep,
                                              std::shared_ptr<MoeWorkspace> workspace, MegaPathMode path_mode);

}  // namespace megamoe
