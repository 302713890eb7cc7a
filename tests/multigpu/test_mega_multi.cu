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

// mega on N ranks vs staged on ONE rank holding every expert (BackendCaseOptions::compare_on_single_rank):
// 0 differing elements. Per row the GEMMs are the same device code on the same bytes wherever the row
// is computed, and mega's combine sums a token's k slots in one fp32 chain on any rank count, as staged
// does on one rank. (A multi-rank staged rounds each rank's partial sum to bf16 first: that differs from
// mega by up to that rounding, and both are checked against the reference instead.)
// `name`: "mega[fused]" (the one kernel) or "mega[split]" (the staged pipeline on mega's weights, which
// rounds each rank's partial like staged: it is compared with staged on the same group, bit for bit).
void matches_reference_on_every_routing(const LaunchedRank& rank, WeightFormat format,
                                        const std::string& name = "mega[fused]") {
  const bool split = name == "mega[split]";
  auto group = EpGroup::bootstrap(rank.rank, rank.ranks, rank.rendezvous);
  DeviceStream s(group->device());
  const int R = rank.ranks;
  for (Routing routing : {Routing::kUniform, Routing::kSkewed, Routing::kAllToRank0, Routing::kPadded}) {
    LayerCase lc;
    lc.config = MoeConfig{256, 256, experts_for_ranks(8, R), 3, format, Activation{}, false, 0, 96};
    lc.routing = routing;
    lc.seed = 41 + static_cast<int>(routing);
    lc.tokens_per_rank = spread_tokens(61, 83, R);  // unequal
    BackendCaseOptions options;
    options.graph_replay = routing == Routing::kUniform || routing == Routing::kAllToRank0;
    options.repeats = 3;
    options.compare_with = routing == Routing::kUniform || routing == Routing::kPadded ? "staged" : nullptr;
    options.compare_on_single_rank = !split;
    options.max_differing = 0;
    run_backend_case(name, *group, lc, s.stream, options);
  }
  LayerCase empty_rank;  // rank 0 has no tokens at all
  empty_rank.config = MoeConfig{256, 256, experts_for_ranks(8, R), 2, format, Activation{}, false, 0, 64};
  empty_rank.tokens_per_rank = spread_tokens(0, 50, R);
  BackendCaseOptions replay;
  replay.graph_replay = true;
  run_backend_case(name, *group, empty_rank, s.stream, replay);
  LayerCase wide;  // DeepSeek-like width and top-k, 128-row tiles, clamped SwiGLU with top-k in fc1
  wide.config = MoeConfig{1024, 512, experts_for_ranks(16, R), 8, format, Activation{Activation::Kind::kSwigluClamped, 7.0f, 1.702f}, true,
                          0, 300};
  wide.tokens_per_rank = spread_tokens(200, 151, R);
  BackendCaseOptions repeat;
  repeat.repeats = 5;
  repeat.compare_with = "staged";
  repeat.compare_on_single_rank = !split;
  repeat.max_differing = 0;
  run_backend_case(name, *group, wide, s.stream, repeat);
  group->destroy();
}

TEST(MegaMulti, MatchesReferenceOnEveryRouting) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  matches_reference_on_every_routing(rank, WeightFormat::kFp8Block);
}

TEST(MegaMulti, Bf16MatchesReferenceOnEveryRouting) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  matches_reference_on_every_routing(rank, WeightFormat::kBf16);
}

TEST(MegaMulti, Nvfp4MatchesReferenceOnEveryRouting) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  matches_reference_on_every_routing(rank, WeightFormat::kNvfp4);
}

TEST(MegaMulti, Mxfp4MatchesReferenceOnEveryRouting) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  matches_reference_on_every_routing(rank, WeightFormat::kMxfp4);
}

// The split path (mega_path_heuristics.h) on every routing, an empty rank with graph replay, and the
// wide case: vs the reference and bit for bit vs staged on the same group. One FP8 and one W4A8 format
// (BF16 runs the same pipeline code as staged's BF16 suite; MegaMulti.*ChangingTokenCountsEveryCall
// runs every format on both paths).
TEST(MegaMulti, SplitPathMatchesReferenceOnEveryRouting) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  matches_reference_on_every_routing(rank, WeightFormat::kFp8Block, "mega[split]");
  matches_reference_on_every_routing(rank, WeightFormat::kNvfp4, "mega[split]");
}

// Many GEMM-2 tiles per CTA with rows bound for both ranks: H = 4096 (16 GEMM-2 n-tiles per m-tile),
// ~512 rows per local expert (128-row tiles, ~17 m-tiles per rank), so most CTAs run two GEMM-2 tiles
// whose bulk copies go to peer and local combine rows, with the pieces of the first counted after the
// second (count_combine_pieces). mega == single-rank staged bit for bit, and the reference.
void many_gemm2_tiles_per_cta(const LaunchedRank& rank, WeightFormat format) {
  auto group = EpGroup::bootstrap(rank.rank, rank.ranks, rank.rendezvous);
  DeviceStream s(group->device());
  LayerCase lc;
  lc.config = MoeConfig{4096, 128, experts_for_ranks(8, rank.ranks), 2, format, Activation{}, false, 0, 1024};
  lc.tokens_per_rank = spread_tokens(1024, 1000, rank.ranks);
  lc.seed = 88;
  BackendCaseOptions options;
  options.compare_with = "staged";
  options.compare_on_single_rank = true;
  options.max_differing = 0;
  run_backend_case("mega[fused]", *group, lc, s.stream, options);  // the fused kernel's tiling is the subject
  group->destroy();
}

TEST(MegaMulti, ManyGemm2TilesPerCta) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  many_gemm2_tiles_per_cta(rank, WeightFormat::kFp8Block);
  many_gemm2_tiles_per_cta(rank, WeightFormat::kBf16);
}

