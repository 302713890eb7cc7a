// The CPU model runner against Hugging Face transformers (fp32 goldens in tests/fixtures/{tiny,small}-*),
// and its own invariants: packed batches == one sequence at a time, chunked prefill == whole prefill.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "cpu/engine_test_util.h"
#include "megamoe/error.h"

using namespace megamoe;
using namespace megamoe::engine;

namespace {

using megamoe::engine::testing::fixture;

RunnerOptions quiet_options() {
  RunnerOptions options;
  options.load.progress = false;
  options.num_kv_blocks = 64;
  options.kv_block_size = 4;  // small blocks: prompts span several, so block tables matter
  return options;
}

using megamoe::engine::testing::compare;
using megamoe::engine::testing::expect_greedy_tokens_match;

std::vector<float> prefill_logits(ModelRunner& runner, const std::vector<int32_t>& prompt, int first_block = 0) {
  StepBatch batch;
  SequenceChunk& chunk = batch.chunks.emplace_back();
  chunk.tokens = prompt;
  const int blocks = (static_cast<int>(prompt.size()) + runner.kv_block_size() - 1) / runner.kv_block_size();
  for (int b = 0; b < blocks; ++b) chunk.block_table.push_back(first_block + b);
  return runner.step(batch).logits.at(0);
}

class TinyModel : public ::testing::TestWithParam<std::string> {};

TEST_P(TinyModel, LastLogitsMatchTransformersFp32) {
  const nlohmann::json golden = read_json_file(fixture(GetParam()) + "/golden.json");
  auto runner = make_cpu_model_runner(fixture(GetParam()), quiet_options());
  ASSERT_EQ(runner->info().vocab_size, 2048);
  for (const auto& prompt : golden.at("prompts")) {
    const auto ids = prompt.at("token_ids").get<std::vector<int32_t>>();
    const auto want = prompt.at("last_logits").get<std::vector<float>>();
    const std::vector<float> got = prefill_logits(*runner, ids);
    ASSERT_EQ(got.size(), want.size());
    const auto c = compare(got, want);
    SCOPED_TRACE(prompt.at("text").get<std::string>());
    std::printf("[%s] %zu tokens: rel_l2 %.3g, max |diff| %.3g (max |ref| %.3g)\n", GetParam().c_str(), ids.size(),
                c.rel_l2, c.max_abs, c.ref_max);
    EXPECT_LT(c.rel_l2, 1e-2);
    EXPECT_LT(c.max_abs, 1e-2 * c.ref_max);
  }
}

TEST_P(TinyModel, Greedy32TokensMatchTransformersWhileTheMarginIsClear) {
  const nlohmann::json golden = read_json_file(fixture(GetParam()) + "/golden.json");
  auto runner = make_cpu_model_runner(fixture(GetParam()), quiet_options());
  // A margin well above the logit error (max |diff| above is ~1e-2 of max |logit| ~ a few units).
  constexpr double kClearMargin = 0.05;
  int compared = 0, seq = 0;
  for (const auto& prompt : golden.at("prompts")) {
    GenerateOptions options;
    options.seq_id = seq;
    compared += expect_greedy_tokens_match(*runner, prompt, kClearMargin, "prompt " + std::to_string(seq), options);
    ++seq;
  }
  std::printf("[%s] %d greedy tokens compared\n", GetParam().c_str(), compared);
  EXPECT_GE(compared, 32);  // at least one full prompt's worth of tokens was checked
}

TEST_P(TinyModel, PackedBatchEqualsOneSequenceAtATime) {
  const nlohmann::json golden = read_json_file(fixture(GetParam()) + "/golden.json");
  auto runner = make_cpu_model_runner(fixture(GetParam()), quiet_options());
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& prompt : golden.at("prompts")) prompts.push_back(prompt.at("token_ids").get<std::vector<int32_t>>());
  // Alone, each in blocks [0, ...).
  std::vector<std::vector<float>> alone;
  for (const auto& p : prompts) alone.push_back(prefill_logits(*runner, p));
  // Packed, each in its own blocks [8 * s, ...), listed in reverse order within each table's region.
  StepBatch batch;
  for (size_t s = 0; s < prompts.size(); ++s) {
    SequenceChunk& chunk = batch.chunks.emplace_back();
    chunk.seq_id = static_cast<int64_t>(s);
    chunk.tokens = prompts[s];
    for (int b = 0; b < 8; ++b) chunk.block_table.push_back(static_cast<int32_t>(8 * s + 7 - b));
  }
  batch.chunks[1].want_logits = false;
  const StepOutput packed = runner->step(batch);
  ASSERT_EQ(packed.logits.size(), prompts.size() - 1);
  for (size_t s = 0, row = 0; s < prompts.size(); ++s) {
    if (s == 1) continue;
    EXPECT_EQ(packed.logits[row], alone[s]) << "sequence " << s << " differs when packed";  // bit-exact
    ++row;
  }
  // Then a mixed step: decode tokens for sequences 0 and 2 packed with a fresh prefill of sequence 3.
  const int32_t next0 = 17, next2 = 1999;
  StepBatch mixed;
  for (size_t s : {size_t{0}, size_t{2}}) {
    SequenceChunk chunk = batch.chunks[s];
    chunk.start_position = static_cast<int32_t>(prompts[s].size());
    chunk.tokens = {s == 0 ? next0 : next2};
    mixed.chunks.push_back(chunk);
  }
  SequenceChunk fresh;
  fresh.seq_id = 99;
  fresh.tokens = prompts[3];
  for (int b = 0; b < 8; ++b) fresh.block_table.push_back(40 + b);
  mixed.chunks.push_back(fresh);
  const StepOutput mixed_out = runner->step(mixed);
  // References: sequences 0 and 2 with the extra token, alone.
  for (size_t i = 0; i < 2; ++i) {
    std::vector<int32_t> extended = prompts[i == 0 ? 0 : 2];
    extended.push_back(i == 0 ? next0 : next2);
    EXPECT_EQ(mixed_out.logits[i], prefill_logits(*runner, extended)) << "decode row " << i;
  }
  EXPECT_EQ(mixed_out.logits[2], alone[3]);
}

