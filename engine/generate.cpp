#include "engine/generate.h"

#include <algorithm>
#include <chrono>

#include "engine/sampler.h"
#include "megamoe/error.h"

namespace megamoe::engine {

std::vector<int32_t> generate(ModelRunner& runner, const std::vector<int32_t>& prompt, const SamplingParams& params,
                              const GenerateOptions& options) {
  MEGAMOE_CHECK(!prompt.empty(), "generate: empty prompt");
  MEGAMOE_CHECK(params.max_tokens >= 0, "max_tokens = ", params.max_tokens, " must be >= 0");
  const int block_size = runner.kv_block_size();
  const int64_t total = static_cast<int64_t>(prompt.size()) + params.max_tokens;
  const int64_t blocks = (total + block_size - 1) / block_size;
  MEGAMOE_CHECK(options.first_block >= 0 && options.first_block + blocks <= runner.num_kv_blocks(),
                "generate: ", total, " tokens need ", blocks, " KV blocks from block ", options.first_block,
                " but the cache has ", runner.num_kv_blocks());
  std::vector<int32_t> block_table(blocks);
  for (int64_t b = 0; b < blocks; ++b) block_table[b] = options.first_block + static_cast<int32_t>(b);

  Sampler sampler(params);
  const auto& eos = runner.info().eos_token_ids;
  std::vector<int32_t> generated;
  const int64_t chunk = options.prefill_chunk > 0 ? options.prefill_chunk : static_cast<int64_t>(prompt.size());
  std::vector<float> logits;
  using clock = std::chrono::steady_clock;
  const auto prefill_start = clock::now();
  for (int64_t begin = 0; begin < static_cast<int64_t>(prompt.size()); begin += chunk) {
    const int64_t end = std::min<int64_t>(begin + chunk, prompt.size());
    StepBatch batch;
    SequenceChunk& c = batch.chunks.emplace_back();
    c.seq_id = options.seq_id;
    c.tokens.assign(prompt.begin() + begin, prompt.begin() + end);
    c.start_position = static_cast<int32_t>(begin);
    c.block_table = block_table;
    c.want_logits = end == static_cast<int64_t>(prompt.size());
    StepOutput out = runner.step(batch);
    if (c.want_logits) logits = std::move(out.logits.at(0));
  }
  const auto decode_start = clock::now();
  int32_t position = static_cast<int32_t>(prompt.size());
  while (static_cast<int>(generated.size()) < params.max_tokens) {
    const int32_t token = sampler.sample(logits);
    generated.push_back(token);
    if (options.sampled_logits) options.sampled_logits->push_back(logits);
    if (!params.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end()) break;
    if (static_cast<int>(generated.size()) == params.max_tokens) break;
    StepBatch batch;
    SequenceChunk& c = batch.chunks.emplace_back();
    c.seq_id = options.seq_id;
    c.tokens = {token};
    c.start_position = position++;
    c.block_table = block_table;
    logits = std::move(runner.step(batch).logits.at(0));
  }
  if (options.stats) {
    options.stats->prefill_seconds = std::chrono::duration<double>(decode_start - prefill_start).count();
    options.stats->decode_seconds = std::chrono::duration<double>(clock::now() - decode_start).count();
  }
  return generated;
}

}  // namespace megamoe::engine