TEST(MegaMulti, W4a8ManyGemm2TilesPerCta) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  many_gemm2_tiles_per_cta(rank, WeightFormat::kNvfp4);
  many_gemm2_tiles_per_cta(rank, WeightFormat::kMxfp4);
}

// 24 calls with a different T on every rank each call (0 included; kSkewed every third call, else
// kPadded), one backend: stale counters or rows of a previous call would break the next. Per call: the
// elementwise bound vs the host reference, rel-L2 under kSequenceCallRelL2Ceiling x budget, and, where
// the forward took the fused path (or runs on one rank), mega == staged on ONE rank holding every expert
// bit for bit (see matches_reference_on_every_routing); the budget applies to the rel-L2 of all calls
// together (NOTES at kSequenceCallRelL2Ceiling: issue 5's W4A8 call 0 at T = 35 gave 0.0114 with every
// other check passing).
// `name`: "mega[fused]", "mega[split]", or "mega[auto]" with MoeInputs::max_tokens_any_rank set to the
// largest T of the call (every rank computes every rank's T): rows = that * 4 / (8 / ranks), so the
// heuristic switches between the paths from call to call, every rank the same way, zero-token ranks
// included. The split path on R > 1 ranks rounds each rank's partial sum to bf16 like multi-rank staged,
// so it is judged against the reference with that model and not bit for bit against one-rank staged.
void changing_token_counts_every_call(const LaunchedRank& rank, WeightFormat format, const std::string& name) {
  SCOPED_TRACE(name);
  constexpr int kCalls = 24;
  auto group = EpGroup::bootstrap(rank.rank, rank.ranks, rank.rendezvous);
  DeviceStream s(group->device());
  const MoeConfig c{256, 256, experts_for_ranks(8, rank.ranks), 4, format, Activation{}, false, 0, 128};
  const auto experts = make_experts(c, 9);
  auto backend = make_loaded_backend(name, c, *group, experts, s.stream);
  auto single = single_rank_group({}, group->device());
  auto staged = make_loaded_backend("staged", c, *single, experts, s.stream);
  std::set<std::string> paths;
  RelL2Sum all_calls;
  int checked = 0;
  for (int call = 0; call < kCalls; ++call) {
    const RankInputs in = token_sequence_inputs(c, call, rank.rank, rank.ranks);
    SCOPED_TRACE(::testing::Message() << "call " << call << " rank " << rank.rank << " T=" << in.tokens);
    int64_t max_tokens_any_rank = -1;
    if (name == "mega[auto]") {
      max_tokens_any_rank = 0;
      for (int r = 0; r < rank.ranks; ++r)
        max_tokens_any_rank = std::max<int64_t>(max_tokens_any_rank, token_sequence_count(call, r));
    }
    const auto got = forward_once(*backend, *group, c, in, s.stream, max_tokens_any_rank);  // every rank, T = 0 too
    paths.insert(backend->last_forward_path());
    if (name == "mega[auto]") {
      const int64_t rows = max_tokens_any_rank * c.top_k / backend->num_local_experts();
      EXPECT_EQ(backend->last_forward_path(), rows > expected_fused_max_rows(c.weight_format) ? "split" : "fused")
          << "rows per local expert " << rows;
    }
    if (in.tokens == 0) continue;
    const bool bit_exact_to_solo = backend->last_forward_path() != "split" || rank.ranks == 1;
    const auto solo = bit_exact_to_solo ? forward_once(*staged, *single, c, in, s.stream) : std::vector<uint16_t>{};
    check_sequence_call("mega sequence", call, rank.rank, c, experts, in, got, bit_exact_to_solo ? &solo : nullptr,
                        &all_calls, reference_combine_ranks(*backend, rank.ranks));
    checked += in.tokens;
  }
  EXPECT_GT(checked, 0);
  EXPECT_LT(all_calls.value(), rel_l2_budget(c.weight_format)) << "rel-L2 of all " << kCalls << " calls together";
  // Where the heuristic has a fused range (FP8, BF16: up to expected_fused_max_rows rows per local expert)
  // the changing counts cross it; W4A8 takes the split path from one row up (its fused range is empty),
  // so every call with a token anywhere must have gone split.
  if (name == "mega[auto]" && expected_fused_max_rows(c.weight_format) > 0)
    EXPECT_EQ(paths.size(), 2u) << "the calls should exercise both paths";
  if (name == "mega[auto]" && expected_fused_max_rows(c.weight_format) == 0)
    EXPECT_TRUE(paths.count("split")) << "W4A8 auto: the split path on every call with tokens";
  std::printf("[mega sequence] %s %s rank %d: rel-L2 of %d calls together %.4g\n", name.c_str(),
              std::string(weight_format_name(format)).c_str(), rank.rank, kCalls, all_calls.value());
  std::fflush(stdout);
  staged->destroy();
  single->destroy();
  backend->destroy();
  group->destroy();
}

TEST(MegaMulti, ChangingTokenCountsEveryCall) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  for (const char* name : {"mega[fused]", "mega[split]", "mega[auto]"})
    changing_token_counts_every_call(rank, WeightFormat::kFp8Block, name);
}

TEST(MegaMulti, Bf16ChangingTokenCountsEveryCall) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  for (const char* name : {"mega[fused]", "mega[auto]"}) changing_token_counts_every_call(rank, WeightFormat::kBf16, name);
}

TEST(MegaMulti, W4a8ChangingTokenCountsEveryCall) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  for (const char* name : {"mega[fused]", "mega[auto]"}) changing_token_counts_every_call(rank, WeightFormat::kNvfp4, name);
  changing_token_counts_every_call(rank, WeightFormat::kMxfp4, "mega[auto]");  // auto: split on every call
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
