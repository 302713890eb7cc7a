#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "megamoe/error.h"

namespace megamoe::engine {

int32_t argmax(std::span<const float> logits) {
  MEGAMOE_CHECK(!logits.empty(), "argmax: no logits");
  int32_t best = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    if (best < 0 || logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  MEGAMOE_CHECK(best >= 0, "argmax: every logit is NaN");
  return best;
}

Sampler::Sampler(const SamplingParams& params) : temperature_(params.temperature), top_p_(params.top_p) {
  MEGAMOE_CHECK(std::isfinite(temperature_) && temperature_ >= 0.0f, "temperature = ", temperature_,
                " must be >= 0");
  MEGAMOE_CHECK(top_p_ > 0.0f && top_p_ <= 1.0f, "top_p = ", top_p_, " must be in (0, 1]");
  rng_.seed(params.seed >= 0 ? static_cast<uint64_t>(params.seed) : std::random_device{}());
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (temperature_ == 0.0f) return argmax(logits);
  const float max_logit = logits[argmax(logits)];
  std::vector<int32_t> order;
  std::vector<double> probs(logits.size(), 0.0);
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    probs[i] = std::exp((static_cast<double>(logits[i]) - max_logit) / temperature_);
    total += probs[i];
    order.push_back(static_cast<int32_t>(i));
  }
  // Most likely first, lowest id on ties: the nucleus is deterministic.
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return probs[a] != probs[b] ? probs[a] > probs[b] : a < b;
  });
  size_t keep = 0;
  double kept = 0;
  while (keep < order.size()) {
    kept += probs[order[keep++]];
    if (kept >= top_p_ * total) break;
  }
  const double target = std::uniform_real_distribution<double>(0.0, kept)(rng_);
  double running = 0;
  for (size_t i = 0; i < keep; ++i) {
    running += probs[order[i]];
    if (target < running) return order[i];
  }
  return order[keep - 1];
}

std::vector<int32_t> ModelRunner::step_and_sample(const StepBatch& batch, const std::vector<ChunkSampling>& sampling) {
  size_t wanted = 0;
  for (const auto& chunk : batch.chunks) wanted += chunk.want_logits;
  MEGAMOE_CHECK(sampling.size() == wanted, "step_and_sample: ", sampling.size(), " sampling entries for ", wanted,
                " want_logits chunks");
  const StepOutput output = step(batch);
  MEGAMOE_CHECK(output.logits.size() == wanted, "runner returned ", output.logits.size(), " logits rows, expected ",
                wanted);
  const int vocab = info().vocab_size;
  std::vector<int32_t> tokens;
  tokens.reserve(wanted);
  for (size_t i = 0; i < wanted; ++i) {
    MEGAMOE_CHECK(int(output.logits[i].size()) == vocab, "logits row has ", output.logits[i].size(),
                  " entries, expected vocab_size ", vocab);
    SamplingParams params;
    params.temperature = sampling[i].temperature;
    params.top_p = sampling[i].top_p;
    params.seed = sampling[i].seed;
    Sampler sampler(params);
    sampler.skip_draws(uint64_t(sampling[i].draws));
    tokens.push_back(sampler.sample(output.logits[i]));
  }
  return tokens;
}

}  // namespace megamoe::engine
