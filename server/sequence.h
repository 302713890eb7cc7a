// One request's state inside the serving engine: its tokens (prompt then output), how many of them
// are already in the KV cache, and the KV blocks holding them.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/runner.h"
#include "engine/sampler.h"

namespace megamoe::server {

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
const char* finish_reason_name(FinishReason reason);  // "stop", "length", "abort", "error", null -> ""

struct Sequence {
  int64_t id = 0;
  int rank = 0;                         // data-parallel rank (runner) that owns it
  std::vector<int32_t> tokens;          // prompt tokens, then generated tokens
  int num_prompt_tokens = 0;
  // NOTES: tokens[0, num_computed) are in the KV cache; tokens[num_computed, size) still have to be
  // run (the rest of the prompt, or the one token sampled last step). Preemption resets it to 0.
  int num_computed = 0;
  std::vector<int32_t> block_table;     // KV blocks covering positions [0, num_computed + chunk)
  engine::SamplingParams params;
  // Random draws this request's sampler has made (engine/sampler.h): with the seed fixed at submit,
  // the runner that samples (in this process or a worker) reproduces its stream exactly.
  int64_t sampler_draws = 0;
  int max_total_tokens = 0;             // min(prompt + max_tokens, max_model_len)
  int num_preemptions = 0;
  std::chrono::steady_clock::time_point arrival;
  bool first_token_emitted = false;

  int num_tokens() const { return int(tokens.size()); }
  int num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  int num_pending() const { return num_tokens() - num_computed; }
};

}  // namespace megamoe::server
