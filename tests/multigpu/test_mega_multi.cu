// The `mega` backend on N GPUs (N = MEGAMOE_TEST_RANKS, default 2), one process per GPU, FP8-block,
// BF16 and W4A8 (nvfp4, mxfp4) weights: vs the host reference on every routing, unequal and zero token counts, graph replay,
// determinism, mega vs staged bit for bit, and a stalled peer. Token and expert counts for N ranks
// follow common/ep_test_ranks.h (N = 2: the 2-rank suite's exact inputs).
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "common/gpu_stream.h"
#include "common/ep_harness.h"

namespace megamoe::testing {
namespace {

// Runs a suite body of common/ep_harness.h (run_mega_*, shared with the in-process suites of
// tests/gpu/test_ep_loopback.cu) on a fresh group of this launched rank, with its own stream.
template <class Body>
void with_group(const LaunchedRank& rank, Body&& body) {
  auto group = EpGroup::bootstrap(rank.rank, rank.ranks, rank.rendezvous);
  DeviceStream s(group->device());
  body(*group, s.stream);
  group->destroy();
}

TEST(MegaMulti, MatchesReferenceOnEveryRouting) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  with_group(rank, [&](EpGroup& g, cudaStream_t st) { run_mega_routing_suite(g, st, WeightFormat::kFp8Block); });
}

TEST(MegaMulti, Bf16MatchesReferenceOnEveryRouting) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  with_group(rank, [&](EpGroup& g, cudaStream_t st) { run_mega_routing_suite(g, st, WeightFormat::kBf16); });
}

TEST(MegaMulti, Nvfp4MatchesReferenceOnEveryRouting) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  with_group(rank, [&](EpGroup& g, cudaStream_t st) { run_mega_routing_suite(g, st, WeightFormat::kNvfp4); });
}

TEST(MegaMulti, Mxfp4MatchesReferenceOnEveryRouting) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  with_group(rank, [&](EpGroup& g, cudaStream_t st) { run_mega_routing_suite(g, st, WeightFormat::kMxfp4); });
}

// The split path (mega_path_heuristics.h) on every routing, an empty rank with graph replay, and the
// wide case: vs the reference and bit for bit vs staged on the same group. One FP8 and one W4A8 format
// (BF16 runs the same pipeline code as staged's BF16 suite; MegaMulti.*ChangingTokenCountsEveryCall
// runs every format on both paths).
TEST(MegaMulti, SplitPathMatchesReferenceOnEveryRouting) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  for (WeightFormat format : {WeightFormat::kFp8Block, WeightFormat::kNvfp4})
    with_group(rank, [&](EpGroup& g, cudaStream_t st) { run_mega_routing_suite(g, st, format, "mega[split]"); });
}

TEST(MegaMulti, ManyGemm2TilesPerCta) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  with_group(rank, [&](EpGroup& g, cudaStream_t st) { run_mega_many_gemm2_tiles(g, st, WeightFormat::kFp8Block); });
  with_group(rank, [&](EpGroup& g, cudaStream_t st) { run_mega_many_gemm2_tiles(g, st, WeightFormat::kBf16); });
}

TEST(MegaMulti, W4a8ManyGemm2TilesPerCta) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  with_group(rank, [&](EpGroup& g, cudaStream_t st) { run_mega_many_gemm2_tiles(g, st, WeightFormat::kNvfp4); });
  with_group(rank, [&](EpGroup& g, cudaStream_t st) { run_mega_many_gemm2_tiles(g, st, WeightFormat::kMxfp4); });
}

TEST(MegaMulti, ChangingTokenCountsEveryCall) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  for (const char* name : {"mega[fused]", "mega[split]", "mega[auto]"})
    with_group(rank, [&](EpGroup& g, cudaStream_t st) { run_mega_token_sequence(g, st, WeightFormat::kFp8Block, name); });
}

TEST(MegaMulti, Bf16ChangingTokenCountsEveryCall) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  for (const char* name : {"mega[fused]", "mega[auto]"})
    with_group(rank, [&](EpGroup& g, cudaStream_t st) { run_mega_token_sequence(g, st, WeightFormat::kBf16, name); });
}

TEST(MegaMulti, W4a8ChangingTokenCountsEveryCall) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  for (const char* name : {"mega[fused]", "mega[auto]"})
    with_group(rank, [&](EpGroup& g, cudaStream_t st) { run_mega_token_sequence(g, st, WeightFormat::kNvfp4, name); });
  // auto: split on every call
  with_group(rank, [&](EpGroup& g, cudaStream_t st) { run_mega_token_sequence(g, st, WeightFormat::kMxfp4, "mega[auto]"); });
}

// The fused kernel's FP8 GEMM 1 on the ONE W13 (kGateUpInterleaved8, docs/mega.md "One W13") on N ranks at exactly
// 0 / 1 / 8 / 16 / 32 / 33 rows per local expert (summed over the ranks' tokens), a mix, and 33..129 rows: mega[fused]
// == staged on ONE rank holding every expert (this rank's inputs) == mega[fused] on its own kGateUp W13
// (MEGAMOE_MEGA_OWN_GATE_UP=1, the old kernel) bit for bit, and the reference. Expert e's rows are split over the
// ranks (rank r sends rows / N, + 1 for r < rows % N); a rank whose share is odd sends one more row to expert 7 so
// that its rows make whole tokens (top-2): on 2 ranks no call needs that.
RankInputs rank_inputs_with_rows(uint64_t seed, const MoeConfig& c, const std::vector<int>& rows, int rank, int ranks) {
  std::vector<int> mine(rows.size());
  int total = 0;
  for (size_t e = 0; e < rows.size(); ++e) {
    mine[e] = rows[e] / ranks + (rank < rows[e] % ranks ? 1 : 0);
    total += mine[e];
  }
  if (total % c.top_k != 0) mine.back() += c.top_k - total % c.top_k, total += c.top_k - total % c.top_k;
  const int T = total / c.top_k;
  RankInputs in = make_rank_inputs(seed, rank, T, c.hidden, c.num_experts, c.top_k, ranks, Routing::kUniform);
  std::vector<int32_t> list;
  for (size_t e = 0; e < mine.size(); ++e) list.insert(list.end(), mine[e], static_cast<int32_t>(e));
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < c.top_k; ++j) in.ids[static_cast<size_t>(t) * c.top_k + j] = list[static_cast<size_t>(j) * T + t];
  return in;
}

