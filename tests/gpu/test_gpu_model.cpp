// The GPU model runner against the CPU runner (the fp32 oracle, itself checked against transformers):
//   - the tiny fixtures' real weights, MoE on the CPU reference backend (the fixtures' hidden 64 is
//     below the staged kernels' 128 granularity), so attention, norms, RoPE, GEMMs and the LM head
//     are the GPU's;
//   - dummy weights at a staged-capable geometry (hidden 256, head_dim 128 for the cuDNN path), MoE on
//     `staged` (BF16 and FP8-block experts) and `mega` (FP8-block), the CPU runner on the same
//     quantized weights;
//   - the runner's own invariants: whole prefill (cuDNN) == chunked prefill (paged kernel) ==
//     token-by-token decode, packed mixed batches == one sequence at a time; bad batches rejected.
//
// Tolerances: the GPU runs bf16 GEMM inputs (weights exact: BF16 checkpoints / dummy values rounded
// once; activations rounded to bf16 before each GEMM) with fp32 accumulation, the CPU runs fp32
// throughout. Each bf16 rounding is <= 2^-9 relative; over a few layers the logits' rel-L2 stays
// under 1e-2 (the issue's bound; measured 3e-3..6e-3), and the largest element error under 3% of the
// largest logit -- except where the top-k router has a near tie: then the ~1e-2 error of a router
// logit on the GPU can swap an expert of one token, which moves the logits by a few 1e-2. Measured
// with the CPU runner, the smallest gap between the k-th and (k+1)-th router logit over all tokens
// and MoE layers of the golden prompts is 0.029/0.086/0.018/0.27 (tiny-qwen3-moe) and
// 0.011/0.024/0.0043/0.12 (tiny-mixtral). tiny-mixtral's prompt 2 (gap 0.0043 at token 22) is such a
// near tie (GPU rel-L2 2.2e-2), and its prompt 0 (0.011 at token 3) flips between whole and chunked
// prefill; those comparisons get a 3e-2 / 2e-2 bound, named below.
#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/gpu_skip.h"
#include "cpu/engine_test_util.h"
#include "engine/config.h"
#include "engine/generate.h"
#include "engine/gpu_model.h"
#include "engine/model.h"
#include "megamoe/error.h"

using namespace megamoe;
using namespace megamoe::engine;

namespace {

using megamoe::engine::testing::compare;
using megamoe::engine::testing::expect_greedy_tokens_match;
using megamoe::engine::testing::fixture;

RunnerOptions quiet_options(const std::string& backend = "reference") {
  RunnerOptions options;
  options.load.progress = false;
  options.num_kv_blocks = 96;
  options.kv_block_size = 4;  // prompts span several blocks, so block tables matter
  options.moe_backend = backend;
  return options;
}

std::vector<int32_t> blocks_from(int first, int count) {
  std::vector<int32_t> table;
  for (int b = 0; b < count; ++b) table.push_back(first + b);
  return table;
}

std::vector<float> prefill_logits(ModelRunner& runner, const std::vector<int32_t>& prompt, int first_block = 0,
                                  int64_t seq_id = 0) {
  StepBatch batch;
  SequenceChunk& chunk = batch.chunks.emplace_back();
  chunk.seq_id = seq_id;
  chunk.tokens = prompt;
  chunk.block_table = blocks_from(first_block, (static_cast<int>(prompt.size()) + runner.kv_block_size() - 1) /
                                                   runner.kv_block_size());
  return runner.step(batch).logits.at(0);
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what,
                  double rel_l2_bound = 1e-2, double max_abs_fraction = 3e-2) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const auto c = compare(got, want);
  std::printf("[%s] rel_l2 %.3g, max |diff| %.3g (max |ref| %.3g)\n", what.c_str(), c.rel_l2, c.max_abs, c.ref_max);
  EXPECT_LT(c.rel_l2, rel_l2_bound) << what;
  EXPECT_LT(c.max_abs, max_abs_fraction * c.ref_max) << what;
}

std::vector<std::vector<int32_t>> golden_prompts(const std::string& model) {
  const nlohmann::json golden = read_json_file(fixture(model) + "/golden.json");
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& prompt : golden.at("prompts")) prompts.push_back(prompt.at("token_ids").get<std::vector<int32_t>>());
  return prompts;
}

// The GPU's logit error (bf16 activations) is ~1e-2; a top-1 margin of 0.08 is > 2x the error of a
// difference of two logits.
constexpr double kClearMargin = 0.08;

