// The `staged` MoE backend (GPU, expert parallel): quantize -> dispatch -> grouped GEMM 1 (+SwiGLU +
// requant) -> grouped GEMM 2 -> combine, as separate kernels. See docs/ep.md.
#pragma once

#include <memory>

#include "megamoe/moe.h"

namespace megamoe {

// `ep` may be null: the backend then bootstraps a private single-rank group. Throws megamoe::Error
// with the reason when the configuration is unsupported.
std::unique_ptr<MoeBackend> make_staged_backend(const MoeConfig& config, EpGroup* ep);
Capabilities staged_capabilities();

}  // namespace megamoe