TEST(MegaMulti, OneW13RowsPerLocalExpertMatchSingleRankStagedAndOwnGateUp) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  auto group = EpGroup::bootstrap(rank.rank, rank.ranks, rank.rendezvous);
  DeviceStream s(group->device());
  const MoeConfig c{512, 256, 8, 2, WeightFormat::kFp8Block, Activation{}, false, 0, 272};
  ASSERT_EQ(c.num_experts % rank.ranks, 0);
  const auto experts = make_experts(c, 43);
  auto fused = make_loaded_backend("mega[fused]", c, *group, experts, s.stream);
  setenv("MEGAMOE_MEGA_OWN_GATE_UP", "1", 1);
  auto own = make_loaded_backend("mega[fused]", c, *group, experts, s.stream);
  unsetenv("MEGAMOE_MEGA_OWN_GATE_UP");
  auto single = single_rank_group({}, group->device());
  auto staged = make_loaded_backend("staged", c, *single, experts, s.stream);
  const std::vector<std::vector<int>> calls = {
      {1, 1, 1, 1, 1, 1, 1, 1},          {8, 8, 8, 8, 8, 8, 8, 8},         {16, 16, 16, 16, 16, 16, 16, 16},
      {32, 32, 32, 32, 32, 32, 32, 32},  {33, 33, 33, 33, 33, 33, 33, 33}, {0, 1, 8, 16, 32, 33, 17, 5},
      {0, 0, 0, 0, 0, 0, 0, 0},          {33, 64, 65, 100, 128, 129, 0, 1}};
  int call = 0;
  for (const std::vector<int>& rows : calls) {
    const RankInputs in = rank_inputs_with_rows(500 + call++, c, rows, rank.rank, rank.ranks);
    SCOPED_TRACE(::testing::Message() << "rank " << rank.rank << " call " << call << " T=" << in.tokens);
    const auto got = forward_once(*fused, *group, c, in, s.stream);
    const auto by_own = forward_once(*own, *group, c, in, s.stream);
    const auto by_staged = forward_once(*staged, *single, c, in, s.stream);
    EXPECT_EQ(compare_bits(got, by_staged, c.hidden).differing, 0) << "mega[fused] vs staged on one rank";
    EXPECT_EQ(compare_bits(got, by_own, c.hidden).differing, 0) << "mega[fused] vs own kGateUp W13";
    if (in.tokens == 0) continue;
    std::vector<double> tolerance;
    const auto ref = reference_layer(c, experts, in, &tolerance, 1);
    const Comparison cmp = compare_outputs(got, ref, c.hidden, tolerance);
    EXPECT_LT(cmp.rel_l2, rel_l2_budget(c.weight_format));
    EXPECT_EQ(cmp.elementwise_failures, 0) << "first: " << cmp.first_failure;
  }
  staged->destroy();
  single->destroy();
  own->destroy();
  fused->destroy();
  group->destroy();
}

// The last rank stalls (never launches its forward); every other rank's forward must report a timeout
// naming itself, the phase and the stalled peer within the bounded wait.
TEST(MegaMulti, StalledPeerTimesOutWithItsName) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  EpOptions options;
  options.wait_timeout_ns = 1000ull * 1000 * 1000;  // 1 s
  auto group = EpGroup::bootstrap(rank.rank, rank.ranks, rank.rendezvous, -1, options);
  DeviceStream s(group->device());
  const int stalled = rank.ranks - 1;
  const MoeConfig c{256, 256, experts_for_ranks(8, rank.ranks), 2, WeightFormat::kFp8Block, Activation{}, false, 0, 16};
  const auto experts = make_experts(c, 2);
  auto backend = make_test_backend("mega[fused]", c, group.get());
  for (int e = 0; e < backend->num_local_experts(); ++e)
    backend->load_expert(e, experts[backend->first_local_expert() + e].weights);
  backend->warmup(s.stream);
  if (rank.rank != stalled) {
    const RankInputs in = make_rank_inputs(4, rank.rank, 16, c.hidden, c.num_experts, c.top_k, rank.ranks, Routing::kUniform);
    DeviceInputs dev(in, c.hidden, c.top_k);
    MoeInputs inputs{dev.hidden_view(), dev.ids_view(), dev.weights_view()};
    MoeOutputs outputs{dev.out_view()};
    const auto start = std::chrono::steady_clock::now();
    backend->forward(inputs, outputs, s.stream);
    expect_stalled_peer_timeout(*group, s.stream, "a forward", "dispatch", rank.rank, stalled, start);
    EXPECT_THROW(backend->forward(inputs, outputs, s.stream), Error);  // the group is failed now
  } else {
    // The stalled rank never launches its forward; it only waits long enough for the others to time out.
    std::this_thread::sleep_for(std::chrono::seconds(3));
  }
  backend->destroy();
  group->destroy();
}

}  // namespace
}  // namespace megamoe::testing
