// Capability report of the `mega` backend: plain C++ so that CPU-only builds (and CI) test it.
#include <algorithm>
#include <string>
#include <vector>

#include "megamoe/ep.h"
#include "megamoe/error.h"
#include "moe/mega_backend.h"

namespace megamoe {

Capabilities mega_capabilities() {
  Capabilities c;
  c.formats = {WeightFormat::kFp8Block, WeightFormat::kBf16, WeightFormat::kNvfp4, WeightFormat::kMxfp4};
  c.activations = {Activation::Kind::kSiluMul, Activation::Kind::kSwigluClamped};
  c.min_ranks = 1;
  c.max_ranks = kMaxEpRanks;
  c.needs_gpu = true;
  c.supports_apply_topk_in_fc1 = true;
  c.supports_shared_expert = false;
  return c;
}

std::string mega_reject_reason(const MoeConfig& c, int ranks) {
  std::vector<std::string> reasons;
  auto add = [&](auto&&... parts) { reasons.push_back(detail::concat(parts...)); };
  if (ranks < 1 || ranks > kMaxEpRanks) add("ranks = ", ranks, " must be in [1, ", kMaxEpRanks, "]");
  switch (c.weight_format) {
    case WeightFormat::kFp8Block:
    case WeightFormat::kBf16:
    case WeightFormat::kNvfp4:  // W4A8: FP8 tokens, FP4 weights decoded to FP8 in the GEMM mainloop
    case WeightFormat::kMxfp4: break;
    default:
      add("weight_format ", weight_format_name(c.weight_format),
          " is not supported (mega runs fp8_block, bf16, nvfp4 and mxfp4)");
      break;
  }
  if (c.hidden <= 0 || c.hidden % 256 != 0)
    add("hidden = ", c.hidden, " must be a positive multiple of 256 (GEMM 2 runs 256-column split-N tiles)");
  if (c.intermediate <= 0 || c.intermediate % 128 != 0)
    add("intermediate = ", c.intermediate, " must be a positive multiple of 128",
        c.weight_format == WeightFormat::kNvfp4 || c.weight_format == WeightFormat::kMxfp4
            ? " (W4A8: GEMM 1's 2 * intermediate rows form 256-row FP4 tiles)"
            : "");
  if (ranks >= 1 && (c.num_experts <= 0 || c.num_experts % ranks != 0))
    add("num_experts = ", c.num_experts, " must be a positive multiple of ranks = ", ranks);
  else if (ranks >= 1 && c.num_experts / ranks > kMegaMaxLocalExperts)
    add("num_experts / ranks = ", c.num_experts / ranks, " local experts must be <= ", kMegaMaxLocalExperts,
        " (the fused kernel's shared memory: pipeline stages, BF16 staging, scale ring or W4A8 decode buffers, and "
        "expert tables; docs/mega.md)");
  if (c.top_k < 1 || c.top_k > std::min(32, std::max(c.num_experts, 1)))
    add("top_k = ", c.top_k, " must be in [1, min(32, num_experts)]");
  if (c.max_tokens_per_rank < 1 || c.max_tokens_per_rank > (1 << 20))
    add("max_tokens_per_rank = ", c.max_tokens_per_rank, " must be in [1, 2^20]");
  if (c.shared_intermediate > 0)
    add("shared_intermediate = ", c.shared_intermediate, ": shared experts are not supported");
  std::string joined;
  for (const std::string& r : reasons) joined += (joined.empty() ? "" : "; ") + r;
  return joined;
}

}  // namespace megamoe
