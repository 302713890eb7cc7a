// Reference routers: selection rules, weights, padding, NaN handling, ties, bad configurations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/formats_test_util.h"
#include "megamoe/error.h"
#include "megamoe/routing.h"

using namespace megamoe;
using megamoe::test::expect_error_mentions;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed route(const RouterConfig& config, const std::vector<float>& logits, const float* bias = nullptr,
             const uint8_t* padding = nullptr) {
  const int64_t tokens = static_cast<int64_t>(logits.size()) / config.num_experts;
  // Poison the outputs so that an unwritten slot is visible.
  Routed r{std::vector<int32_t>(tokens * config.top_k, 12345), std::vector<float>(tokens * config.top_k, kNaN)};
  RouterInputs in;
  in.logits = logits.data();
  in.num_tokens = tokens;
  in.correction_bias = bias;
  in.padding = padding;
  route_reference(config, in, r.ids.data(), r.weights.data());
  return r;
}

RouterConfig config_of(RouterKind kind, int num_experts, int top_k) {
  RouterConfig config;
  config.kind = kind;
  config.num_experts = num_experts;
  config.top_k = top_k;
  return config;
}

double softmax_prob(const std::vector<float>& row, int e) {
  double max = -INFINITY;
  for (float l : row) max = std::max(max, static_cast<double>(l));
  double sum = 0;
  for (float l : row) sum += std::exp(static_cast<double>(l) - max);
  return std::exp(static_cast<double>(row[e]) - max) / sum;
}

}  // namespace

TEST(Routing, SoftmaxTopKMatchesFp64WithAndWithoutRenormalisation) {
  const unsigned seed = 1234;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const int E = 64, K = 6, T = 37;
  std::vector<float> logits(T * E);
  for (float& l : logits) l = normal(rng);
  for (bool renormalize : {false, true}) {
    RouterConfig config;
    config.kind = RouterKind::kSoftmaxTopK;
    config.num_experts = E;
    config.top_k = K;
    config.renormalize = renormalize;
    const Routed r = route(config, logits);
    for (int t = 0; t < T; ++t) {
      std::vector<float> row(logits.begin() + t * E, logits.begin() + (t + 1) * E);
      std::vector<int> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
      double selected_sum = 0;
      for (int j = 0; j < K; ++j) selected_sum += softmax_prob(row, order[j]);
      for (int j = 0; j < K; ++j) {
        ASSERT_EQ(r.ids[t * K + j], order[j]) << "seed " << seed << " token " << t << " slot " << j;
        double want = softmax_prob(row, order[j]);
        if (renormalize) want /= selected_sum;
        EXPECT_NEAR(r.weights[t * K + j], want, 1.5e-6 * want + 1e-12)
            << "seed " << seed << " token " << t << " slot " << j << " renormalize " << renormalize;
      }
      if (renormalize) {
        float sum = 0;
        for (int j = 0; j < K; ++j) sum += r.weights[t * K + j];
        EXPECT_NEAR(sum, 1.0f, 3e-7f);
      }
    }
  }
}

TEST(Routing, PaddingRowsGetMinusOneAndZero) {
  RouterConfig config;
  config.num_experts = 8;
  config.top_k = 2;
  std::vector<float> logits(3 * 8);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>((i * 7) % 11) - 5.0f;
  const uint8_t padding[3] = {0, 1, 0};
  for (RouterKind kind : {RouterKind::kSoftmaxTopK, RouterKind::kSigmoidGrouped, RouterKind::kSqrtSoftplus}) {
    config.kind = kind;
    const Routed r = route(config, logits, nullptr, padding);
    EXPECT_EQ(r.ids[2], -1);
    EXPECT_EQ(r.ids[3], -1);
    EXPECT_EQ(r.weights[2], 0.0f);
    EXPECT_EQ(r.weights[3], 0.0f);
    EXPECT_GE(r.ids[0], 0);
    EXPECT_GE(r.ids[4], 0);
    EXPECT_GT(r.weights[0], 0.0f);
  }
}

TEST(Routing, NaNLogitsNeverSelectedNorNaNWeights) {
  for (RouterKind kind : {RouterKind::kSoftmaxTopK, RouterKind::kSigmoidGrouped, RouterKind::kSqrtSoftplus}) {
    RouterConfig config = config_of(kind, 6, 3);
    // Row 0: NaN at the would-be best expert; row 1: only two valid experts; row 2: all NaN.
    std::vector<float> logits = {kNaN, 1.0f, 2.0f, -1.0f, 0.5f, 0.0f,  //
                                 kNaN, kNaN, 3.0f, kNaN, kNaN, -2.0f,  //
                                 kNaN, kNaN, kNaN, kNaN, kNaN, kNaN};
    const Routed r = route(config, logits);
    EXPECT_EQ(r.ids[0], 2) << router_kind_name(kind);
    EXPECT_EQ(r.ids[1], 1);
    EXPECT_EQ(r.ids[2], 4);
    EXPECT_EQ(r.ids[3], 2);
    EXPECT_EQ(r.ids[4], 5);
    EXPECT_EQ(r.ids[5], -1);
    EXPECT_EQ(r.weights[5], 0.0f);
    for (int j = 6; j < 9; ++j) {
      EXPECT_EQ(r.ids[j], -1);
      EXPECT_EQ(r.weights[j], 0.0f);
    }
    for (float w : r.weights) EXPECT_FALSE(std::isnan(w)) << router_kind_name(kind);
    // Renormalised over the two valid slots of row 1.
    EXPECT_NEAR(r.weights[3] + r.weights[4], 1.0f, 2e-7f);
  }
}

