// Runner options: --load-format dummy, online quantization of experts, --moe-backend names, step
// input validation.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engine/model.h"
#include "cpu/engine_test_util.h"
#include "megamoe/error.h"

using namespace megamoe;
using namespace megamoe::engine;

namespace {

using megamoe::engine::testing::fixture;

#define EXPECT_CONTAINS(text, needle) EXPECT_NE(std::string(text).find(needle), std::string::npos) << (text)

const std::vector<int32_t> kPrompt = {5, 900, 17, 2000, 33, 64, 1024, 7, 7, 300};

std::vector<float> run_prompt(ModelRunner& runner) {
  StepBatch batch;
  SequenceChunk& chunk = batch.chunks.emplace_back();
  chunk.tokens = kPrompt;
  for (int b = 0; b * runner.kv_block_size() < static_cast<int>(kPrompt.size()); ++b) chunk.block_table.push_back(b);
  return runner.step(batch).logits.at(0);
}

RunnerOptions dummy_options(uint64_t seed, const std::string& overrides = "") {
  RunnerOptions options;
  options.load.progress = false;
  options.load.load_format = "dummy";
  options.load.seed = seed;
  options.hf_overrides = overrides;
  options.num_kv_blocks = 8;
  return options;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  return megamoe::engine::testing::compare(a, b).rel_l2;
}

TEST(EngineOptions, DummyWeightsAreSeededAndNeedOnlyTheConfig) {
  // tiny-mixtral's config with more layers than its checkpoint has: dummy never opens the weights.
  auto a = make_cpu_model_runner(fixture("tiny-mixtral"), dummy_options(7, R"({"num_hidden_layers": 3})"));
  auto b = make_cpu_model_runner(fixture("tiny-mixtral"), dummy_options(7, R"({"num_hidden_layers": 3})"));
  auto c = make_cpu_model_runner(fixture("tiny-mixtral"), dummy_options(8, R"({"num_hidden_layers": 3})"));
  EXPECT_EQ(a->info().num_layers, 3);
  const std::vector<float> la = run_prompt(*a), lb = run_prompt(*b), lc = run_prompt(*c);
  EXPECT_EQ(la, lb);
  EXPECT_GT(rel_l2(lc, la), 0.1);
  double sum = 0, sum_sq = 0;
  for (float v : la) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sum_sq += static_cast<double>(v) * v;
  }
  const double mean = sum / la.size();
  EXPECT_GT(sum_sq / la.size() - mean * mean, 1e-3);  // not a constant row
}

TEST(EngineOptions, OnlineQuantizationOfExperts) {
  // FP8 / FP4 need hidden and intermediate multiples of 128.
  const std::string geometry = R"({"hidden_size": 128, "moe_intermediate_size": 128, "intermediate_size": 128})";
  const std::vector<float> bf16 =
      run_prompt(*make_cpu_model_runner(fixture("tiny-qwen3-moe"), dummy_options(11, geometry)));
  // A smoke test of the plumbing (the formats and the reference backend have their own exact tests):
  // the quantized model stays close to the BF16 one, and 4-bit experts move it further than FP8.
  // A random 3-layer model amplifies perturbations, hence the loose bounds.
  std::map<WeightFormat, double> error;
  for (WeightFormat format : {WeightFormat::kFp8Block, WeightFormat::kNvfp4, WeightFormat::kMxfp4}) {
    RunnerOptions options = dummy_options(11, geometry);
    options.load.quantization = format;
    const std::vector<float> quantized = run_prompt(*make_cpu_model_runner(fixture("tiny-qwen3-moe"), options));
    error[format] = rel_l2(quantized, bf16);
    std::printf("%s experts vs bf16: logits rel_l2 %.4f\n", std::string(weight_format_name(format)).c_str(),
                error[format]);
    EXPECT_GT(error[format], 0.0) << "quantization had no effect";
    EXPECT_LT(error[format], format == WeightFormat::kFp8Block ? 0.1 : 0.5);
  }
  EXPECT_GT(error[WeightFormat::kNvfp4], error[WeightFormat::kFp8Block]);
  EXPECT_GT(error[WeightFormat::kMxfp4], error[WeightFormat::kFp8Block]);
  // The 64-wide fixture cannot be quantized: the rejection names the field and the limit.
  RunnerOptions options;
  options.load.progress = false;
  options.load.quantization = WeightFormat::kFp8Block;
  try {
    make_cpu_model_runner(fixture("tiny-qwen3-moe"), options);
    ADD_FAILURE() << "expected megamoe::Error";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "hidden = 64");
    EXPECT_CONTAINS(e.what(), "128");
  }
}

