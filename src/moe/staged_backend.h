// The `staged` MoE backend (GPU, expert parallel): quantize -> dispatch -> grouped GEMM 1 (+SwiGLU +
// requant) -> grouped GEMM 2 -> combine, as separate kernels. See docs/ep.md.
#pragma once

#include <memory>
#include <string>

#include "megamoe/moe.h"

namespace megamoe {

// `ep` may be null: the backend then bootstraps a private single-rank group. `workspace` (may be
// null: a private one) holds the scratch layers share (moe.h, docs/moe_workspace.md). Throws
// megamoe::Error with the reason when the configuration is unsupported.
std::unique_ptr<MoeBackend> make_staged_backend(const MoeConfig& config, EpGroup* ep,
                                                std::shared_ptr<MoeWorkspace> workspace = nullptr);
Capabilities staged_capabilities();
// Empty when `staged` (and so the staged pipeline, staged_pipeline.h) can run `config` on `ranks`
// ranks, else the first reason (names the field and the limit).
std::string staged_reject_reason(const MoeConfig& config, int ranks);

}  // namespace megamoe