class GpuTinyModel : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuTinyModel, LogitsMatchCpuRunnerAndTransformers) {
  MEGAMOE_REQUIRE_GPUS(1);
  const nlohmann::json golden = read_json_file(fixture(GetParam()) + "/golden.json");
  auto cpu = make_cpu_model_runner(fixture(GetParam()), quiet_options());
  auto gpu = make_gpu_model_runner(fixture(GetParam()), quiet_options());
  int p = 0;
  for (const auto& prompt : golden.at("prompts")) {
    const auto ids = prompt.at("token_ids").get<std::vector<int32_t>>();
    const std::vector<float> got = prefill_logits(*gpu, ids);
    // The router near tie named at the top of this file.
    const bool near_tie = GetParam() == "tiny-mixtral" && p == 2;
    const double bound = near_tie ? 3e-2 : 1e-2, max_fraction = near_tie ? 5e-2 : 3e-2;
    const std::string name = GetParam() + " prompt " + std::to_string(p) + (near_tie ? " (router near tie)" : "");
    expect_close(got, prefill_logits(*cpu, ids), name + " vs cpu", bound, max_fraction);
    expect_close(got, prompt.at("last_logits").get<std::vector<float>>(), name + " vs transformers", bound,
                 max_fraction);
    ++p;
  }
}

TEST_P(GpuTinyModel, GreedyTokensMatchTransformersWhileTheMarginIsClear) {
  MEGAMOE_REQUIRE_GPUS(1);
  const nlohmann::json golden = read_json_file(fixture(GetParam()) + "/golden.json");
  auto gpu = make_gpu_model_runner(fixture(GetParam()), quiet_options());
  int compared = 0, seq = 0;
  for (const auto& prompt : golden.at("prompts"))
    compared += expect_greedy_tokens_match(*gpu, prompt, kClearMargin, "prompt " + std::to_string(seq++));
  std::printf("[%s] %d greedy tokens compared\n", GetParam().c_str(), compared);
  EXPECT_GE(compared, 32);
}

// Whole prefill (cuDNN when available), chunked prefill and token-by-token decode (paged kernel) give
// the same last logits; a packed mixed step (decodes + a fresh prefill) equals the sequences alone.
TEST_P(GpuTinyModel, PrefillChunkedDecodeAndPackedAgree) {
  MEGAMOE_REQUIRE_GPUS(1);
  const auto prompts = golden_prompts(GetParam());
  auto gpu = make_gpu_model_runner(fixture(GetParam()), quiet_options());
  const std::vector<int32_t>& prompt = prompts[0];
  const std::vector<float> whole = prefill_logits(*gpu, prompt);
  for (int chunk : {1, 3, 8}) {
    StepOutput last;
    const int blocks = (static_cast<int>(prompt.size()) + gpu->kv_block_size() - 1) / gpu->kv_block_size();
    for (size_t begin = 0; begin < prompt.size(); begin += chunk) {
      StepBatch batch;
      SequenceChunk& c = batch.chunks.emplace_back();
      c.tokens.assign(prompt.begin() + begin, prompt.begin() + std::min(prompt.size(), begin + chunk));
      c.start_position = static_cast<int32_t>(begin);
      c.block_table = blocks_from(20, blocks);
      c.want_logits = begin + chunk >= prompt.size();
      last = gpu->step(batch);
    }
    // Same kernels but the attention (cuDNN vs paged: summation order, bf16 P in cuDNN); prompt 0 of
    // tiny-mixtral has the router near tie named at the top (gap 0.011 at token 3).
    expect_close(last.logits.at(0), whole, GetParam() + " chunk " + std::to_string(chunk) + " vs whole", 2e-2, 3e-2);
  }

  std::vector<std::vector<float>> alone;
  for (const auto& p : prompts) alone.push_back(prefill_logits(*gpu, p));
  StepBatch batch;
  for (size_t s = 0; s < 3; ++s) {
    SequenceChunk& c = batch.chunks.emplace_back();
    c.seq_id = static_cast<int64_t>(s);
    c.tokens = prompts[s];
    for (int b = 0; b < 12; ++b) c.block_table.push_back(static_cast<int32_t>(12 * s + 11 - b));
  }
  const StepOutput packed = gpu->step(batch);
  for (size_t s = 0; s < 3; ++s) expect_close(packed.logits[s], alone[s], "packed " + std::to_string(s), 5e-3, 2e-2);
  // Decode rows for sequences 0 and 1 beside a fresh prefill of sequence 3 (paged path for all).
  StepBatch mixed;
  const int32_t next[2] = {17, 1999};
  for (size_t s = 0; s < 2; ++s) {
    SequenceChunk c = batch.chunks[s];
    c.start_position = static_cast<int32_t>(prompts[s].size());
    c.tokens = {next[s]};
    mixed.chunks.push_back(c);
  }
  SequenceChunk fresh;
  fresh.seq_id = 99;
  fresh.tokens = prompts[3 % prompts.size()];
  fresh.block_table = blocks_from(60, 12);
  mixed.chunks.push_back(fresh);
  const StepOutput mixed_out = gpu->step(mixed);
  ASSERT_EQ(mixed_out.logits.size(), 3u);
  for (size_t s = 0; s < 2; ++s) {
    std::vector<int32_t> extended = prompts[s];
    extended.push_back(next[s]);
    expect_close(mixed_out.logits[s], prefill_logits(*gpu, extended, 40), "decode row " + std::to_string(s), 2e-2, 3e-2);
  }
  expect_close(mixed_out.logits[2], alone[3 % prompts.size()], "fresh prefill beside decodes", 5e-3, 2e-2);
}