TEST(EngineOptions, MoeBackendNamesAreNormalisedAndRejectionsSayWhy) {
  const std::vector<float> reference = run_prompt(*make_cpu_model_runner(fixture("tiny-mixtral"), dummy_options(3)));
  for (const char* name : {"REF", "Reference", "cpu"}) {
    RunnerOptions options = dummy_options(3);
    options.moe_backend = name;
    EXPECT_EQ(run_prompt(*make_cpu_model_runner(fixture("tiny-mixtral"), options)), reference) << name;
  }
  for (const char* name : {"staged", "mega", "no-such-backend"}) {
    RunnerOptions options = dummy_options(3);
    options.moe_backend = name;
    try {
      make_cpu_model_runner(fixture("tiny-mixtral"), options);
      ADD_FAILURE() << name << " was accepted by the CPU runner";
    } catch (const Error& e) {
      std::printf("--moe-backend %s: %s\n", name, e.what());
      EXPECT_CONTAINS(e.what(), "--moe-backend");
      EXPECT_CONTAINS(e.what(), name);
      EXPECT_CONTAINS(e.what(), "reference");  // the list of what exists
    }
  }
  RunnerOptions options = dummy_options(3);
  options.load.load_format = "pt";
  EXPECT_THROW(make_cpu_model_runner(fixture("tiny-mixtral"), options), Error);
}

TEST(EngineOptions, StepRejectsBadBatches) {
  auto runner = make_cpu_model_runner(fixture("tiny-mixtral"), dummy_options(5));
  auto expect_error = [&](const StepBatch& batch, const std::string& needle) {
    try {
      runner->step(batch);
      ADD_FAILURE() << "expected megamoe::Error containing " << needle;
    } catch (const Error& e) {
      EXPECT_CONTAINS(e.what(), needle);
    }
  };
  auto chunk = [](int64_t seq, std::vector<int32_t> tokens, int32_t start, std::vector<int32_t> table) {
    SequenceChunk c;
    c.seq_id = seq;
    c.tokens = std::move(tokens);
    c.start_position = start;
    c.block_table = std::move(table);
    return c;
  };
  const int bs = runner->kv_block_size();
  StepBatch b;
  b.chunks = {chunk(0, {1, 2048}, 0, {0})};
  expect_error(b, "token 2048");
  b.chunks = {chunk(0, {}, 0, {0})};
  expect_error(b, "no tokens");
  b.chunks = {chunk(0, std::vector<int32_t>(bs + 1, 3), 0, {0})};
  expect_error(b, "block_table has 1 blocks");
  b.chunks = {chunk(0, {1}, 0, {8})};
  expect_error(b, "block_table[0] = 8");
  b.chunks = {chunk(0, {1}, 0, {0}), chunk(0, {1}, 0, {1})};
  expect_error(b, "seq_id appears twice");
  b.chunks = {chunk(0, {1}, 0, {0}), chunk(1, {1}, 0, {0})};
  expect_error(b, "KV block 0");
  b.chunks = {chunk(0, {1}, -1, {0})};
  expect_error(b, "start_position = -1");
  b.chunks = {chunk(0, {1}, 4096, {0})};
  expect_error(b, "max_position_embeddings");
  // An empty step (an EP rank with no work still steps through every MoE layer) and a shared,
  // read-only prefix block are fine.
  EXPECT_TRUE(runner->step(StepBatch{}).logits.empty());
  b.chunks = {chunk(0, {1}, bs, {0, 1}), chunk(1, {2}, bs, {0, 2})};
  EXPECT_EQ(runner->step(b).logits.size(), 2u);
}

}  // namespace

namespace {

// --device: auto picks the CPU runner for the reference backends and the GPU runner for the rest.
TEST(EngineDevice, AutoFollowsTheBackendAndNamesAreChecked) {
  RunnerOptions options;
  for (const char* backend : {"reference", "ref", "cpu", "Reference-FP32"}) {
    options.moe_backend = backend;
    EXPECT_EQ(resolve_runner_device(options), "cpu") << backend;
  }
  for (const char* backend : {"staged", "Unfused", "mega", "fused"}) {
    options.moe_backend = backend;
    EXPECT_EQ(resolve_runner_device(options), "cuda") << backend;
  }
  options.moe_backend = "staged";
  options.device = "CPU";
  EXPECT_EQ(resolve_runner_device(options), "cpu");  // explicit choice wins (the CPU runner then refuses staged)
  options.device = "gpu";
  EXPECT_EQ(resolve_runner_device(options), "cuda");
  options.device = "tpu";
  try {
    resolve_runner_device(options);
    ADD_FAILURE() << "--device tpu accepted";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "--device 'tpu' is not supported (auto, cpu, cuda)");
  }
}

TEST(EngineDevice, MakeModelRunnerBuildsTheCpuRunnerForReference) {
  RunnerOptions options = dummy_options(3);
  options.device = "auto";
  auto via_factory = make_model_runner(fixture("tiny-mixtral"), options);
  auto direct = make_cpu_model_runner(fixture("tiny-mixtral"), options);
  EXPECT_EQ(run_prompt(*via_factory), run_prompt(*direct));  // the same runner, bit for bit
}

}  // namespace
