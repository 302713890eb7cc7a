// The contract between the serving side (server/: scheduler, KV block manager, HTTP) and the model
// side (engine/: config, loader, model forward). The scheduler decides what runs; a ModelRunner runs
// one step of it and returns logits.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace megamoe::engine {

struct ModelInfo {
  std::string model_type;        // "qwen3_moe", "mixtral", ...
  int vocab_size = 0;
  int max_position_embeddings = 0;
  std::vector<int32_t> eos_token_ids;
  int num_layers = 0;
};

// One sequence's share of a step: a prefill chunk (many tokens) or a decode token (one).
struct SequenceChunk {
  int64_t seq_id = 0;
  std::vector<int32_t> tokens;       // new tokens, in order
  int32_t start_position = 0;        // position of tokens[0] = number of tokens already in the KV cache
  // KV cache blocks of this sequence, in order; block b holds positions [b*block_size, (b+1)*block_size).
  // Must cover positions [0, start_position + tokens.size()).
  std::vector<int32_t> block_table;
  bool want_logits = true;           // return the logits after the last token of this chunk
};

struct StepBatch {
  std::vector<SequenceChunk> chunks;
};

// How to sample one want_logits chunk's next token in step_and_sample(): the request's parameters
// (the engine has fixed its seed) and how many random draws its sampler made before this one, so a
// seeded request samples the same tokens in whichever process runs the step.
struct ChunkSampling {
  float temperature = 0.0f;
  float top_p = 1.0f;
  int64_t seed = 0;
  int64_t draws = 0;
};

struct StepOutput {
  // One row of vocab_size floats per chunk with want_logits, in chunk order.
  std::vector<std::vector<float>> logits;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual const ModelInfo& info() const = 0;
  virtual int kv_block_size() const = 0;   // tokens per KV block
  virtual int num_kv_blocks() const = 0;   // blocks this runner's cache holds (ids 0..n-1)
  // Runs the model over the batch (packed, causal per sequence, attending to its KV cache) and
  // writes the new tokens' K/V into their blocks. Throws megamoe::Error on bad input.
  virtual StepOutput step(const StepBatch& batch) = 0;
  // step() then one token per want_logits chunk (`sampling` has one entry per such chunk, in order),
  // sampled with engine/sampler.h (defined in engine/sampler.cpp). A worker-backed runner overrides
  // it so only token ids cross the process boundary, not vocab-sized logits rows.
  virtual std::vector<int32_t> step_and_sample(const StepBatch& batch, const std::vector<ChunkSampling>& sampling);
  // Non-empty once the runner can never step again (a serve worker process died): why.
  virtual std::string failure() const { return {}; }
  // Diagnostics (GPU runner; empty / 0 elsewhere): device memory by use and the KV cache plan, and
  // the decode CUDA graphs captured (one per batch-size bucket) and replayed so far.
  virtual std::string memory_report() const { return {}; }
  virtual int decode_graphs_captured() const { return 0; }
  virtual int64_t decode_graph_replays() const { return 0; }
};

// Sampling parameters of one request (OpenAI-shaped).
struct SamplingParams {
  float temperature = 1.0f;   // 0 -> greedy
  float top_p = 1.0f;
  int64_t seed = -1;          // -1: nondeterministic
  int max_tokens = 16;
  bool ignore_eos = false;
  std::vector<std::string> stop;
};

}  // namespace megamoe::engine
