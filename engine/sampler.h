// Token sampling for one request: greedy (temperature 0) or seeded temperature + top-p (nucleus).
#pragma once

#include <cstdint>
#include <random>
#include <span>

#include "engine/runner.h"

namespace megamoe::engine {

class Sampler {
 public:
  // Throws megamoe::Error on temperature < 0 or top_p outside (0, 1]. seed -1: from std::random_device.
  explicit Sampler(const SamplingParams& params);
  // Greedy: the argmax (lowest id on ties). Otherwise softmax(logits / temperature), restricted to
  // the smallest set of most likely tokens whose probability reaches top_p (ties by id), renormalised,
  // and sampled with this request's generator. NaN logits are never chosen.
  int32_t sample(std::span<const float> logits);
  // Random draws sample() makes: one per call when temperature > 0 (generate_canonical<double> over a
  // 64-bit engine), none when greedy. skip_draws(n) puts a fresh sampler where one that made n is.
  bool draws() const { return temperature_ > 0.0f; }
  void skip_draws(uint64_t n) { rng_.discard(n); }

 private:
  float temperature_;
  float top_p_;
  std::mt19937_64 rng_;
};

int32_t argmax(std::span<const float> logits);

}  // namespace megamoe::engine