TEST(Routing, TiesGoToLowestIdInDescendingOrder) {
  for (RouterKind kind : {RouterKind::kSoftmaxTopK, RouterKind::kSigmoidGrouped, RouterKind::kSqrtSoftplus}) {
    RouterConfig config = config_of(kind, 8, 4);
    const std::vector<float> logits = {0.5f, 1.0f, 0.5f, 1.0f, 1.0f, 0.5f, 0.25f, 1.0f};
    const Routed r = route(config, logits);
    EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3, 4, 7})) << router_kind_name(kind);
    config.top_k = 6;
    const Routed r6 = route(config, logits);
    EXPECT_EQ(r6.ids, (std::vector<int32_t>{1, 3, 4, 7, 0, 2})) << router_kind_name(kind);
  }
}

TEST(Routing, CorrectionBiasSelectsButDoesNotWeigh) {
  RouterConfig config = config_of(RouterKind::kSigmoidGrouped, 4, 2);
  config.routed_scaling_factor = 2.5f;
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f, -1.0f};
  const float bias[4] = {0.0f, 0.0f, 0.0f, 1.0f};  // lifts expert 3 (0.269 + 1) above expert 0 (0.881)
  const Routed r = route(config, logits, bias);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 0}));
  const double s3 = 1.0 / (1.0 + std::exp(1.0)), s0 = 1.0 / (1.0 + std::exp(-2.0));
  EXPECT_NEAR(r.weights[0], 2.5 * s3 / (s3 + s0), 1e-6);
  EXPECT_NEAR(r.weights[1], 2.5 * s0 / (s3 + s0), 1e-6);
  config.renormalize = false;
  const Routed raw = route(config, logits, bias);
  EXPECT_NEAR(raw.weights[0], 2.5 * s3, 1e-6);
  EXPECT_NEAR(raw.weights[1], 2.5 * s0, 1e-6);
}

TEST(Routing, GroupLimitedSelectionUsesTopTwoSum) {
  RouterConfig config = config_of(RouterKind::kSigmoidGrouped, 8, 2);
  config.num_groups = 4;
  config.top_k_groups = 2;
  config.renormalize = false;
  // Sigmoid is monotone. Group 0 = {0,1} holds the single best expert (0) but its second is poor;
  // groups 1 = {2,3} and 2 = {4,5} have better top-2 sums; group 3 is worst.
  const std::vector<float> logits = {6.0f, -6.0f, 2.0f, 2.0f, 1.5f, 1.5f, -3.0f, -3.0f};
  const Routed r = route(config, logits);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3})) << "expert 0's group must be excluded by its top-2 sum";
  config.top_k_groups = 4;
  const Routed all = route(config, logits);
  EXPECT_EQ(all.ids, (std::vector<int32_t>{0, 2}));
  config.top_k_groups = 3;
  config.top_k = 4;
  const Routed three = route(config, logits);
  EXPECT_EQ(three.ids, (std::vector<int32_t>{0, 2, 3, 4}));
}

TEST(Routing, GroupScoresUseBiasedScoresWeightsDoNot) {
  RouterConfig config = config_of(RouterKind::kSigmoidGrouped, 8, 2);
  config.num_groups = 4;
  config.top_k_groups = 1;
  config.routed_scaling_factor = 2.0f;
  // Equal logits (sigmoid 0.5 everywhere): only the biases decide. Expert 5 has the best single
  // biased score (0.75) but its group {4, 5} sums 1.25 < group {6, 7}'s 2 * 0.65625 = 1.3125.
  const float bias[8] = {0, 0, 0, 0, 0, 0.25f, 0.15625f, 0.15625f};
  const Routed r = route(config, std::vector<float>(8, 0.0f), bias);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{6, 7}));
  EXPECT_EQ(r.weights, (std::vector<float>{1.0f, 1.0f}));  // (0.5 / 1.0) * 2, the bias not included
}

