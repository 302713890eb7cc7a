// Host logic of the GPU runner's memory and graph plans (engine/gpu_plan.h) and the engine flags that
// drive them (engine/cli_options.h): KV sizing arithmetic, decode-graph buckets, option parsing.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "engine/cli_options.h"
#include "engine/gpu_plan.h"
#include "megamoe/error.h"
#include "megamoe/moe.h"

using namespace megamoe;
using namespace megamoe::engine;

namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

#define EXPECT_THROW_CONTAINING(stmt, needle)                                   \
  do {                                                                          \
    try {                                                                       \
      stmt;                                                                     \
      ADD_FAILURE() << "no megamoe::Error from " #stmt;                         \
    } catch (const megamoe::Error& e) {                                         \
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what(); \
    }                                                                           \
  } while (0)

TEST(GpuPlan, KvBlockBytesOfQwen3_30B_A3B) {
  // 48 layers, block 16, 4 KV heads, head_dim 128, bf16, K and V: 2 * 48 * 16 * 4 * 128 * 2 = 1.5 MiB.
  EXPECT_EQ(kv_block_bytes(48, 16, 4, 128), 1572864);
  EXPECT_EQ(kv_block_bytes(1, 1, 1, 1, 1), 2);
  EXPECT_THROW_CONTAINING(kv_block_bytes(0, 16, 4, 128), "must all be positive");
}

TEST(GpuPlan, KvCacheTakesUtilizationMinusWhatIsInUse) {
  KvCachePlanInputs in;
  in.total_bytes = 140 * kGiB;
  in.free_bytes = 100 * kGiB;  // 40 GiB in use: weights, workspaces, activations
  in.gpu_memory_utilization = 0.9;
  in.block_bytes = kv_block_bytes(48, 16, 4, 128);
  in.reserve_bytes = kGiB / 2;
  const KvCachePlan plan = plan_kv_cache(in);
  const int64_t budget = static_cast<int64_t>(0.9 * static_cast<double>(140 * kGiB));
  EXPECT_EQ(plan.budget_bytes, budget);
  EXPECT_EQ(plan.used_bytes, 40 * kGiB);
  const int64_t expected_blocks = (budget - 40 * kGiB - kGiB / 2) / in.block_bytes;
  EXPECT_EQ(plan.num_blocks, expected_blocks);
  EXPECT_EQ(plan.cache_bytes, expected_blocks * in.block_bytes);
  // Whole blocks only, and the leftover is less than one block.
  EXPECT_LT(budget - 40 * kGiB - kGiB / 2 - plan.cache_bytes, in.block_bytes);
  const std::string line = describe_kv_cache_plan(plan, in, 16);
  EXPECT_NE(line.find(std::to_string(expected_blocks) + " blocks x 16 tokens"), std::string::npos) << line;
}

TEST(GpuPlan, KvCacheNeverTakesMoreThanIsFree) {
  // Utilization 1.0 with 90 GiB in use: budget - used = 10 GiB = free; with another 5 GiB taken by
  // someone after the measurement the plan still fits in free.
  KvCachePlanInputs in;
  in.total_bytes = 100 * kGiB;
  in.free_bytes = 10 * kGiB;
  in.gpu_memory_utilization = 1.0;
  in.block_bytes = kGiB;
  EXPECT_EQ(plan_kv_cache(in).num_blocks, 10);
  in.reserve_bytes = kGiB / 2;
  EXPECT_EQ(plan_kv_cache(in).num_blocks, 9);
}

TEST(GpuPlan, KvCacheRejectsWhatCannotFit) {
  KvCachePlanInputs in;
  in.total_bytes = 100 * kGiB;
  in.free_bytes = 40 * kGiB;  // 60 GiB in use
  in.gpu_memory_utilization = 0.5;
  in.block_bytes = 1 << 20;
  EXPECT_THROW_CONTAINING(plan_kv_cache(in), "--gpu-memory-utilization 0.5");
  in.gpu_memory_utilization = 0.0;
  EXPECT_THROW_CONTAINING(plan_kv_cache(in), "must be in (0, 1]");
  in.gpu_memory_utilization = 1.5;
  EXPECT_THROW_CONTAINING(plan_kv_cache(in), "must be in (0, 1]");
  in.gpu_memory_utilization = 0.9;
  in.free_bytes = 200 * kGiB;
  EXPECT_THROW_CONTAINING(plan_kv_cache(in), "free");
  in.free_bytes = 40 * kGiB;
  in.block_bytes = 0;
  EXPECT_THROW_CONTAINING(plan_kv_cache(in), "KV block bytes");
}

TEST(GpuPlan, DecodeGraphBuckets) {
  const std::vector<int> b256 = decode_graph_buckets(256);
  const std::vector<int> expected = {1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 96, 128, 160, 192, 224, 256};
  EXPECT_EQ(b256, expected);
  EXPECT_EQ(decode_graph_buckets(1), std::vector<int>({1}));
  EXPECT_EQ(decode_graph_buckets(3), std::vector<int>({1, 2, 3}));
  EXPECT_EQ(decode_graph_buckets(80).back(), 80);
  EXPECT_EQ(decode_graph_buckets(80)[decode_graph_buckets(80).size() - 2], 64);
  EXPECT_TRUE(decode_graph_buckets(0).empty());
  for (int max_batch : {1, 5, 64, 100, 512}) {  // sorted, unique, ends at max_batch
    const std::vector<int> b = decode_graph_buckets(max_batch);
    for (size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1], b[i]);
    EXPECT_EQ(b.back(), max_batch);
  }
}

