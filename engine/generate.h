// A minimal single-sequence generation loop over a ModelRunner (tests, smoke runs). The server's
// scheduler does the real batching; this only allocates blocks [first_block, ...) for one sequence.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/runner.h"

namespace megamoe::engine {

struct GenerateStats {
  double prefill_seconds = 0;  // wall time of the prefill steps (logits of the last prompt token on the host)
  double decode_seconds = 0;
};

struct GenerateOptions {
  int prefill_chunk = 0;  // > 0: prefill in chunks of this many tokens (chunked prefill)
  int64_t seq_id = 0;
  int first_block = 0;    // the sequence uses KV blocks first_block, first_block + 1, ...
  GenerateStats* stats = nullptr;  // filled when non-null
  // When non-null: the logits row each new token was sampled from (the prompt's last position, then
  // one per decode step), appended in order.
  std::vector<std::vector<float>>* sampled_logits = nullptr;
};

// Prefills `prompt`, then decodes until max_tokens or an EOS (unless ignore_eos). Returns the new
// tokens (EOS included when it stopped generation). `stop` strings are the server's (text) business.
std::vector<int32_t> generate(ModelRunner& runner, const std::vector<int32_t>& prompt,
                              const SamplingParams& params, const GenerateOptions& options = {});

}  // namespace megamoe::engine