TEST_P(TinyModel, ChunkedPrefillEqualsWholePrefill) {
  const nlohmann::json golden = read_json_file(fixture(GetParam()) + "/golden.json");
  auto runner = make_cpu_model_runner(fixture(GetParam()), quiet_options());
  const auto ids = golden.at("prompts").at(2).at("token_ids").get<std::vector<int32_t>>();
  ASSERT_GE(ids.size(), 8u);
  const std::vector<float> whole = prefill_logits(*runner, ids);
  for (int chunk : {1, 3, 4, 5}) {
    std::vector<float> last;
    std::vector<int32_t> table;
    for (int b = 0; b < 16; ++b) table.push_back(63 - b);
    for (size_t begin = 0; begin < ids.size(); begin += chunk) {
      StepBatch batch;
      SequenceChunk& c = batch.chunks.emplace_back();
      c.seq_id = chunk;
      c.start_position = static_cast<int32_t>(begin);
      c.tokens.assign(ids.begin() + begin, ids.begin() + std::min(ids.size(), begin + chunk));
      c.block_table = table;
      StepOutput out = runner->step(batch);
      ASSERT_EQ(out.logits.size(), 1u);
      last = out.logits[0];
    }
    EXPECT_EQ(last, whole) << "chunk size " << chunk;  // same per-token arithmetic: bit-exact
  }
}

TEST_P(TinyModel, MoeStepsSplitAtMaxTokensPerStepEqualWhole) {
  const nlohmann::json golden = read_json_file(fixture(GetParam()) + "/golden.json");
  const auto ids = golden.at("prompts").at(0).at("token_ids").get<std::vector<int32_t>>();
  auto whole = make_cpu_model_runner(fixture(GetParam()), quiet_options());
  RunnerOptions options = quiet_options();
  options.max_tokens_per_step = 5;  // 21 tokens -> MoE pieces of 5, 5, 5, 5, 1
  auto split = make_cpu_model_runner(fixture(GetParam()), options);
  EXPECT_EQ(prefill_logits(*split, ids), prefill_logits(*whole, ids));
}

// small-*: the GPU kernels' geometry (hidden 256), the same checkpoints the GPU tests run on staged/mega.
INSTANTIATE_TEST_SUITE_P(Fixtures, TinyModel,
                         ::testing::Values("tiny-qwen3-moe", "tiny-mixtral", "small-qwen3-moe", "small-mixtral"),
                         [](const auto& info) {
                           const std::string& name = info.param;
                           return std::string(name.rfind("small-", 0) == 0 ? "Small" : "") +
                                  (name.find("mixtral") != std::string::npos ? "Mixtral" : "Qwen3Moe");
                         });

}  // namespace