TEST(GpuPlan, PickDecodeBucket) {
  const std::vector<int> b = decode_graph_buckets(256);
  EXPECT_EQ(pick_decode_bucket(b, 1), 1);
  EXPECT_EQ(pick_decode_bucket(b, 3), 4);
  EXPECT_EQ(pick_decode_bucket(b, 5), 8);
  EXPECT_EQ(pick_decode_bucket(b, 64), 64);
  EXPECT_EQ(pick_decode_bucket(b, 65), 96);
  EXPECT_EQ(pick_decode_bucket(b, 256), 256);
  EXPECT_EQ(pick_decode_bucket(b, 257), -1);
  EXPECT_EQ(pick_decode_bucket(b, 0), -1);
  for (int n = 1; n <= 256; ++n) {  // the smallest bucket that holds n
    const int bucket = pick_decode_bucket(b, n);
    ASSERT_GE(bucket, n);
    for (int other : b) EXPECT_TRUE(other < n || other >= bucket) << n;
  }
}

RunnerOptions parse(std::vector<std::string> args) {
  CLI::App app;
  EngineCliOptions options;
  add_engine_options(app, options);
  args.insert(args.begin(), "model-dir");
  std::reverse(args.begin(), args.end());  // CLI11 parses a reversed vector
  app.parse(args);
  return options.resolve();
}

TEST(GpuPlan, EngineFlags) {
  const RunnerOptions defaults = parse({});
  EXPECT_TRUE(defaults.kv_cache_from_memory);  // no --num-kv-blocks: sized from memory (GPU runner)
  EXPECT_DOUBLE_EQ(defaults.gpu_memory_utilization, 0.9);
  EXPECT_FALSE(defaults.enforce_eager);
  EXPECT_EQ(defaults.max_graph_batch, 256);
  const RunnerOptions given = parse({"--num-kv-blocks", "77", "--gpu-memory-utilization", "0.5", "--enforce-eager",
                                     "--max-graph-batch", "32"});
  EXPECT_FALSE(given.kv_cache_from_memory);
  EXPECT_EQ(given.num_kv_blocks, 77);
  EXPECT_DOUBLE_EQ(given.gpu_memory_utilization, 0.5);
  EXPECT_TRUE(given.enforce_eager);
  EXPECT_EQ(given.max_graph_batch, 32);
  EXPECT_THROW_CONTAINING(parse({"--gpu-memory-utilization", "1.5"}), "--gpu-memory-utilization 1.5");
  EXPECT_THROW_CONTAINING(parse({"--gpu-memory-utilization", "0"}), "must be in (0, 1]");
  EXPECT_THROW_CONTAINING(parse({"--max-graph-batch", "0"}), "--max-graph-batch 0");
}

// MoeWorkspace's registry (moe.h): one region per key, created once, shared, counted once.
struct FakeRegion : MoeWorkspace::Shared {
  explicit FakeRegion(int* alive) : alive(alive) { ++*alive; }
  ~FakeRegion() override { --*alive; }
  int* alive;
};

TEST(MoeWorkspace, OneRegionPerKeySharedByItsUsers) {
  int alive = 0, created = 0;
  auto ws = make_moe_workspace();
  auto make = [&](size_t device, size_t symmetric) {
    return [&, device, symmetric]() -> std::shared_ptr<MoeWorkspace::Shared> {
      ++created;
      auto r = std::make_shared<FakeRegion>(&alive);
      r->device_bytes = device;
      r->symmetric_bytes = symmetric;
      return r;
    };
  };
  std::vector<std::shared_ptr<MoeWorkspace::Shared>> layers;
  for (int layer = 0; layer < 48; ++layer) layers.push_back(ws->acquire("staged H=2048", make(1000, 200)));
  layers.push_back(ws->acquire("mega H=2048", make(30, 7)));
  EXPECT_EQ(created, 2);
  EXPECT_EQ(alive, 2);
  for (int layer = 1; layer < 48; ++layer) EXPECT_EQ(layers[layer].get(), layers[0].get());
  EXPECT_EQ(ws->device_bytes(), 1030u);  // each region counted once, not per layer
  EXPECT_EQ(ws->symmetric_bytes(), 207u);
  const auto regions = ws->regions();
  ASSERT_EQ(regions.size(), 2u);
  EXPECT_EQ(regions[0].key, "staged H=2048");
  EXPECT_EQ(regions[0].users, 48);
  EXPECT_EQ(regions[1].users, 1);
  // release() drops the workspace's references; regions live while a user holds them.
  ws->release();
  EXPECT_EQ(ws->device_bytes(), 0u);
  EXPECT_EQ(alive, 2);
  layers.clear();
  EXPECT_EQ(alive, 0);
  EXPECT_THROW_CONTAINING(ws->acquire("x", [] { return std::shared_ptr<MoeWorkspace::Shared>(); }), "was not created");
}

}  // namespace
