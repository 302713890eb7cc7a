// CPU reference routers. Every GPU router kernel is tested against these.
//
// NOTES: exact order of operations (all arithmetic in IEEE fp32, round to nearest even; GPU kernels
// use expf/log1pf/sqrtf and IEEE division (__fdiv_rn), never the fast-math intrinsics):
//
//   Validity.  A candidate expert e of row t is *valid* iff its selection score is not NaN. A NaN
//              logit makes the selection score NaN, so NaN logits never select an expert. A row
//              with fewer than top_k valid candidates fills the remaining slots with id -1,
//              weight 0. Padding rows (padding[t] != 0) get ids -1 and weights 0 for every slot.
//              +inf logits are rejected (they would make every score function produce NaN/inf
//              weights); -inf logits are valid (score 0 / probability 0).
//
//   Scores (the "unbiased score" s_e that weights come from):
//     softmax:       m = max over non-NaN logits; ex_e = (l_e == -inf) ? 0 : expf(l_e - m);
//                    S = lane_strided_sum(ex) over non-NaN e (see below); s_e = ex_e / (S == 0 ? 1 : S)
//     sigmoid:       s_e = 1.0f / (1.0f + expf(-l_e))
//     sqrt_softplus: sp = (l_e > 20) ? l_e : log1pf(expf(l_e)); s_e = sqrtf(sp)
//   Selection score: b_e = s_e + bias_e (fp32 add) when correction_bias is given, else s_e; for
//     softmax the selection score is the logit itself (monotone in s_e, so the same experts, and
//     independent of expf rounding); with a bias, softmax selects on s_e + bias_e.
//
//   lane_strided_sum (one warp per row, 32 lanes): lane L accumulates x[L], x[L+32], x[L+64], ...
//     in increasing index order starting from 0.0f; then for offset = 16, 8, 4, 2, 1:
//     p[L] = p[L] + p[L ^ offset] (a __shfl_xor butterfly; all lanes end equal); result p[0].
//
//   Group-limited selection (num_groups > 1; every kind except hash): experts are split into
//     num_groups contiguous groups of E/num_groups. Group score = sum of the top-2 valid selection
//     scores of the group, added as (first + second) in fp32 (first = the larger; a group with one
//     valid expert or of size 1 scores its single top score; a group with none is never selected).
//     The top_k_groups best groups (ties -> lower group id) are kept; experts outside them are
//     invalid for this row.
//
//   Top-k: k rounds of arg-max over the remaining valid candidates, scanning ids upward and
//     replacing only on a strictly greater score, so ties go to the lowest id and the k ids come out
//     in descending selection-score order.
//
//   Weights: w_j = s_{id_j} for the selected slots (0 for id -1). If renormalize:
//     sum = w_0 + w_1 + ... + w_{k-1} (fp32, sequential, slot order); w_j = w_j / (sum == 0 ? 1 : sum).
//     Then w_j = w_j * routed_scaling_factor. (DeepSeek-V3/V4: weights / sum * rsf.)
//
//   Hash: id_j = hash_table[token_ids[t] * top_k + j]; the weight uses the unbiased score of that
//     expert under hash_score (softmax over all E, sigmoid, or sqrt-softplus); a slot whose logit is
//     NaN gets id -1, weight 0. Renormalisation and rsf as above.
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "megamoe/error.h"
#include "megamoe/routing.h"

