// Sampler: greedy, seeded temperature / top-p, parameter validation.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/sampler.h"
#include "megamoe/error.h"

using namespace megamoe;
using namespace megamoe::engine;

namespace {

SamplingParams params(float temperature, float top_p, int64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_p = top_p;
  p.seed = seed;
  return p;
}

// Samples `n` times and checks each token's frequency against `expected` within 5 standard deviations.
void expect_distribution(const std::vector<float>& logits, const SamplingParams& p, const std::vector<double>& expected) {
  Sampler sampler(p);
  constexpr int n = 40000;
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < n; ++i) ++counts.at(sampler.sample(logits));
  for (size_t t = 0; t < logits.size(); ++t) {
    const double sigma = std::sqrt(n * expected[t] * (1 - expected[t]));
    EXPECT_NEAR(counts[t], n * expected[t], 5 * sigma + 1e-9) << "token " << t << " (seed " << p.seed << ")";
  }
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) total += p[i] = std::exp(logits[i] / temperature);
  for (double& v : p) v /= total;
  return p;
}

TEST(EngineSampler, GreedyIsArgmaxLowestIdOnTiesSkippingNan) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> logits(2048);
  for (float& v : logits) v = normal(rng);
  const int32_t best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  Sampler greedy(params(0.0f, 1.0f, 1));
  EXPECT_EQ(greedy.sample(logits), best) << "seed " << seed;
  EXPECT_EQ(greedy.sample(std::vector<float>{1.0f, 3.0f, 3.0f, -2.0f}), 1);
  EXPECT_EQ(greedy.sample(std::vector<float>{NAN, 0.5f, NAN, 0.25f}), 1);
  EXPECT_THROW(greedy.sample(std::vector<float>{NAN, NAN}), Error);
}

TEST(EngineSampler, SeededSamplingIsReproducible) {
  std::vector<float> logits(64);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(0.7f * static_cast<float>(i));
  auto draw = [&](int64_t seed) {
    Sampler sampler(params(1.0f, 0.9f, seed));
    std::vector<int32_t> out;
    for (int i = 0; i < 200; ++i) out.push_back(sampler.sample(logits));
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(EngineSampler, TemperatureFollowsTheSoftmax) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 0.5f};
  expect_distribution(logits, params(1.0f, 1.0f, 7), softmax(logits, 1.0));
  expect_distribution(logits, params(0.5f, 1.0f, 8), softmax(logits, 0.5));
}

TEST(EngineSampler, TopPKeepsTheNucleusOnly) {
  // Probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.75 keeps {0, 1}, renormalised to 5/8, 3/8.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  expect_distribution(logits, params(1.0f, 0.75f, 9), {0.625, 0.375, 0.0, 0.0});
  Sampler tiny(params(1.0f, 1e-6f, 10));
  for (int i = 0; i < 100; ++i) EXPECT_EQ(tiny.sample(logits), 0);
}

TEST(EngineSampler, RejectsBadParameters) {
  EXPECT_THROW(Sampler(params(-1.0f, 1.0f, 0)), Error);
  EXPECT_THROW(Sampler(params(NAN, 1.0f, 0)), Error);
  EXPECT_THROW(Sampler(params(1.0f, 0.0f, 0)), Error);
  EXPECT_THROW(Sampler(params(1.0f, 1.5f, 0)), Error);
}

}  // namespace

// What step_and_sample relies on: a fresh sampler that skipped n draws samples exactly what a
// sampler that already sampled n times (at temperature > 0) samples next.
TEST(EngineSampler, SkippingDrawsResumesTheStream) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  megamoe::engine::SamplingParams params;
  params.temperature = 0.8f;
  params.top_p = 0.9f;
  params.seed = int64_t(rng() >> 1);
  megamoe::engine::Sampler continuous(params);
  for (int n = 0; n < 64; ++n) {
    std::vector<float> logits(300);
    for (auto& v : logits) v = normal(rng);
    megamoe::engine::Sampler resumed(params);
    resumed.skip_draws(uint64_t(n));
    EXPECT_EQ(resumed.sample(logits), continuous.sample(logits)) << "after " << n << " draws";
  }
}