TEST(Routing, SqrtSoftplusWeightsAndZeroSum) {
  RouterConfig config = config_of(RouterKind::kSqrtSoftplus, 4, 2);
  config.routed_scaling_factor = 1.5f;
  // l > 20 -> softplus(l) = l exactly: s = sqrt(36) = 6 and sqrt(25) = 5.
  const Routed r = route(config, {36.0f, 25.0f, 3.0f, -1.0f});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(r.weights[0], 6.0f / 11.0f * 1.5f);
  EXPECT_EQ(r.weights[1], 5.0f / 11.0f * 1.5f);
  // Below the threshold: log1p(exp(l)).
  const Routed low = route(config, {0.0f, -3.0f, 1.0f, -1.0f});
  const double s2 = std::sqrt(std::log1p(std::exp(1.0))), s0 = std::sqrt(std::log(2.0));
  EXPECT_EQ(low.ids, (std::vector<int32_t>{2, 0}));
  EXPECT_NEAR(low.weights[0], 1.5 * s2 / (s2 + s0), 1e-6);
  // All scores zero (logits -inf): sum 0 -> divide by 1, weights 0, never NaN.
  const Routed zero = route(config, {-kInf, -kInf, -kInf, -kInf});
  EXPECT_EQ(zero.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(zero.weights, (std::vector<float>{0.0f, 0.0f}));
}

TEST(Routing, HashIdsFromTableWeightsFromScores) {
  RouterConfig config = config_of(RouterKind::kHash, 8, 2);
  config.hash_score = ScoreFunction::kSqrtSoftplus;
  const std::vector<int32_t> table = {7, 1, 2, 3, 0, 5};  // vocab 3
  const std::vector<float> logits = {0, 64.0f, 0, 0, 0, 0, 0, 36.0f,   // token id 0 -> experts 7, 1
                                     49.0f, 0, 0, 0, 0, kNaN, 0, 0};   // token id 2 -> 0, 5 (NaN)
  const int32_t token_ids[2] = {0, 2};
  RouterInputs in;
  in.logits = logits.data();
  in.num_tokens = 2;
  in.token_ids = token_ids;
  in.hash_table = table.data();
  in.hash_vocab = 3;
  std::vector<int32_t> ids(4, 99);
  std::vector<float> weights(4, kNaN);
  route_reference(config, in, ids.data(), weights.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{7, 1, 0, -1}));
  EXPECT_EQ(weights[0], 6.0f / 14.0f);
  EXPECT_EQ(weights[1], 8.0f / 14.0f);
  EXPECT_EQ(weights[2], 1.0f);
  EXPECT_EQ(weights[3], 0.0f);
  const int32_t bad_token[2] = {0, 3};
  in.token_ids = bad_token;
  expect_error_mentions([&] { route_reference(config, in, ids.data(), weights.data()); }, {"token_ids[1] = 3", "hash_vocab = 3"});
  std::vector<int32_t> bad_table = table;
  bad_table[1] = 8;
  in.token_ids = token_ids;
  in.hash_table = bad_table.data();
  expect_error_mentions([&] { route_reference(config, in, ids.data(), weights.data()); }, {"hash_table[0, 1] = 8", "num_experts = 8"});
}

TEST(Routing, BadConfigurationsNameTheField) {
  RouterConfig base;
  base.kind = RouterKind::kSigmoidGrouped;
  base.num_experts = 8;
  base.top_k = 2;
  struct BadCase {
    void (*mutate)(RouterConfig&);
    std::vector<std::string> mentions;
  };
  const BadCase cases[] = {
      {[](RouterConfig& c) { c.top_k = 9; }, {"top_k = 9", "num_experts = 8"}},
      {[](RouterConfig& c) { c.top_k = 0; }, {"top_k = 0"}},
      {[](RouterConfig& c) { c.num_groups = 3; }, {"num_groups = 3", "divide num_experts = 8"}},
      {[](RouterConfig& c) { c.num_groups = 4, c.top_k_groups = 5; }, {"top_k_groups = 5", "num_groups = 4"}},
      {[](RouterConfig& c) { c.num_groups = 4, c.top_k_groups = 1, c.top_k = 3; },
       {"top_k = 3", "top_k_groups * experts per group"}},
      {[](RouterConfig& c) { c.routed_scaling_factor = 0.0f; }, {"routed_scaling_factor = 0"}},
      {[](RouterConfig& c) { c.num_experts = 0; }, {"num_experts = 0"}},
      {[](RouterConfig& c) { c.kind = RouterKind::kHash, c.num_groups = 2; }, {"num_groups = 2", "hash"}},
  };
  for (const BadCase& bad : cases) {
    RouterConfig c = base;
    bad.mutate(c);
    expect_error_mentions([&] { c.validate(); }, bad.mentions);
  }
  expect_error_mentions([&] { route(base, {0, 1, 2, kInf, 4, 5, 6, 7}); }, {"logits[0, 3] = +inf"});
  const float bad_bias[8] = {0, 0, kNaN, 0, 0, 0, 0, 0};
  expect_error_mentions([&] { route(base, {0, 1, 2, 3, 4, 5, 6, 7}, bad_bias); }, {"correction_bias[2]"});
}

TEST(Routing, KindNamesRoundTrip) {
  for (RouterKind kind : {RouterKind::kSoftmaxTopK, RouterKind::kSigmoidGrouped, RouterKind::kSqrtSoftplus, RouterKind::kHash})
    EXPECT_EQ(parse_router_kind(router_kind_name(kind)), kind);
  EXPECT_EQ(parse_router_kind("DeepSeek-V3"), RouterKind::kSigmoidGrouped);
  EXPECT_EQ(parse_router_kind("dsv4"), RouterKind::kSqrtSoftplus);
  expect_error_mentions([] { parse_router_kind("topk9"); }, {"topk9", "softmax_topk"});
}