TEST_P(GpuTinyModel, BadBatchesAreRejectedAndTheRunnerStaysUsable) {
  MEGAMOE_REQUIRE_GPUS(1);
  auto gpu = make_gpu_model_runner(fixture(GetParam()), quiet_options());
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9};
  const std::vector<float> before = prefill_logits(*gpu, prompt);
  StepBatch bad;
  SequenceChunk& c = bad.chunks.emplace_back();
  c.tokens = {1, 2, 5000};  // outside the 2048-token vocabulary
  c.block_table = {0};
  try {
    gpu->step(bad);
    ADD_FAILURE() << "a token outside the vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 5000 outside [0, 2048)"), std::string::npos) << e.what();
  }
  c.tokens = {1, 2};
  c.block_table = {96};  // outside the cache
  EXPECT_THROW(gpu->step(bad), Error);
  EXPECT_EQ(prefill_logits(*gpu, prompt), before);  // deterministic, and nothing was corrupted
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuTinyModel, ::testing::Values("tiny-qwen3-moe", "tiny-mixtral"));

// The staged backend needs hidden and moe_intermediate in multiples of 128: the tiny fixtures'
// configs scaled up, with dummy weights (the same seeded values on both runners), head_dim 128.
// Each geometry runs staged and mega on BF16 experts, and staged and mega on FP8-block experts
// (online quantization at load, the same quantized weights on both runners: the CPU reference
// backend rounds activations to FP8 like the kernels, see src/backends/reference.cpp).
// FP8 bound: the MoE input is rounded to e4m3 (3 mantissa bits, steps of 2^-4 relative), and the
// GPU's input to that rounding differs from the CPU's fp32 one by the bf16 error of the layers
// before (~2^-9), so a fraction of the elements round to the neighbouring e4m3 value on one runner
// and not the other: the logits then differ by ~2-3% rel-L2 (measured 0.025-0.029 for staged and mega
// alike, largest element 2.9% of the largest logit). The bound is 4e-2 / 5% for FP8 experts, the
// issue's 1e-2 / 3% for BF16 ones.
struct StagedCase {
  std::string model, overrides;
  std::string backend = "staged";
  std::optional<WeightFormat> quantization;
};
class GpuStaged : public ::testing::TestWithParam<StagedCase> {};

TEST_P(GpuStaged, LogitsAndGreedyTokensMatchCpuReference) {
  MEGAMOE_REQUIRE_GPUS(1);
  RunnerOptions cpu_options = quiet_options("reference");
  cpu_options.load.load_format = "dummy";
  cpu_options.load.seed = 1234;
  cpu_options.load.quantization = GetParam().quantization;
  cpu_options.hf_overrides = GetParam().overrides;
  cpu_options.kv_block_size = 16;
  RunnerOptions gpu_options = cpu_options;
  gpu_options.moe_backend = GetParam().backend;
  auto cpu = make_cpu_model_runner(fixture(GetParam().model), cpu_options);
  auto gpu = make_model_runner(fixture(GetParam().model), gpu_options);  // auto device: staged/mega -> cuda
  const std::string what = GetParam().model + " " + GetParam().backend +
                           (GetParam().quantization ? " " + std::string(weight_format_name(*GetParam().quantization)) : "");
  std::vector<int32_t> prompt;
  for (int i = 0; i < 70; ++i) prompt.push_back((i * 131 + 7) % 2048);
  const double rel_bound = GetParam().quantization ? 4e-2 : 1e-2, max_fraction = GetParam().quantization ? 5e-2 : 3e-2;
  expect_close(prefill_logits(*gpu, prompt), prefill_logits(*cpu, prompt), what + " vs cpu", rel_bound, max_fraction);
  // Chunked prefill through the paged kernel with the staged MoE.
  StepOutput last;
  for (size_t begin = 0; begin < prompt.size(); begin += 32) {
    StepBatch batch;
    SequenceChunk& c = batch.chunks.emplace_back();
    c.tokens.assign(prompt.begin() + begin, prompt.begin() + std::min(prompt.size(), begin + 32));
    c.start_position = static_cast<int32_t>(begin);
    c.block_table = blocks_from(10, 5);
    last = gpu->step(batch);
  }
  expect_close(last.logits.at(0), prefill_logits(*cpu, prompt), what + " chunked vs cpu", rel_bound, max_fraction);
}

