// The GPU runner's memory and decode-graph features (docs/gpu_runner.md):
//   - --gpu-memory-utilization: the KV cache is sized from free memory after weights, the shared MoE
//     workspace and the activation buffers, the whole budget is respected and every block is usable;
//   - CUDA graphs for decode steps: a graph replay gives the eager step's logits bit for bit when
//     the batch fills its bucket, padded buckets agree closely (cuBLAS may pick another algorithm
//     for another row count) and never disturb other sequences' KV blocks, graphs survive eager
//     steps in between and are captured again when the work buffers grow.
// Dummy weights at a staged/mega-capable geometry (the tiny qwen3 config scaled up, head_dim 128).
#include <gtest/gtest.h>

#ifdef MEGAMOE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/gpu_skip.h"
#include "cpu/engine_test_util.h"
#include "engine/gpu_model.h"
#include "engine/model.h"
#include "megamoe/error.h"
#ifdef MEGAMOE_WITH_CUDA
#include "megamoe/error_cuda.h"
#endif

using namespace megamoe;
using namespace megamoe::engine;

namespace {

using megamoe::engine::testing::compare;
using megamoe::engine::testing::fixture;

const char* kGeometry = R"({"hidden_size": 256, "moe_intermediate_size": 128, "intermediate_size": 256,
                            "head_dim": 128, "num_attention_heads": 4, "num_key_value_heads": 2})";

RunnerOptions gpu_options(const std::string& backend) {
  RunnerOptions o;
  o.load.progress = false;
  o.load.load_format = "dummy";
  o.load.seed = 4321;
  o.hf_overrides = kGeometry;
  o.moe_backend = backend;
  o.device = "cuda";
  if (backend == "mega") o.load.quantization = WeightFormat::kFp8Block;  // mega on FP8 experts (staged covers BF16)
  o.kv_block_size = 16;
  o.num_kv_blocks = 160;
  return o;
}

// Device memory in use (CPU-only builds compile this file too; the tests skip there).
int64_t used_bytes(int64_t* total = nullptr) {
#ifdef MEGAMOE_WITH_CUDA
  size_t free_bytes = 0, total_bytes = 0;
  MEGAMOE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (total) *total = static_cast<int64_t>(total_bytes);
  return static_cast<int64_t>(total_bytes - free_bytes);
#else
  if (total) *total = 0;
  return 0;
#endif
}

std::vector<int32_t> prompt_of(int seq, int length) {
  std::vector<int32_t> p;
  for (int i = 0; i < length; ++i) p.push_back((seq * 977 + i * 131 + 7) % 2048);
  return p;
}

std::vector<int32_t> table(int first, int count) {
  std::vector<int32_t> t;
  for (int b = 0; b < count; ++b) t.push_back(first + b);
  return t;
}

int argmax(const std::vector<float>& v) {
  int best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best]) best = static_cast<int>(i);
  return best;
}

TEST(GpuRunnerMemory, KvCacheIsSizedFromGpuMemoryUtilization) {
  MEGAMOE_REQUIRE_GPUS(1);
  int64_t total = 0;
  used_bytes(&total);
  const double utilization = 0.5;
  RunnerOptions o = gpu_options("staged");
  o.kv_cache_from_memory = true;
  o.gpu_memory_utilization = utilization;
  auto runner = make_model_runner(fixture("tiny-qwen3-moe"), o);
  const int64_t used = used_bytes();
  std::printf("%s\nnum_kv_blocks %d, in use %.2f GiB of %.2f GiB\n", runner->memory_report().c_str(),
              runner->num_kv_blocks(), used / 1073741824.0, total / 1073741824.0);
  EXPECT_NE(runner->memory_report().find("KV cache: " + std::to_string(runner->num_kv_blocks()) + " blocks"),
            std::string::npos);
  // Within the budget, and filling it up to the runner's reserve (512 MiB) plus rounding slack.
  const int64_t budget = static_cast<int64_t>(utilization * static_cast<double>(total));
  EXPECT_LE(used, budget);
  EXPECT_GE(used, budget - (int64_t{512} << 20) - (int64_t{256} << 20));
  EXPECT_GT(runner->num_kv_blocks(), 1000);

  // The last block is real memory: a sequence there gives the logits it gives in blocks 0..
  const std::vector<int32_t> p = prompt_of(1, 40);
  StepBatch low, high;
  low.chunks.push_back(SequenceChunk{0, p, 0, table(0, 3), true});
  high.chunks.push_back(SequenceChunk{1, p, 0, table(runner->num_kv_blocks() - 3, 3), true});
  const auto a = runner->step(low).logits.at(0);
  const auto b = runner->step(high).logits.at(0);
  EXPECT_EQ(a, b);
  // One decode token on each (reads the cache back through the paged kernel).
  StepBatch d1, d2;
  d1.chunks.push_back(SequenceChunk{0, {argmax(a)}, 40, table(0, 3), true});
  d2.chunks.push_back(SequenceChunk{1, {argmax(a)}, 40, table(runner->num_kv_blocks() - 3, 3), true});
  EXPECT_EQ(runner->step(d1).logits.at(0), runner->step(d2).logits.at(0));
}

TEST(GpuRunnerMemory, TooSmallAUtilizationIsAClearError) {
  MEGAMOE_REQUIRE_GPUS(1);
  RunnerOptions o = gpu_options("staged");
  o.kv_cache_from_memory = true;
  o.gpu_memory_utilization = 0.001;
  try {
    make_model_runner(fixture("tiny-qwen3-moe"), o);
    ADD_FAILURE() << "utilization 0.001 did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--gpu-memory-utilization 0.001"), std::string::npos) << e.what();
  }
}