namespace megamoe {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::string normalized_name(std::string_view name) {
  std::string out(name);
  for (char& c : out) c = c == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Sum in the order a 32-lane warp computes it (see NOTES).
float lane_strided_sum(const std::vector<float>& values) {
  std::array<float, 32> lanes{};
  for (size_t i = 0; i < values.size(); ++i) lanes[i % 32] = lanes[i % 32] + values[i];
  for (int offset = 16; offset >= 1; offset /= 2) {
    std::array<float, 32> next{};
    for (int lane = 0; lane < 32; ++lane) next[lane] = lanes[lane] + lanes[lane ^ offset];
    lanes = next;
  }
  return lanes[0];
}

float sigmoid(float logit) { return 1.0f / (1.0f + std::exp(-logit)); }

float sqrt_softplus(float logit) {
  const float softplus = logit > 20.0f ? logit : std::log1p(std::exp(logit));
  return std::sqrt(softplus);
}

// Unbiased scores of one row under `function`; NaN logits give NaN scores.
void unbiased_scores(ScoreFunction function, const float* logits, int num_experts, std::vector<float>& scores) {
  scores.assign(num_experts, 0.0f);
  switch (function) {
    case ScoreFunction::kSoftmax: {
      float max_logit = kNegInf;
      for (int e = 0; e < num_experts; ++e)
        if (!std::isnan(logits[e]) && logits[e] > max_logit) max_logit = logits[e];
      std::vector<float> exps(num_experts, 0.0f);
      for (int e = 0; e < num_experts; ++e) {
        const float l = logits[e];
        if (std::isnan(l)) continue;  // contributes 0 to the sum, score stays NaN below
        exps[e] = l == kNegInf ? 0.0f : std::exp(l - max_logit);
      }
      const float sum = lane_strided_sum(exps);
      const float divisor = sum == 0.0f ? 1.0f : sum;
      for (int e = 0; e < num_experts; ++e)
        scores[e] = std::isnan(logits[e]) ? logits[e] : exps[e] / divisor;
      break;
    }
    case ScoreFunction::kSigmoid:
      for (int e = 0; e < num_experts; ++e) scores[e] = sigmoid(logits[e]);
      break;
    case ScoreFunction::kSqrtSoftplus:
      for (int e = 0; e < num_experts; ++e) scores[e] = sqrt_softplus(logits[e]);
      break;
  }
}

ScoreFunction score_function_of(RouterKind kind) {
  switch (kind) {
    case RouterKind::kSoftmaxTopK: return ScoreFunction::kSoftmax;
    case RouterKind::kSigmoidGrouped: return ScoreFunction::kSigmoid;
    case RouterKind::kSqrtSoftplus: return ScoreFunction::kSqrtSoftplus;
    case RouterKind::kHash: break;
  }
  return ScoreFunction::kSoftmax;
}

// Arg-max over valid candidates (non-NaN, not yet taken); -1 when none. Ties -> lowest index.
int arg_max(const std::vector<float>& score, const std::vector<char>& available) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(score.size()); ++i) {
    if (!available[i] || std::isnan(score[i])) continue;
    if (best < 0 || score[i] > score[best]) best = i;
  }
  return best;
}

void finish_weights(const RouterConfig& config, const int32_t* ids, float* weights) {
  if (config.renormalize) {
    float sum = 0.0f;
    for (int j = 0; j < config.top_k; ++j) sum = sum + weights[j];
    const float divisor = sum == 0.0f ? 1.0f : sum;
    for (int j = 0; j < config.top_k; ++j) weights[j] = weights[j] / divisor;
  }
  for (int j = 0; j < config.top_k; ++j)
    weights[j] = ids[j] < 0 ? 0.0f : weights[j] * config.routed_scaling_factor;
}

}  // namespace

void RouterConfig::validate() const {
  MEGAMOE_CHECK(num_experts > 0, "router num_experts = ", num_experts, " must be > 0");
  MEGAMOE_CHECK(top_k >= 1 && top_k <= num_experts, "router top_k = ", top_k, " must be in [1, num_experts = ",
                num_experts, "]");
  MEGAMOE_CHECK(num_groups >= 1 && num_groups <= num_experts, "router num_groups = ", num_groups,
                " must be in [1, num_experts = ", num_experts, "]");
  MEGAMOE_CHECK(num_experts % num_groups == 0, "router num_groups = ", num_groups,
                " must divide num_experts = ", num_experts);
  MEGAMOE_CHECK(top_k_groups >= 1 && top_k_groups <= num_groups, "router top_k_groups = ", top_k_groups,
                " must be in [1, num_groups = ", num_groups, "]");
  MEGAMOE_CHECK(kind != RouterKind::kHash || num_groups == 1, "router num_groups = ", num_groups,
                " must be 1 for hash routing (groups do not apply)");
  const int64_t reachable = static_cast<int64_t>(top_k_groups) * (num_experts / num_groups);
  MEGAMOE_CHECK(top_k <= reachable, "router top_k = ", top_k, " must be <= top_k_groups * experts per group = ",
                top_k_groups, " * ", num_experts / num_groups, " = ", reachable);
  MEGAMOE_CHECK(std::isfinite(routed_scaling_factor) && routed_scaling_factor > 0.0f,
                "router routed_scaling_factor = ", routed_scaling_factor, " must be finite and > 0");
}