INSTANTIATE_TEST_SUITE_P(
    Geometries, GpuStaged,
    ::testing::ValuesIn([] {
      const std::string qwen3 = R"({"hidden_size": 256, "moe_intermediate_size": 128, "intermediate_size": 256,
                                    "head_dim": 128, "num_attention_heads": 4, "num_key_value_heads": 2})";
      const std::string mixtral = R"({"hidden_size": 256, "intermediate_size": 128, "num_attention_heads": 4,
                                      "num_key_value_heads": 1})";
      std::vector<StagedCase> cases;
      for (const auto& [model, overrides] : {std::pair{"tiny-qwen3-moe", qwen3}, std::pair{"tiny-mixtral", mixtral}}) {
        cases.push_back({model, overrides, "staged", std::nullopt});
        cases.push_back({model, overrides, "mega", std::nullopt});
        cases.push_back({model, overrides, "staged", WeightFormat::kFp8Block});
        cases.push_back({model, overrides, "mega", WeightFormat::kFp8Block});
      }
      return cases;
    }()),
    [](const ::testing::TestParamInfo<StagedCase>& info) {
      return std::string(info.param.model == "tiny-mixtral" ? "mixtral_" : "qwen3_") + info.param.backend +
             (info.param.quantization ? "_fp8" : "_bf16");
    });

// The fixtures at the kernels' geometry (tests/fixtures/small-*: hidden 256, expert intermediate 128,
// real BF16 weights with transformers fp32 goldens) with the MoE on `staged` and `mega` (BF16 experts):
// the engine's last logits against transformers directly, within the issue's 1e-2 (every element within
// 3% of the largest logit), and greedy tokens while the golden top-1 margin is clear. The fixtures'
// seeds were picked for router gaps (k-th minus (k+1)-th router logit, golden.json "min_router_gap")
// well above the GPU's ~1e-2 router-logit error, so no expert choice flips.
struct KernelModelCase {
  std::string model, backend;
};
class GpuKernelModel : public ::testing::TestWithParam<KernelModelCase> {};

TEST_P(GpuKernelModel, LogitsAndGreedyTokensMatchTransformers) {
  MEGAMOE_REQUIRE_GPUS(1);
  const nlohmann::json golden = read_json_file(fixture(GetParam().model) + "/golden.json");
  RunnerOptions options = quiet_options(GetParam().backend);
  options.kv_block_size = 16;
  auto gpu = make_model_runner(fixture(GetParam().model), options);  // staged/mega -> cuda
  const std::string what = GetParam().model + " " + GetParam().backend;
  std::printf("[%s] min router gap %.4g\n", what.c_str(), golden.at("min_router_gap").get<double>());
  int p = 0, compared = 0;
  for (const auto& prompt : golden.at("prompts")) {
    const auto ids = prompt.at("token_ids").get<std::vector<int32_t>>();
    expect_close(prefill_logits(*gpu, ids, 0, p), prompt.at("last_logits").get<std::vector<float>>(),
                 what + " prompt " + std::to_string(p) + " vs transformers");
    compared += expect_greedy_tokens_match(*gpu, prompt, kClearMargin, what + " prompt " + std::to_string(p));
    ++p;
  }
  std::printf("[%s] %d greedy tokens compared\n", what.c_str(), compared);
  EXPECT_GE(compared, 16);
}

INSTANTIATE_TEST_SUITE_P(SmallFixtures, GpuKernelModel,
                         ::testing::Values(KernelModelCase{"small-qwen3-moe", "staged"},
                                           KernelModelCase{"small-qwen3-moe", "mega"},
                                           KernelModelCase{"small-mixtral", "staged"},
                                           KernelModelCase{"small-mixtral", "mega"}),
                         [](const ::testing::TestParamInfo<KernelModelCase>& info) {
                           return std::string(info.param.model == "small-mixtral" ? "mixtral_" : "qwen3_") +
                                  info.param.backend;
                         });

}  // namespace
