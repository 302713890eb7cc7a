#include "server/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "megamoe/error.h"

namespace megamoe::server {

int32_t sample_token(std::span<const float> logits, const engine::SamplingParams& params, std::mt19937_64& rng) {
  MEGAMOE_CHECK(!logits.empty(), "logits row must not be empty");
  const size_t vocab = logits.size();
  size_t argmax = 0;
  for (size_t v = 1; v < vocab; ++v)
    if (logits[v] > logits[argmax]) argmax = v;
  if (params.temperature <= 0.0f) return int32_t(argmax);

  const double inv_t = 1.0 / double(params.temperature);
  const double max_logit = double(logits[argmax]);
  std::vector<double> probs(vocab);
  double total = 0;
  for (size_t v = 0; v < vocab; ++v) {
    probs[v] = std::isfinite(logits[v]) ? std::exp((double(logits[v]) - max_logit) * inv_t) : 0.0;
    total += probs[v];
  }
  // Uniform draw in [0, 1): 53 random bits, independent of the standard library's distributions.
  const double u = double(rng() >> 11) * (1.0 / 9007199254740992.0);
  if (params.top_p >= 1.0f) {
    double target = u * total, cumulative = 0;
    for (size_t v = 0; v < vocab; ++v) {
      cumulative += probs[v];
      if (cumulative > target && probs[v] > 0) return int32_t(v);
    }
    return int32_t(argmax);
  }
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return probs[size_t(a)] > probs[size_t(b)]; });
  const double keep_mass = double(std::max(params.top_p, 0.0f)) * total;
  double kept = 0;
  size_t keep = 0;
  while (keep < vocab && (keep == 0 || kept < keep_mass)) kept += probs[size_t(order[keep++])];
  double target = u * kept, cumulative = 0;
  for (size_t k = 0; k < keep; ++k) {
    cumulative += probs[size_t(order[k])];
    if (cumulative > target) return order[k];
  }
  return order[0];
}

}  // namespace megamoe::server
