#include "engine/step_batch.h"

#include <map>
#include <set>
#include <string>

#include "megamoe/error.h"

namespace megamoe::engine {

PackedBatch pack_step_batch(const StepBatch& batch, const BatchLimits& limits) {
  PackedBatch packed;
  packed.batch = &batch;
  std::set<int64_t> seq_ids;
  std::map<int32_t, size_t> written_by;  // block -> chunk that writes into it this step
  for (size_t c = 0; c < batch.chunks.size(); ++c) {
    const SequenceChunk& chunk = batch.chunks[c];
    const std::string where = "step: chunks[" + std::to_string(c) + "] (seq_id " + std::to_string(chunk.seq_id) + ")";
    MEGAMOE_CHECK(seq_ids.insert(chunk.seq_id).second, where, ": seq_id appears twice in one batch");
    MEGAMOE_CHECK(!chunk.tokens.empty(), where, ": has no tokens");
    MEGAMOE_CHECK(chunk.start_position >= 0, where, ": start_position = ", chunk.start_position, " < 0");
    const int64_t end = static_cast<int64_t>(chunk.start_position) + static_cast<int64_t>(chunk.tokens.size());
    MEGAMOE_CHECK(end <= limits.max_position_embeddings, where, ": positions up to ", end,
                  " exceed max_position_embeddings = ", limits.max_position_embeddings);
    const int64_t blocks_needed = (end + limits.kv_block_size - 1) / limits.kv_block_size;
    MEGAMOE_CHECK(static_cast<int64_t>(chunk.block_table.size()) >= blocks_needed, where, ": block_table has ",
                  chunk.block_table.size(), " blocks but positions [0, ", end, ") need ", blocks_needed,
                  " of ", limits.kv_block_size, " tokens");
    for (int64_t b = 0; b < blocks_needed; ++b) {
      const int32_t block = chunk.block_table[b];
      MEGAMOE_CHECK(block >= 0 && block < limits.num_kv_blocks, where, ": block_table[", b, "] = ", block,
                    " outside [0, ", limits.num_kv_blocks, ")");
    }
    for (int64_t b = chunk.start_position / limits.kv_block_size; b < blocks_needed; ++b) {
      const auto [it, inserted] = written_by.emplace(chunk.block_table[b], c);
      MEGAMOE_CHECK(inserted || it->second == c, where, ": writes KV block ", chunk.block_table[b],
                    " that chunks[", it->second, "] also writes");
    }
    for (int32_t token : chunk.tokens) {
      MEGAMOE_CHECK(token >= 0 && token < limits.vocab_size, where, ": token ", token, " outside [0, ",
                    limits.vocab_size, ")");
    }
    packed.offset.push_back(packed.num_tokens);
    for (size_t i = 0; i < chunk.tokens.size(); ++i) {
      packed.positions.push_back(chunk.start_position + static_cast<int32_t>(i));
    }
    packed.num_tokens += static_cast<int64_t>(chunk.tokens.size());
  }
  // A block another chunk only reads (shared prefix) must not be one written this step.
  for (size_t c = 0; c < batch.chunks.size(); ++c) {
    const SequenceChunk& chunk = batch.chunks[c];
    const int64_t read_blocks = (static_cast<int64_t>(chunk.start_position) + limits.kv_block_size - 1) /
                                limits.kv_block_size;
    for (int64_t b = 0; b < read_blocks; ++b) {
      const auto it = written_by.find(chunk.block_table[b]);
      MEGAMOE_CHECK(it == written_by.end() || it->second == c, "step: chunks[", c, "] reads KV block ",
                    chunk.block_table[b], " that chunks[", it->second, "] writes in the same step");
    }
  }
  return packed;
}

}  // namespace megamoe::engine