class GpuDecodeGraphs : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuDecodeGraphs, ReplayMatchesEager) {
  MEGAMOE_REQUIRE_GPUS(1);
  const std::string backend = GetParam();
  RunnerOptions graph_options = gpu_options(backend);
  graph_options.max_graph_batch = 8;       // buckets 1 2 4 8
  graph_options.max_tokens_per_step = 64;  // the 100-token prefill below grows the work buffers
  RunnerOptions eager_options = graph_options;
  eager_options.enforce_eager = true;
  auto graphed = make_model_runner(fixture("tiny-qwen3-moe"), graph_options);
  auto eager = make_model_runner(fixture("tiny-qwen3-moe"), eager_options);

  // 10 sequences, 8 blocks (128 positions) each; sequence s owns blocks [8 s, 8 s + 8), so sequence 0
  // owns block 0 -- what padding rows read (and must never write).
  constexpr int kSeqs = 10, kBlocks = 8;
  std::vector<int32_t> length(kSeqs), next(kSeqs);
  for (int s = 0; s < kSeqs; ++s) {
    const std::vector<int32_t> p = prompt_of(s, 5 + 3 * s);
    StepBatch batch;
    batch.chunks.push_back(SequenceChunk{s, p, 0, table(kBlocks * s, kBlocks), true});
    const auto lg = graphed->step(batch).logits.at(0);
    const auto le = eager->step(batch).logits.at(0);
    ASSERT_EQ(lg, le) << "prefill of sequence " << s << " (eager on both)";
    length[s] = static_cast<int>(p.size());
    next[s] = argmax(le);
  }
  // Decode rounds of n sequences (the first n, rotated so every sequence takes part): exact buckets
  // (1, 2, 4, 8) bit-identical; padded (3, 5, 7) close; 9 and 10 exceed the largest bucket (eager).
  const int rounds[] = {1, 2, 4, 8, 3, 5, 8, 7, 9, 10, 1, 4};
  int rotate = 0, exact = 0, padded_bitwise = 0, padded = 0;
  for (int round = 0; round < static_cast<int>(sizeof(rounds) / sizeof(int)); ++round) {
    const int n = rounds[round];
    if (round == 6) {
      // An eager chunked prefill of 100 tokens (> max_tokens_per_step: the work buffers grow, the
      // captured graphs are stale and must be captured again) for a fresh sequence in blocks 80..87.
      StepBatch big;
      big.chunks.push_back(SequenceChunk{99, prompt_of(99, 100), 0, table(80, kBlocks), true});
      ASSERT_EQ(graphed->step(big).logits.at(0), eager->step(big).logits.at(0));
    }
    StepBatch batch;
    std::vector<int> seqs;
    for (int i = 0; i < n; ++i) seqs.push_back((rotate + i) % kSeqs);
    rotate += 3;
    for (int s : seqs) batch.chunks.push_back(SequenceChunk{s, {next[s]}, length[s], table(kBlocks * s, kBlocks), true});
    const int64_t replays_before = graphed->decode_graph_replays();
    const StepOutput g = graphed->step(batch), e = eager->step(batch);
    ASSERT_EQ(g.logits.size(), static_cast<size_t>(n));
    ASSERT_EQ(e.logits.size(), static_cast<size_t>(n));
    const bool graph_ran = graphed->decode_graph_replays() == replays_before + 1;
    EXPECT_EQ(graph_ran, n <= 8) << "round " << round << " n=" << n;
    const bool exact_bucket = n == 1 || n == 2 || n == 4 || n == 8;
    for (int i = 0; i < n; ++i) {
      const std::string what = backend + " round " + std::to_string(round) + " n=" + std::to_string(n) + " seq " +
                               std::to_string(seqs[i]);
      if (exact_bucket || !graph_ran) {
        ASSERT_EQ(g.logits[i], e.logits[i]) << what;
        exact += graph_ran;
      } else {
        const auto c = compare(g.logits[i], e.logits[i]);
        ++padded;
        padded_bitwise += g.logits[i] == e.logits[i];
        // Same bound as GPU vs CPU runner (test_gpu_model.cpp): a bf16 rounding that differs can move
        // a near-tie router decision of dummy weights.
        EXPECT_LT(c.rel_l2, 1e-2) << what;
        EXPECT_LT(c.max_abs, 3e-2 * c.ref_max) << what;
      }
      next[seqs[i]] = argmax(e.logits[i]);
      ++length[seqs[i]];
    }
  }
  std::printf("[%s] decode graphs: %d captured, %lld replays; exact-bucket rows bit-identical: %d; padded rows "
              "bit-identical: %d of %d\n",
              backend.c_str(), graphed->decode_graphs_captured(), static_cast<long long>(graphed->decode_graph_replays()),
              exact, padded_bitwise, padded);
  EXPECT_EQ(graphed->decode_graphs_captured(), 4);  // buckets 1 2 4 8
  EXPECT_EQ(eager->decode_graph_replays(), 0);
  // Padding never wrote into block 0 (sequence 0's): its next decode is still the eager runner's.
  StepBatch last;
  last.chunks.push_back(SequenceChunk{0, {next[0]}, length[0], table(0, kBlocks), true});
  EXPECT_EQ(graphed->step(last).logits.at(0), eager->step(last).logits.at(0));
}

INSTANTIATE_TEST_SUITE_P(Backends, GpuDecodeGraphs, ::testing::Values("staged", "mega"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

}  // namespace
