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
  c.formats = {WeightFormat::kFp8Block, WeightFormat::kBf16};
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
    case WeightFormat::kBf16: break;
    case WeightFormat::kNvfp4:
    case WeightFormat::kMxfp4:
      add("weight_format ", weight_format_name(c.weight_format),
          " is not supported yet: the fused kernel runs the FP8-block and BF16 GEMM pipelines only (the W4A8 "
          "FP4 -> FP8 decode GEMM is not fused into it; use backend staged for ", weight_format_name(c.weight_format), ")");
      break;
    default:
      add("weight_format ", weight_format_name(c.weight_format), " is not supported (mega runs fp8_block and bf16)");
      break;
  }
  if (c.hidden <= 0 || c.hidden % 256 != 0)
    add("hidden = ", c.hidden, " must be a positive multiple of 256 (GEMM 2 runs 256-column split-N tiles)");
  if (c.intermediate <= 0 || c.intermediate % 128 != 0)
    add("intermediate = ", c.intermediate, " must be a positive multiple of 128");
  if (ranks >= 1 && (c.num_experts <= 0 || c.num_experts % ranks != 0))
    add("num_experts = ", c.num_experts, " must be a positive multiple of ranks = ", ranks);
  else if (ranks >= 1 && c.num_experts / ranks > kMegaMaxLocalExperts)
    add("num_experts / ranks = ", c.num_experts / ranks, " local experts must be <= ", kMegaMaxLocalExperts,
        " (the fused kernel's shared memory: pipeline stages, BF16 staging, scale ring and expert tables)");
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
