// The `mega` backend (one fused kernel per forward) on ONE GPU (a single-rank group), FP8-block, BF16 and
// W4A8 (nvfp4, mxfp4) weights: vs the host reference, vs `staged` bit for bit, graph replay, determinism, both tile heights,
// changing token counts, bad input. The key cases run on both paths (mega_path_heuristics.h): "mega[fused]"
// (the one kernel) and "mega[split]" (the staged pipeline on mega's weights), and under the heuristic.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/gpu_stream.h"
#include "common/ep_harness.h"
#include "moe/mega_backend.h"

namespace megamoe::testing {
namespace {

// Every test runs for every weight format: MegaSingle.<test>/fp8_block, /bf16, /nvfp4, /mxfp4.
class MegaSingle : public OneGpuTest<::testing::TestWithParam<WeightFormat>> {};

MoeConfig small_config(int max_tokens, WeightFormat format = WeightFormat::kFp8Block) {
  return MoeConfig{256, 256, 8, 3, format, Activation{}, false, 0, max_tokens};
}

// mega vs staged on the same inputs and weights: 0 differing elements. Both run the same GEMM device
// arithmetic per row (W4A8: the same decode and the same k-block partial + promotion; staged's BF16-out GEMM 2 runs
// the v10 kernel at rows hints > 64, bit-identical to the pieces of sm90_w4a8_grouped_gemm.cuh that the fused kernel
// runs) (each output element depends only on its row, its weight column and the fixed k-step
// order), round the GEMM-1 output the same way, and on one rank both combines sum a token's k slots
// in one fp32 fmaf chain in slot order.
// The split path is staged's pipeline on mega's weights (FP8: the ONE W13, kGateUpInterleaved8, that the fused
// kernel's GEMM 1 reads too; BF16: its own W13 copy in staged's v2 packing): 0 differing elements too.
TEST_P(MegaSingle, MatchesReferenceAndStagedReplaysAndRepeats) {
  auto group = single_rank_group();
  for (const char* backend : {"mega[fused]", "mega[split]"})
  for (Routing routing : {Routing::kUniform, Routing::kSkewed, Routing::kPadded}) {
    LayerCase lc;
    lc.config = small_config(96, GetParam());
    lc.routing = routing;
    lc.seed = 31 + static_cast<int>(routing);
    lc.tokens_per_rank = {77};
    BackendCaseOptions options;
    options.graph_replay = routing == Routing::kUniform;
    options.repeats = 3;
    options.compare_with = routing != Routing::kSkewed ? "staged" : nullptr;
    options.max_differing = 0;
    run_backend_case(backend, *group, lc, stream_, options);
  }
}

TEST_P(MegaSingle, ClampedSwigluTopkInFc1AndLargeTiles) {
  auto group = single_rank_group();
  // 64-row tiles (few rows per expert) and 128-row tiles (T * k / E > 64), with top-k in fc1; forced
  // fused, then under the heuristic (10 rows per expert: fused, 100: split).
  for (const char* backend : {"mega[fused]", "mega"})
  for (int tokens : {40, 400}) {
    LayerCase lc;
    lc.config = MoeConfig{512, 384, 8, 2, GetParam(), Activation{Activation::Kind::kSwigluClamped, 7.0f, 1.702f},
                          true, 0, 400};
    lc.tokens_per_rank = {tokens};
    lc.seed = 5 + tokens;
    BackendCaseOptions options;
    options.repeats = 2;
    options.compare_with = "staged";
    options.max_differing = 0;
    run_backend_case(backend, *group, lc, stream_, options);
  }
}

// Many tiles per CTA (the grid is one CTA per SM): several GEMM-2 tiles run back to back in one CTA,
// so the GEMM-2 epilogue's bulk copies of one tile are still in flight when the next tile stages its
// rows, and its pieces are counted one tile later (count_combine_pieces). Wide rows (H = 2048: 8
// GEMM-2 n-tiles per m-tile), experts whose rows end inside a tile, both tile heights; mega == staged
// bit for bit and both vs the reference.
TEST_P(MegaSingle, ManyTilesPerCtaBothTileHeights) {
  auto group = single_rank_group();
  // 32 experts x ~64 rows: 64-row tiles (~50 m-tiles, ~400 GEMM-2 tiles); 4 experts x ~512 rows:
  // 128-row tiles (~18 m-tiles, ~150 GEMM-2 tiles after ~18 GEMM-1 tiles on 132 CTAs).
  for (int experts : {32, 4}) {
    LayerCase lc;
    lc.config = MoeConfig{2048, 128, experts, 2, GetParam(), Activation{}, false, 0, 1024};
    lc.tokens_per_rank = {1024};
    lc.seed = 71 + experts;
    BackendCaseOptions options;
    options.repeats = 1;
    options.compare_with = "staged";
    options.max_differing = 0;
    run_backend_case("mega[fused]", *group, lc, stream_, options);  // the fused kernel's tiling is the subject
  }
}

// On each path, and under the heuristic, which on one rank decides on T: rows = T * 3 / 8, so for FP8 /
// BF16 128 and 100 tokens take the split path, the others the fused kernel (the paths alternate call to
// call); for W4A8 every T with T * 3 / 8 >= 1 (all but 0 and 1) takes the split path.
TEST_P(MegaSingle, ZeroTokensAndChangingTokenCounts) {
  auto group = single_rank_group();
  const MoeConfig c = small_config(128, GetParam());
  const auto experts = make_experts(c, 3);
  for (const std::string name : {"mega[fused]", "mega[split]", "mega[auto]"}) {
  SCOPED_TRACE(name);
  auto backend = make_test_backend(name, c, group.get());
  for (int e = 0; e < backend->num_local_experts(); ++e) backend->load_expert(e, experts[e].weights);
  backend->warmup(stream_);
  EXPECT_EQ(backend->last_forward_path(), "") << "warmup's dry runs are not forwards";
  backend->set_phase_timing(true);
  // Every call a different T (0 included): stale counters from a previous call would break the next.
  const int counts[] = {5, 0, 128, 1, 64, 0, 100, 17};
  int call = 0;
  for (int tokens : counts) {
    SCOPED_TRACE(::testing::Message() << "call " << call << " T=" << tokens);
    const RankInputs in = make_rank_inputs(100 + call++, 0, tokens, c.hidden, c.num_experts, c.top_k, 1, Routing::kPadded);
    DeviceInputs dev(in, c.hidden, c.top_k);
    poison_device_buffer(dev.out, static_cast<size_t>(tokens) * c.hidden * 2, 0xFF, stream_);
    MoeInputs inputs{dev.hidden_view(), dev.ids_view(), dev.weights_view()};
    MoeOutputs outputs{dev.out_view()};
    backend->forward(inputs, outputs, stream_);
    group->synchronize(stream_);
    const std::string expected_path =
        name != "mega[auto]" ? name.substr(5, 5)
                             : (tokens * c.top_k / c.num_experts > expected_fused_max_rows(c.weight_format)
                                    ? "split"
                                    : "fused");
    EXPECT_EQ(backend->last_forward_path(), expected_path);
    // The phases are the taken path's: the fused kernel's seven or the pipeline's four.
    const std::vector<MoeBackend::PhaseTime> phases = backend->last_phase_times();
    ASSERT_EQ(phases.size(), expected_path == "split" ? 4u : 7u);
    EXPECT_EQ(phases.front().phase, expected_path == "split" ? "dispatch" : "stage");
    std::vector<double> tolerance;
    const auto ref = reference_layer(c, experts, in, &tolerance);
    const Comparison cmp = compare_outputs(dev.download_out(), ref, c.hidden, tolerance);
    EXPECT_LT(cmp.rel_l2, rel_l2_budget(c.weight_format));
    EXPECT_EQ(cmp.elementwise_failures, 0) << "first: " << cmp.first_failure;
  }
  backend->destroy();
  }
}

// Inputs whose routing gives local expert e exactly rows[e] rows (ids assigned in expert order: slot j of token t =
// the (j T + t)-th entry, so a token never picks one expert twice while every rows[e] <= T); seeded hidden / weights.
RankInputs inputs_with_rows_per_expert(uint64_t seed, const MoeConfig& c, const std::vector<int>& rows) {
  int total = 0;
  for (int r : rows) total += r;
  const int T = total / c.top_k;
  EXPECT_EQ(T * c.top_k, total) << "rows must add up to a multiple of top_k";
  RankInputs in = make_rank_inputs(seed, 0, T, c.hidden, c.num_experts, c.top_k, 1, Routing::kUniform);
  std::vector<int32_t> list;
  for (int e = 0; e < static_cast<int>(rows.size()); ++e) list.insert(list.end(), rows[e], e);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < c.top_k; ++j) in.ids[static_cast<size_t>(t) * c.top_k + j] = list[static_cast<size_t>(j) * T + t];
  return in;
}

// ScopedEnv (common/scoped_overrides.h): the backends read MEGAMOE_MEGA_OWN_GATE_UP when they are made.

// The fused kernel's FP8 GEMM 1 on the ONE W13 in staged's packing (kGateUpInterleaved8, docs/mega.md "One W13")
// at 0 / 1 / 8 / 16 / 32 / 33 rows per expert (spread epilogue up to 32 rows, the rows epilogue with the amax
// exchange from 33), a mix of those, and 128-row tiles (33..129 rows: one or two sub-tiles, a 1-row second tile):
// mega[fused] == mega[split] == staged == mega[fused] on its own kGateUp W13 (MEGAMOE_MEGA_OWN_GATE_UP=1, the
// split-N kernel before) bit for bit, each vs the reference. Plain SiLU, then clamped SwiGLU with top-k in fc1.
// FP8-block (the subject) and BF16 (its fused kernel keeps kGateUp, the split path its own v2 copy: unchanged);
// W4A8 has its own test of the same comparisons (W4a8Gemm1V10LayersMatchTheOldPacking: fused / split / auto on the one
// interleaved W13, fused on its own kGateUp W13, staged on kGateUp).
TEST_P(MegaSingle, OneW13RowsPerExpertMatchStagedAndOwnGateUp) {
  if (GetParam() != WeightFormat::kFp8Block && GetParam() != WeightFormat::kBf16)
    GTEST_SKIP() << "W4A8: W4a8Gemm1V10LayersMatchTheOldPacking makes these comparisons";
  auto group = single_rank_group();
  const std::vector<std::vector<int>> calls = {
      {1, 1, 1, 1, 1, 1, 1, 1},          {8, 8, 8, 8, 8, 8, 8, 8},         {16, 16, 16, 16, 16, 16, 16, 16},
      {32, 32, 32, 32, 32, 32, 32, 32},  {33, 33, 33, 33, 33, 33, 33, 33}, {0, 1, 8, 16, 32, 33, 17, 5},
      {0, 0, 0, 0, 0, 0, 0, 0},          {33, 64, 65, 100, 128, 129, 0, 1}};
  for (int variant = 0; variant < 2; ++variant) {
    const bool clamped = variant == 1;
    const MoeConfig c{512, 256, 8, 2, GetParam(),
                      clamped ? Activation{Activation::Kind::kSwigluClamped, 7.0f, 1.702f} : Activation{}, clamped, 0,
                      272};
    const auto experts = make_experts(c, 41 + variant);
    auto fused = make_loaded_backend("mega[fused]", c, *group, experts, stream_);
    auto split = make_loaded_backend("mega[split]", c, *group, experts, stream_);
    auto staged = make_loaded_backend("staged", c, *group, experts, stream_);
    std::unique_ptr<MoeBackend> own;
    {
      const ScopedEnv old_layout("MEGAMOE_MEGA_OWN_GATE_UP", "1");
      own = make_loaded_backend("mega[fused]", c, *group, experts, stream_);
    }
    int call = 0;
    for (const std::vector<int>& rows : calls) {
      const RankInputs in = inputs_with_rows_per_expert(300 + 10 * variant + call++, c, rows);
      SCOPED_TRACE(::testing::Message() << (clamped ? "clamped+fc1" : "silu") << " call " << call << " T=" << in.tokens
                                        << " rows[0..2]=" << rows[0] << "," << rows[1] << "," << rows[2]);
      const auto got = forward_once(*fused, *group, c, in, stream_);
      EXPECT_EQ(fused->last_forward_path(), "fused");
      const auto by_split = forward_once(*split, *group, c, in, stream_);
      const auto by_staged = forward_once(*staged, *group, c, in, stream_);
      const auto by_own = forward_once(*own, *group, c, in, stream_);
      EXPECT_EQ(compare_bits(got, by_staged, c.hidden).differing, 0) << "mega[fused] vs staged";
      EXPECT_EQ(compare_bits(got, by_split, c.hidden).differing, 0) << "mega[fused] vs mega[split]";
      EXPECT_EQ(compare_bits(got, by_own, c.hidden).differing, 0) << "mega[fused] vs own kGateUp W13";
      if (in.tokens == 0) continue;
      std::vector<double> tolerance;
      const auto ref = reference_layer(c, experts, in, &tolerance);
      const Comparison cmp = compare_outputs(got, ref, c.hidden, tolerance);
      EXPECT_LT(cmp.rel_l2, rel_l2_budget(c.weight_format));
      EXPECT_EQ(cmp.elementwise_failures, 0) << "first: " << cmp.first_failure;
    }
    own->destroy();
    staged->destroy();
    split->destroy();
    fused->destroy();
  }
}

// MEGAMOE_W4A8_G1_V10 (set_w4a8_g1_v10; read when a layer is made): on, staged and mega pack W13 kGateUpInterleaved8:
// staged and mega's split path run the interleaved GEMM-1 kernels (2-warpgroup / small-M / v10 GEMM 1, bit-identical
// to the old GEMM-1 kernels, docs/grouped_gemm.md), mega's fused kernel reads the same ONE W13 since session 19
// (docs/mega.md "One W13"; with MEGAMOE_MEGA_OWN_GATE_UP=1 it keeps a kGateUp W13 and the split path its own copy).
// One set of layers per switch value on the same weights and inputs: staged, mega[split], mega[auto], mega[fused] and
// mega[fused] with MEGAMOE_MEGA_OWN_GATE_UP=1 made with the switch on == staged made with it off, 0 differing
// elements, at rows per expert 0..200 and rows hints (mean rows per expert) 3, 8, 30, 64 (<= 64: 64-row tiles; the
// fused kernel's spread epilogue on tiles of <= 32 rows, the in-thread SwiGLU above) and 65, 70, 150 (> 64: 128-row
// tiles). Plain SiLU, then clamped SwiGLU with the top-k weight in GEMM 1.
TEST_P(MegaSingle, W4a8Gemm1V10LayersMatchTheOldPacking) {
  if (GetParam() != WeightFormat::kNvfp4 && GetParam() != WeightFormat::kMxfp4) GTEST_SKIP() << "W4A8 only";
  auto group = single_rank_group();
  const ScopedSwitch restore(kernels::w4a8_g1_v10, kernels::set_w4a8_g1_v10);
  const std::vector<std::vector<int>> calls = {
      {1, 0, 3, 2, 5, 4, 7, 6},          {8, 8, 8, 8, 8, 8, 8, 8},         {0, 1, 8, 64, 65, 100, 2, 0},
      {64, 64, 64, 64, 64, 64, 64, 64},  {65, 65, 65, 65, 65, 65, 65, 65}, {33, 64, 65, 100, 128, 129, 0, 1},
      {0, 1, 8, 64, 65, 100, 128, 200},  {0, 0, 0, 0, 0, 0, 0, 0},         {150, 150, 150, 150, 150, 150, 150, 150}};
  for (int variant = 0; variant < 2; ++variant) {
    const bool clamped = variant == 1;
    const MoeConfig c{512, 256, 8, 2, GetParam(),
                      clamped ? Activation{Activation::Kind::kSwigluClamped, 7.0f, 1.702f} : Activation{}, clamped, 0,
                      600};
    const auto experts = make_experts(c, 51 + variant);
    kernels::set_w4a8_g1_v10(0);
    auto staged_off = make_loaded_backend("staged", c, *group, experts, stream_);
    kernels::set_w4a8_g1_v10(1);
    auto staged_on = make_loaded_backend("staged", c, *group, experts, stream_);
    auto split_on = make_loaded_backend("mega[split]", c, *group, experts, stream_);
    auto auto_on = make_loaded_backend("mega[auto]", c, *group, experts, stream_);
    auto fused_on = make_loaded_backend("mega[fused]", c, *group, experts, stream_);
    std::unique_ptr<MoeBackend> fused_own_on;  // the fused kernel on its own kGateUp W13 (before session 19)
    {
      const ScopedEnv old_layout("MEGAMOE_MEGA_OWN_GATE_UP", "1");
      fused_own_on = make_loaded_backend("mega[fused]", c, *group, experts, stream_);
    }
    // NOTES: the layers keep the packing they were made with; switching back here shows that the GEMM-1 kernel
    // follows the packing (W4a8Weights::packing), not the switch's current value.
    kernels::set_w4a8_g1_v10(0);
    int call = 0;
    for (const std::vector<int>& rows : calls) {
      const RankInputs in = inputs_with_rows_per_expert(400 + 10 * variant + call++, c, rows);
      SCOPED_TRACE(::testing::Message() << (clamped ? "clamped+fc1" : "silu") << " call " << call << " T=" << in.tokens
                                        << " rows[0..2]=" << rows[0] << "," << rows[1] << "," << rows[2]);
      const auto want = forward_once(*staged_off, *group, c, in, stream_);
      const auto by_staged = forward_once(*staged_on, *group, c, in, stream_);
      const auto by_split = forward_once(*split_on, *group, c, in, stream_);
      EXPECT_EQ(split_on->last_forward_path(), "split");
      const auto by_auto = forward_once(*auto_on, *group, c, in, stream_);
      const auto by_fused = forward_once(*fused_on, *group, c, in, stream_);
      EXPECT_EQ(fused_on->last_forward_path(), "fused");
      const auto by_fused_own = forward_once(*fused_own_on, *group, c, in, stream_);
      EXPECT_EQ(compare_bits(by_staged, want, c.hidden).differing, 0) << "staged: switch on vs off";
      EXPECT_EQ(compare_bits(by_split, want, c.hidden).differing, 0) << "mega[split] (switch on) vs staged (off)";
      EXPECT_EQ(compare_bits(by_auto, want, c.hidden).differing, 0) << "mega (switch on) vs staged (off)";
      EXPECT_EQ(compare_bits(by_fused, want, c.hidden).differing, 0) << "mega[fused] (switch on) vs staged (off)";
      EXPECT_EQ(compare_bits(by_fused_own, want, c.hidden).differing, 0)
          << "mega[fused] on its own kGateUp W13 (switch on) vs staged (off)";
    }
    fused_own_on->destroy();
    fused_on->destroy();
    auto_on->destroy();
    split_on->destroy();
    staged_on->destroy();
    staged_off->destroy();
  }
}

// The skewed calls 0, 3 and 9 of MegaMulti.*ChangingTokenCountsEveryCall (2 ranks, 8 experts, top-4,
// T = 5 / 35, 116 / 41, 35 / 125) replayed on ONE GPU: each rank's inputs through mega and staged on a
// one-rank group holding all 8 experts, the checks of check_sequence_call (staged bit for bit). Per row
// both run the GEMM code the 2-rank mega runs on the same bytes, and mega sums a token's slots in one
// fp32 chain on any rank count, so the printed hash of (call, rank) must equal the 2-rank test's: issue
// 5's W4A8 call 0 rank 1 (T = 35, rel-L2 0.0114 on 2 GPUs) is then reproduced, bit for bit, here.
TEST_P(MegaSingle, SkewedCallsOfTheTwoRankSequence) {
  auto group = single_rank_group();
  const MoeConfig c{256, 256, 8, 4, GetParam(), Activation{}, false, 0, 128};
  const auto experts = make_experts(c, 9);
  // The fused kernel (what the 2-rank test runs without an agreed token count), whatever the heuristic.
  auto mega = make_loaded_backend("mega[fused]", c, *group, experts, stream_);
  auto staged = make_loaded_backend("staged", c, *group, experts, stream_);
  RelL2Sum all_calls;
  for (int call : {0, 3, 9})
    for (int rank = 0; rank < 2; ++rank) {
      const RankInputs in = token_sequence_inputs(c, call, rank, 2);
      SCOPED_TRACE(::testing::Message() << "call " << call << " rank " << rank << " of 2, T=" << in.tokens);
      ASSERT_GT(in.tokens, 0);
      const auto got = forward_once(*mega, *group, c, in, stream_);
      const auto solo = forward_once(*staged, *group, c, in, stream_);
      check_sequence_call("mega sequence (one GPU)", call, rank, c, experts, in, got, &solo, &all_calls);
    }
  EXPECT_LT(all_calls.value(), rel_l2_budget(c.weight_format)) << "rel-L2 of the six calls together";
  staged->destroy();
  mega->destroy();
}

TEST_P(MegaSingle, CapacityOverflowThrowsBeforeLaunchAndBadIdIsReported) {
  auto group = single_rank_group();
  const MoeConfig c = small_config(8, GetParam());
  const auto experts = make_experts(c, 4);
  auto backend = make_test_backend("mega[fused]", c, group.get());  // the fused kernel's id check
  for (int e = 0; e < backend->num_local_experts(); ++e) backend->load_expert(e, experts[e].weights);
  backend->warmup(stream_);
  const RankInputs big = make_rank_inputs(3, 0, 9, c.hidden, c.num_experts, c.top_k, 1, Routing::kUniform);
  DeviceInputs dev_big(big, c.hidden, c.top_k);
  MoeInputs inputs{dev_big.hidden_view(), dev_big.ids_view(), dev_big.weights_view()};
  MoeOutputs outputs{dev_big.out_view()};
  try {
    backend->forward(inputs, outputs, stream_);
    ADD_FAILURE() << "T = 9 > capacity 8 did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_tokens_per_rank = 8"), std::string::npos) << e.what();
  }
  RankInputs bad = make_rank_inputs(5, 0, 4, c.hidden, c.num_experts, c.top_k, 1, Routing::kUniform);
  bad.ids[3] = 17;  // >= num_experts
  DeviceInputs dev_bad(bad, c.hidden, c.top_k);
  MoeInputs bad_inputs{dev_bad.hidden_view(), dev_bad.ids_view(), dev_bad.weights_view()};
  MoeOutputs bad_outputs{dev_bad.out_view()};
  backend->forward(bad_inputs, bad_outputs, stream_);  // the kernel still completes (the id counts as -1)
  try {
    group->synchronize(stream_);
    ADD_FAILURE() << "expert id 17 >= 8 was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("17"), std::string::npos) << e.what();
  }
  backend->destroy();
}