void route_reference(const RouterConfig& config, const RouterInputs& inputs, int32_t* topk_ids,
                     float* topk_weights) {
  config.validate();
  const int num_experts = config.num_experts;
  const int top_k = config.top_k;
  const int64_t num_tokens = inputs.num_tokens;
  MEGAMOE_CHECK(num_tokens >= 0, "router num_tokens = ", num_tokens, " must be >= 0");
  if (num_tokens == 0) return;
  MEGAMOE_CHECK(inputs.logits != nullptr, "router logits must not be null (num_tokens = ", num_tokens, ")");
  MEGAMOE_CHECK(topk_ids != nullptr && topk_weights != nullptr, "router outputs topk_ids/topk_weights must not be null");
  if (inputs.correction_bias != nullptr) {
    for (int e = 0; e < num_experts; ++e)
      MEGAMOE_CHECK(std::isfinite(inputs.correction_bias[e]), "router correction_bias[", e,
                    "] = ", inputs.correction_bias[e], " must be finite");
  }
  const bool hash = config.kind == RouterKind::kHash;
  if (hash) {
    MEGAMOE_CHECK(inputs.token_ids != nullptr, "router token_ids must be given for hash routing");
    MEGAMOE_CHECK(inputs.hash_table != nullptr && inputs.hash_vocab > 0,
                  "router hash_table must be given with hash_vocab > 0 for hash routing (hash_vocab = ",
                  inputs.hash_vocab, ")");
  }
  const ScoreFunction function = hash ? config.hash_score : score_function_of(config.kind);
  const int group_size = num_experts / config.num_groups;

  std::vector<float> scores, selection(num_experts), group_score(config.num_groups);
  std::vector<char> available(num_experts), group_available(config.num_groups);
  for (int64_t t = 0; t < num_tokens; ++t) {
    int32_t* ids = topk_ids + t * top_k;
    float* weights = topk_weights + t * top_k;
    for (int j = 0; j < top_k; ++j) ids[j] = -1, weights[j] = 0.0f;
    if (inputs.padding != nullptr && inputs.padding[t] != 0) continue;
    const float* logits = inputs.logits + t * num_experts;
    for (int e = 0; e < num_experts; ++e)
      MEGAMOE_CHECK(logits[e] != std::numeric_limits<float>::infinity(), "router logits[", t, ", ", e,
                    "] = +inf; logits must be finite, -inf or NaN");
    unbiased_scores(function, logits, num_experts, scores);

    if (hash) {
      const int32_t token = inputs.token_ids[t];
      MEGAMOE_CHECK(token >= 0 && token < inputs.hash_vocab, "router token_ids[", t, "] = ", token,
                    " must be in [0, hash_vocab = ", inputs.hash_vocab, ")");
      for (int j = 0; j < top_k; ++j) {
        const int32_t expert = inputs.hash_table[static_cast<int64_t>(token) * top_k + j];
        MEGAMOE_CHECK(expert >= 0 && expert < num_experts, "router hash_table[", token, ", ", j, "] = ", expert,
                      " must be in [0, num_experts = ", num_experts, ")");
        if (std::isnan(scores[expert])) continue;  // NaN logit never selects, never weighs
        ids[j] = expert;
        weights[j] = scores[expert];
      }
      finish_weights(config, ids, weights);
      continue;
    }

    for (int e = 0; e < num_experts; ++e) {
      if (inputs.correction_bias != nullptr) selection[e] = scores[e] + inputs.correction_bias[e];
      else selection[e] = function == ScoreFunction::kSoftmax ? logits[e] : scores[e];
      available[e] = 1;
    }
    if (config.num_groups > 1) {
      for (int g = 0; g < config.num_groups; ++g) {
        float first = kNegInf, second = kNegInf;
        int valid = 0;
        for (int e = g * group_size; e < (g + 1) * group_size; ++e) {
          const float s = selection[e];
          if (std::isnan(s)) continue;
          ++valid;
          if (s > first) second = first, first = s;
          else if (s > second) second = s;
        }
        group_score[g] = valid == 0 ? std::numeric_limits<float>::quiet_NaN()
                                    : (valid == 1 || group_size == 1 ? first : first + second);
        group_available[g] = 1;
      }
      std::vector<char> keep(config.num_groups, 0);
      for (int round = 0; round < config.top_k_groups; ++round) {
        const int g = arg_max(group_score, group_available);
        if (g < 0) break;
        keep[g] = 1;
        group_available[g] = 0;
      }
      for (int e = 0; e < num_experts; ++e)
        if (!keep[e / group_size]) available[e] = 0;
    }
    for (int j = 0; j < top_k; ++j) {
      const int e = arg_max(selection, available);
      if (e < 0) break;
      available[e] = 0;
      ids[j] = e;
      weights[j] = scores[e];
    }
    finish_weights(config, ids, weights);
  }
}

RouterKind parse_router_kind(std::string_view name) {
  const std::string n = normalized_name(name);
  if (n == "softmax" || n == "softmax_topk") return RouterKind::kSoftmaxTopK;
  if (n == "sigmoid_grouped" || n == "sigmoid" || n == "deepseek_v3" || n == "dsv3")
    return RouterKind::kSigmoidGrouped;
  if (n == "sqrt_softplus" || n == "sqrtsoftplus" || n == "deepseek_v4" || n == "dsv4") return RouterKind::kSqrtSoftplus;
  if (n == "hash") return RouterKind::kHash;
  MEGAMOE_FAIL("router kind '", name, "' is unknown; expected one of softmax_topk, sigmoid_grouped, sqrt_softplus, hash");
}

std::string_view router_kind_name(RouterKind kind) {
  switch (kind) {
    case RouterKind::kSoftmaxTopK: return "softmax_topk";
    case RouterKind::kSigmoidGrouped: return "sigmoid_grouped";
    case RouterKind::kSqrtSoftplus: return "sqrt_softplus";
    case RouterKind::kHash: return "hash";
  }
  return "?";
}

}  // namespace megamoe
