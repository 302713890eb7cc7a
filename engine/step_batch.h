// Validation and packing of a StepBatch (runner.h), shared by the CPU and GPU model runners.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/runner.h"

namespace megamoe::engine {

// The packed tokens of one step: chunk c owns tokens [offset[c], offset[c] + chunks[c].tokens.size()).
struct PackedBatch {
  int64_t num_tokens = 0;
  std::vector<int64_t> offset;
  std::vector<int32_t> positions;  // [T]
  const StepBatch* batch = nullptr;
};

struct BatchLimits {
  int max_position_embeddings = 0;
  int vocab_size = 0;
  int kv_block_size = 0;
  int num_kv_blocks = 0;
};

// Checks the batch against the cache and the model (distinct seq ids, non-empty chunks, positions,
// block tables covering the positions and inside the cache, no KV block written by two chunks or
// read by one chunk while another writes it, token ids inside the vocabulary) and lays its tokens out
// back to back. Throws megamoe::Error naming the chunk and the limit.
PackedBatch pack_step_batch(const StepBatch& batch, const BatchLimits& limits);

}  // namespace megamoe::engine
