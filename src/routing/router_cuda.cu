// Typed validating API of the CUDA routers (routing_cuda.h): host-side checks, then one launch.
#include <cstdint>
#include <limits>
#include <string>

#include "kernels/sm90_router.cuh"
#include "megamoe/error_cuda.h"
#include "megamoe/routing_cuda.h"

namespace megamoe {

void route_cuda(const RouterConfig& config, const RouterDeviceInputs& inputs, int32_t* topk_ids,
                float* topk_weights, StreamHandle stream) {
  config.validate();
  MEGAMOE_CHECK(config.num_experts <= kCudaRouterMaxExperts, "router num_experts = ", config.num_experts,
                " must be <= ", kCudaRouterMaxExperts, " for the CUDA router");
  MEGAMOE_CHECK(config.top_k <= kCudaRouterMaxTopK, "router top_k = ", config.top_k, " must be <= ",
                kCudaRouterMaxTopK, " for the CUDA router");
  MEGAMOE_CHECK(inputs.num_tokens >= 0 && inputs.num_tokens <= std::numeric_limits<int32_t>::max(),
                "router num_tokens = ", inputs.num_tokens, " must be in [0, 2^31)");
  if (inputs.num_tokens == 0) return;
  MEGAMOE_CHECK(inputs.logits != nullptr, "router logits must not be null (num_tokens = ", inputs.num_tokens, ")");
  MEGAMOE_CHECK(topk_ids != nullptr && topk_weights != nullptr,
                "router outputs topk_ids/topk_weights must not be null");
  const bool hash = config.kind == RouterKind::kHash;
  if (hash) {
    MEGAMOE_CHECK(inputs.token_ids != nullptr, "router token_ids must be given for hash routing");
    MEGAMOE_CHECK(inputs.hash_table != nullptr && inputs.hash_vocab > 0,
                  "router hash_table must be given with hash_vocab > 0 for hash routing (hash_vocab = ",
                  inputs.hash_vocab, ")");
  }

  kernels::sm90::RouterParams params;
  params.logits = inputs.logits;
  params.correction_bias = inputs.correction_bias;
  params.padding = inputs.padding;
  params.token_ids = hash ? inputs.token_ids : nullptr;
  params.hash_table = hash ? inputs.hash_table : nullptr;
  params.hash_vocab = hash ? inputs.hash_vocab : 0;
  params.topk_ids = topk_ids;
  params.topk_weights = topk_weights;
  params.status = reinterpret_cast<unsigned long long*>(inputs.status);
  params.num_tokens = static_cast<int>(inputs.num_tokens);
  params.num_experts = config.num_experts;
  params.top_k = config.top_k;
  params.num_groups = config.num_groups;
  params.top_k_groups = config.top_k_groups;
  params.routed_scaling_factor = config.routed_scaling_factor;
  params.hash = hash;
  params.renormalize = config.renormalize;
  switch (config.kind) {
    case RouterKind::kSoftmaxTopK: params.score = ScoreFunction::kSoftmax; break;
    case RouterKind::kSigmoidGrouped: params.score = ScoreFunction::kSigmoid; break;
    case RouterKind::kSqrtSoftplus: params.score = ScoreFunction::kSqrtSoftplus; break;
    case RouterKind::kHash: params.score = config.hash_score; break;
  }
  kernels::sm90::launch_router(params, static_cast<cudaStream_t>(stream));
}

void reset_router_status(uint64_t* status, StreamHandle stream) {
  MEGAMOE_CHECK(status != nullptr, "router status must not be null");
  MEGAMOE_CUDA_CHECK(cudaMemsetAsync(status, 0xFF, sizeof(uint64_t), static_cast<cudaStream_t>(stream)));
}

void check_router_status(const RouterConfig& config, const RouterDeviceInputs& inputs, StreamHandle stream) {
  MEGAMOE_CHECK(inputs.status != nullptr, "router status must not be null to be checked");
  const auto s = static_cast<cudaStream_t>(stream);
  uint64_t status = 0;
  MEGAMOE_CUDA_CHECK(cudaMemcpyAsync(&status, inputs.status, sizeof(status), cudaMemcpyDeviceToHost, s));
  MEGAMOE_CUDA_CHECK(cudaStreamSynchronize(s));
  const std::string message = describe_router_status(status, config, inputs.hash_vocab);
  MEGAMOE_CHECK(message.empty(), message);
}

}  // namespace megamoe
