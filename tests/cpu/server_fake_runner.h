// A deterministic stand-in for a model, for serving tests: its "KV cache" stores the token ids
// written at each position, and the logits after position p are a hash of the tokens it reads back
// from the cache at positions [0, p] through the chunk's block table. Wrong block tables, lost
// chunks or bad preemption change the context it sees, so its output differs from
// reference_next_token() computed straight from the token list.
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "engine/runner.h"
#include "megamoe/error.h"

namespace megamoe::server::testing {

inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline uint64_t context_hash(const int32_t* tokens, size_t n) {
  uint64_t h = 0x1234567;
  for (size_t i = 0; i < n; ++i) h = mix64(h ^ uint64_t(uint32_t(tokens[i])));
  return h;
}

// Logits for the next token after a context with hash h: pseudo-random in [-4, 4).
inline void fake_logits(uint64_t h, int vocab, float* out) {
  for (int v = 0; v < vocab; ++v) out[v] = float(mix64(h ^ (uint64_t(v) << 32)) >> 40) / float(1 << 24) * 8.0f - 4.0f;
}

class FakeRunner : public engine::ModelRunner {
 public:
  FakeRunner(int vocab, int block_size, int num_blocks, int max_positions, std::vector<int32_t> eos,
             std::chrono::microseconds step_delay = std::chrono::microseconds(0))
      : block_size_(block_size), num_blocks_(num_blocks), step_delay_(step_delay),
        cache_(size_t(block_size) * size_t(num_blocks), -1) {
    info_.model_type = "fake_hash";
    info_.vocab_size = vocab;
    info_.max_position_embeddings = max_positions;
    info_.eos_token_ids = std::move(eos);
    info_.num_layers = 1;
  }
  const engine::ModelInfo& info() const override { return info_; }
  int kv_block_size() const override { return block_size_; }
  int num_kv_blocks() const override { return num_blocks_; }

  engine::StepOutput step(const engine::StepBatch& batch) override {
    std::lock_guard lock(mutex_);
    engine::StepOutput out;
    int tokens_in_step = 0;
    for (const auto& chunk : batch.chunks) {
      const int end = chunk.start_position + int(chunk.tokens.size());
      MEGAMOE_CHECK(!chunk.tokens.empty(), "chunk of seq ", chunk.seq_id, " has no tokens");
      MEGAMOE_CHECK(int(chunk.block_table.size()) * block_size_ >= end, "block table of seq ", chunk.seq_id,
                    " covers ", chunk.block_table.size() * size_t(block_size_), " positions, needs ", end);
      for (size_t i = 0; i < chunk.tokens.size(); ++i) slot(chunk, chunk.start_position + int(i)) = chunk.tokens[i];
      tokens_in_step += int(chunk.tokens.size());
      if (!chunk.want_logits) continue;
      std::vector<int32_t> context(static_cast<size_t>(end));
      for (int p = 0; p < end; ++p) context[size_t(p)] = slot(chunk, p);
      std::vector<float> row(static_cast<size_t>(info_.vocab_size));
      fake_logits(context_hash(context.data(), context.size()), info_.vocab_size, row.data());
      out.logits.push_back(std::move(row));
    }
    max_tokens_in_step = std::max(max_tokens_in_step.load(), tokens_in_step);
    max_chunks_in_step = std::max(max_chunks_in_step.load(), int(batch.chunks.size()));
    ++steps;
    if (step_delay_.count() > 0) std::this_thread::sleep_for(step_delay_);
    return out;
  }

  std::atomic<int> steps{0}, max_tokens_in_step{0}, max_chunks_in_step{0};

 private:
  int32_t& slot(const engine::SequenceChunk& chunk, int position) {
    const int32_t block = chunk.block_table[size_t(position / block_size_)];
    MEGAMOE_CHECK(block >= 0 && block < num_blocks_, "block id ", block, " must be in [0, ", num_blocks_, ")");
    return cache_[size_t(block) * size_t(block_size_) + size_t(position % block_size_)];
  }
  engine::ModelInfo info_;
  int block_size_, num_blocks_;
  std::chrono::microseconds step_delay_;
  std::vector<int32_t> cache_;
  std::mutex mutex_;
};

// The greedy continuation the fake model defines, computed from the token list alone.
inline std::vector<int32_t> reference_greedy(std::vector<int32_t> tokens, int vocab, int max_new,
                                             const std::vector<int32_t>& eos, bool ignore_eos) {
  std::vector<int32_t> out;
  std::vector<float> row(static_cast<size_t>(vocab));
  for (int i = 0; i < max_new; ++i) {
    fake_logits(context_hash(tokens.data(), tokens.size()), vocab, row.data());
    const int32_t next = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
    out.push_back(next);
    tokens.push_back(next);
    if (!ignore_eos && std::find(eos.begin(), eos.end(), next) != eos.end()) break;
  }
  return out;
}

}  // namespace megamoe::server::testing