// Phase timing (set_phase_timing / last_phase_times; src/moe/mega_phase_times.h): seven phases that
// add up to about the forward, each >= 0 (the boundaries only move forward), and the same output bits
// with timing on as off. 4096 tokens, so that every phase with work in it spans several microseconds
// (%globaltimer may tick in microseconds); the output is checked against staged (same GEMM code, 0
// differing elements on one GPU, see MatchesReferenceAndStagedReplaysAndRepeats) instead of the
// host reference, which would take minutes at this size.
TEST_P(MegaSingle, PhaseTimingCoversTheForwardAndLeavesTheOutputAlone) {
  constexpr uint64_t kSeed = 29;
  constexpr int kTokens = 4096;
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  auto group = single_rank_group();
  const MoeConfig c{1024, 512, 16, 4, GetParam(), Activation{}, false, 0, kTokens};
  const auto experts = make_experts(c, kSeed);
  auto backend = make_mega_backend(c, group.get(), nullptr, MegaPathMode::kFused);  // the kernel's stamps
  for (int e = 0; e < backend->num_local_experts(); ++e) backend->load_expert(e, experts[e].weights);
  backend->warmup(stream_);
  EXPECT_TRUE(backend->last_phase_times().empty()) << "timing is off by default";

  const RankInputs in = make_rank_inputs(kSeed, 0, kTokens, c.hidden, c.num_experts, c.top_k, 1, Routing::kUniform);
  DeviceInputs dev(in, c.hidden, c.top_k);
  const size_t out_bytes = static_cast<size_t>(in.tokens) * c.hidden * 2;
  MoeInputs inputs{dev.hidden_view(), dev.ids_view(), dev.weights_view()};
  MoeOutputs outputs{dev.out_view()};
  poison_device_buffer(dev.out, out_bytes, 0xFF, stream_);
  backend->forward(inputs, outputs, stream_);
  group->synchronize(stream_);
  const std::vector<uint16_t> untimed = dev.download_out();
  const std::vector<uint16_t> staged = run_backend_once("staged", *group, c, experts, in, stream_);
  ASSERT_EQ(untimed.size(), staged.size());
  size_t differing = 0, nonzero = 0;
  for (size_t i = 0; i < untimed.size(); ++i) {
    differing += untimed[i] != staged[i];
    nonzero += (untimed[i] & 0x7FFF) != 0;
  }
  EXPECT_EQ(differing, 0u) << "mega vs staged";
  EXPECT_GT(nonzero, untimed.size() / 2) << "the output is mostly zeros";

  backend->set_phase_timing(true);
  EXPECT_TRUE(backend->last_phase_times().empty()) << "no forward has run with timing on yet";
  const char* names[] = {"stage", "offsets", "pull", "gemm1", "gemm2", "combine_wait", "reduce"};
  for (int iter = 0; iter < 3; ++iter) {
    SCOPED_TRACE(::testing::Message() << "timed forward " << iter);
    const TimedForward timed = timed_forward(*backend, inputs, outputs, dev.out, out_bytes, stream_);
    const std::vector<MoeBackend::PhaseTime>& phases = timed.phases;
    const double total_us = timed.total_us;
    ASSERT_EQ(phases.size(), 7u);
    double sum_us = 0;
    std::string line;
    for (size_t p = 0; p < phases.size(); ++p) {
      EXPECT_EQ(phases[p].phase, names[p]);
      EXPECT_GE(phases[p].us, 0.0) << phases[p].phase;
      EXPECT_GE(phases[p].cta_mean_us, 0.0) << phases[p].phase;
      EXPECT_LE(phases[p].cta_mean_us, total_us) << phases[p].phase;
      sum_us += phases[p].us;
      line += " " + phases[p].phase + " " + std::to_string(phases[p].us) + " (mean " +
              std::to_string(phases[p].cta_mean_us) + ")";
    }
    // Phases with real work in every forward take time; the ready wait (offsets) and the combine
    // wait can be shorter than the timer's resolution on one GPU, so they are only >= 0.
    for (size_t p : {0, 2, 3, 4, 6}) EXPECT_GT(phases[p].us, 0.0) << phases[p].phase;
    EXPECT_GT(phases[3].us + phases[4].us, 0.3 * sum_us) << "the GEMMs are a large part of the forward";
    std::printf("[mega phases] %s T=%d%s; sum %.1f us, forward %.1f us\n",
                std::string(weight_format_name(c.weight_format)).c_str(), in.tokens, line.c_str(), sum_us, total_us);
    // The phases span the earliest CTA start to the latest CTA end: inside the events' span, and
    // most of it (the rest is launch latency).
    EXPECT_LE(sum_us, total_us + 2.0);  // + 2 timer ticks of 1 us
    EXPECT_GE(sum_us, 0.5 * total_us);
    EXPECT_TRUE(dev.download_out() == untimed) << "the output changed with phase timing on";
  }

  backend->set_phase_timing(false);
  EXPECT_TRUE(backend->last_phase_times().empty()) << "timing switched off";
  poison_device_buffer(dev.out, out_bytes, 0xFF, stream_);
  backend->forward(inputs, outputs, stream_);
  group->synchronize(stream_);
  EXPECT_TRUE(dev.download_out() == untimed) << "timing switched off again";
  backend->set_phase_timing(true);  // destroy() must free the buffer and the event
  backend->destroy();
  EXPECT_THROW(backend->set_phase_timing(false), Error);
  group->destroy();
}

TEST_P(MegaSingle, RejectsUnsupportedConfigurationsWithReasons) {
  auto group = single_rank_group();
  MoeConfig shared = small_config(16, GetParam());
  shared.shared_intermediate = 256;
  EXPECT_THROW(make_backend("mega", shared, group.get()), Error) << "shared experts";
  MoeConfig narrow = small_config(16, GetParam());
  narrow.hidden = 384;  // multiple of 128, not of 256
  try {
    make_mega_backend(narrow, group.get());
    ADD_FAILURE() << "mega accepted hidden = 384";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hidden = 384 must be a positive multiple of 256"), std::string::npos) << e.what();
  }
}

// No instantiation prefix: the names stay MegaSingle.<test>/<format>.
INSTANTIATE_TEST_SUITE_P(, MegaSingle,
                         ::testing::Values(WeightFormat::kFp8Block, WeightFormat::kBf16, WeightFormat::kNvfp4,
                                           WeightFormat::kMxfp4),
                         [](const ::testing::TestParamInfo<WeightFormat>& info) {
                           return std::string(weight_format_name(info.param));
                         });

}  // namespace
}  // namespace megamoe::testing
