// Routers: router logits [T, E] (fp32) -> top-k expert ids (int32, -1 = none) and weights (fp32).
// The CPU versions here are the reference; the CUDA versions (routing_cuda.h) follow them operation by
// operation: ids identical except between candidates whose scores are within a few ulp (device expf /
// log1pf vs the host libm), weights within a few ulp.
#pragma once

#include <cstdint>
#include <string_view>

namespace megamoe {

enum class RouterKind : uint8_t {
  kSoftmaxTopK,      // Mixtral / Qwen3-MoE: softmax over E, top-k, optional renormalisation
  kSigmoidGrouped,   // DeepSeek-V3: sigmoid, bias for selection only, group-limited top-k
  kSqrtSoftplus,     // DeepSeek-V4: sqrt(softplus(logit)), bias for selection only
  kHash,             // ids from a per-token-id table; weights from the unbiased scores
};

// Score function used to turn logits into the unbiased scores that weights come from.
enum class ScoreFunction : uint8_t { kSoftmax, kSigmoid, kSqrtSoftplus };

struct RouterConfig {
  RouterKind kind = RouterKind::kSoftmaxTopK;
  int num_experts = 0;
  int top_k = 0;
  bool renormalize = true;             // weights /= sum(selected weights) (sum 0 -> divide by 1)
  int num_groups = 1;                  // kSigmoidGrouped: n_group
  int top_k_groups = 1;                // kSigmoidGrouped: topk_group
  float routed_scaling_factor = 1.0f;  // multiplies final weights (DeepSeek)
  ScoreFunction hash_score = ScoreFunction::kSqrtSoftplus;  // kHash only

  void validate() const;  // throws megamoe::Error naming the field and the limit
};

struct RouterInputs {
  const float* logits = nullptr;            // [T, E]
  int64_t num_tokens = 0;
  const float* correction_bias = nullptr;   // [E] or null; selection only (DeepSeek)
  const uint8_t* padding = nullptr;         // [T] or null; nonzero -> ids -1, weights 0
  const int32_t* token_ids = nullptr;       // [T], kHash only
  const int32_t* hash_table = nullptr;      // [vocab, top_k], kHash only
  int64_t hash_vocab = 0;                   // rows of hash_table
};

// Writes ids [T, top_k] and weights [T, top_k]. NaN logits never select an expert and never
// produce a NaN weight (a row whose candidates are all NaN gets ids -1, weights 0); ties go to the
// lowest expert id; selected ids of a row are ordered by descending selection score.
void route_reference(const RouterConfig& config, const RouterInputs& inputs, int32_t* topk_ids,
                     float* topk_weights);

RouterKind parse_router_kind(std::string_view name);
std::string_view router_kind_name(RouterKind kind);

}  // namespace megamoe
