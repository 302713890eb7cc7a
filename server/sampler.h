// Next-token sampling from one row of logits: greedy (temperature 0), or temperature + top-p
// (nucleus) drawn from the request's own random stream, so a seeded request reproduces exactly.
#pragma once

#include <cstdint>
#include <random>
#include <span>

#include "engine/runner.h"

namespace megamoe::server {

// NOTES: greedy breaks ties toward the lowest id; sampling works in fp64 (softmax of logits/T,
// the smallest set of most likely tokens whose mass reaches top_p, renormalized).
int32_t sample_token(std::span<const float> logits, const engine::SamplingParams& params, std::mt19937_64& rng);

}  // namespace megamoe::server
