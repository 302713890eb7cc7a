// EP runtime, dispatch/combine and the staged backend on ONE GPU (a single-rank group).
#include <chrono>

#include "common/gpu_stream.h"
#include "common/ep_harness.h"

namespace megamoe::testing {
namespace {

class EpSingle : public OneGpuTest<> {};

TEST_F(EpSingle, LifecycleWarmupBarrierDestroy) {
  auto group = single_rank_group();
  EXPECT_EQ(group->size(), 1);
  EXPECT_EQ(group->rank(), 0);
  group->warmup(stream_);
  for (int i = 0; i < 3; ++i) group->barrier(stream_);
  group->synchronize(stream_);
  group->destroy();
  group->destroy();  // idempotent
  EXPECT_TRUE(group->destroyed());
  try {
    group->barrier(stream_);
    ADD_FAILURE() << "barrier after destroy did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("after destroy"), std::string::npos) << e.what();
  }
}

void dispatch_combine_bit_exact(cudaStream_t stream_) {
  auto group = single_rank_group();
  group->warmup(stream_);
  int64_t rows = 0;
  for (EpPayload payload : {EpPayload::kFp8, EpPayload::kBf16})
    for (Routing routing : {Routing::kUniform, Routing::kSkewed, Routing::kPadded}) {
      DispatchCase tc;
      tc.payload = payload;
      tc.routing = routing;
      tc.seed = 11 + static_cast<int>(routing);
      tc.tokens_per_rank = {137};
      rows += run_dispatch_combine_case(*group, tc, stream_);
    }
  DispatchCase empty;
  empty.tokens_per_rank = {0};
  EXPECT_EQ(run_dispatch_combine_case(*group, empty, stream_), 0);
  EXPECT_GT(rows, 0);
}

TEST_F(EpSingle, DispatchCombineBitExact) { dispatch_combine_bit_exact(stream_); }

// The same cases through the two-kernel dispatch and combine (MEGAMOE_EP_OVERLAP=0, read when each dispatcher
// is created; the fused paths are the default since session 16).
TEST_F(EpSingle, DispatchCombineBitExactTwoKernel) {
  ScopedEnv two_kernel("MEGAMOE_EP_OVERLAP", "0");
  dispatch_combine_bit_exact(stream_);
}

// MEGAMOE_EP_OVERLAP=0 vs 1 on one rank, bit for bit, over several calls (epochs), padded and empty calls,
// a hidden size with two progress publications per row (2560 = 10 steps: after 8 and 10), unweighted calls;
// bad MEGAMOE_EP_DISPATCH_PIECE / MEGAMOE_EP_DISPATCH_SEND_WARPS values are rejected.
TEST_F(EpSingle, OverlapMatchesTwoKernelPath) {
  auto group = single_rank_group();
  group->warmup(stream_);
  DispatchCase tc;
  tc.hidden = 2560;
  tc.top_k = 6;
  tc.num_experts = 16;
  tc.capacity = 300;
  tc.seed = 41;
  int64_t rows = 0;
  for (EpPayload payload : {EpPayload::kFp8, EpPayload::kBf16}) {
    tc.payload = payload;
    rows += run_overlap_comparison(*group, tc, {{137}, {0}, {300}, {1}, {211}},
                                   {Routing::kPadded, Routing::kSkewed, Routing::kUniform}, stream_);
  }
  EXPECT_GT(rows, 0);
  const EpDispatchConfig config{256, 2, 4, 8, EpPayload::kFp8};
  for (const char* piece : {"0", "65536", "8x"}) {  // a bad dispatch piece is rejected at creation
    ScopedEnv overlap("MEGAMOE_EP_OVERLAP_DISPATCH", "1"), bad_piece("MEGAMOE_EP_DISPATCH_PIECE", piece);
    EXPECT_THROW({ EpDispatcher io(*group, config); }, Error) << "MEGAMOE_EP_DISPATCH_PIECE=" << piece;
  }
  for (const char* warps : {"0", "32", ""}) {  // so is a bad role split ("" = unset: the default, accepted)
    ScopedEnv overlap("MEGAMOE_EP_OVERLAP_DISPATCH", "1"), bad_split("MEGAMOE_EP_DISPATCH_SEND_WARPS", warps);
    if (*warps) {
      EXPECT_THROW({ EpDispatcher io(*group, config); }, Error) << "MEGAMOE_EP_DISPATCH_SEND_WARPS=" << warps;
    } else {
      EXPECT_NO_THROW({ EpDispatcher io(*group, config); });
    }
  }
  ScopedEnv bad("MEGAMOE_EP_OVERLAP", "yes");  // a bad value is rejected at creation
  EXPECT_THROW({ EpDispatcher io(*group, config); }, Error);
}

TEST_F(EpSingle, CapacityOverflowThrowsBeforeLaunch) {
  auto group = single_rank_group();
  EpDispatcher io(*group, EpDispatchConfig{256, 2, 4, 8, EpPayload::kFp8});
  const RankInputs in = make_rank_inputs(3, 0, 9, 256, 4, 2, 1, Routing::kUniform);
  DeviceInputs dev(in, 256, 2);
  try {
    io.dispatch(dev.hidden_view(), dev.ids_view(), dev.weights_view(), stream_);
    ADD_FAILURE() << "T = 9 > capacity 8 did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_tokens_per_rank = 8"), std::string::npos) << e.what();
  }
  // The group is still usable: nothing was launched.
  const RankInputs ok = make_rank_inputs(3, 0, 8, 256, 4, 2, 1, Routing::kUniform);
  DeviceInputs dev_ok(ok, 256, 2);
  io.dispatch(dev_ok.hidden_view(), dev_ok.ids_view(), dev_ok.weights_view(), stream_);
  group->synchronize(stream_);
}

TEST_F(EpSingle, InvalidExpertIdIsReported) {
  auto group = single_rank_group();
  EpDispatcher io(*group, EpDispatchConfig{256, 2, 4, 8, EpPayload::kFp8});
  RankInputs in = make_rank_inputs(5, 0, 4, 256, 4, 2, 1, Routing::kUniform);
  in.ids[3] = 17;  // >= num_experts
  DeviceInputs dev(in, 256, 2);
  io.dispatch(dev.hidden_view(), dev.ids_view(), dev.weights_view(), stream_);
  try {
    group->synchronize(stream_);
    ADD_FAILURE() << "expert id 17 >= 4 was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("17"), std::string::npos) << e.what();
  }
}

void staged_matches_reference(cudaStream_t stream_) {
  auto group = single_rank_group();
  for (WeightFormat format : {WeightFormat::kFp8Block, WeightFormat::kBf16, WeightFormat::kNvfp4, WeightFormat::kMxfp4}) {
    LayerCase lc;
    lc.config.hidden = 256;
    lc.config.intermediate = 256;
    lc.config.num_experts = 8;
    lc.config.top_k = 3;
    lc.config.weight_format = format;
    lc.config.max_tokens_per_rank = 96;
    lc.tokens_per_rank = {77};
    lc.routing = Routing::kPadded;
    run_staged_case(*group, lc, stream_, /*graph_replay=*/true);
  }
  LayerCase fc1;
  fc1.config = MoeConfig{256, 128, 4, 2, WeightFormat::kFp8Block, Activation{Activation::Kind::kSwigluClamped}, true, 0, 64};
  fc1.tokens_per_rank = {40};
  run_staged_case(*group, fc1, stream_, false);
}

TEST_F(EpSingle, StagedMatchesReference) { staged_matches_reference(stream_); }

// The staged backend (graph replay included) with the two-kernel dispatch and combine.
TEST_F(EpSingle, StagedMatchesReferenceTwoKernel) {
  ScopedEnv two_kernel("MEGAMOE_EP_OVERLAP", "0");
  staged_matches_reference(stream_);
}

// MEGAMOE_W4A8_G1_V10=1 (set_w4a8_g1_v10 before the layer is made): staged W4A8 packs W13 kGateUpInterleaved8 and
// runs W4A8 v10 GEMM 1, against the host reference with a graph replay, at rows hints (T * top_k / E) 28 (<= 64)
// and 150 (> 64), both activations (clamped SwiGLU with the top-k weight in GEMM 1). The switch-off layer's bytes
// are compared in MegaSingle.W4a8Gemm1V10LayersMatchTheOldPacking.
TEST_F(EpSingle, StagedW4a8Gemm1V10MatchesReference) {
  auto group = single_rank_group();
  const ScopedSwitch restore(kernels::w4a8_g1_v10, kernels::set_w4a8_g1_v10);
  kernels::set_w4a8_g1_v10(1);
  for (WeightFormat format : {WeightFormat::kNvfp4, WeightFormat::kMxfp4}) {
    SCOPED_TRACE(std::string(weight_format_name(format)));
    for (int tokens : {77, 400}) {
      LayerCase lc;
      lc.config = MoeConfig{256, 256, 8, 3, format, Activation{}, false, 0, 400};
      lc.tokens_per_rank = {tokens};
      lc.routing = Routing::kPadded;
      run_staged_case(*group, lc, stream_, /*graph_replay=*/true);
    }
    LayerCase fc1;
    fc1.config = MoeConfig{256, 128, 4, 2, format, Activation{Activation::Kind::kSwigluClamped}, true, 0, 256};
    fc1.tokens_per_rank = {200};  // rows hint 100
    run_staged_case(*group, fc1, stream_, false);
  }
}

// MEGAMOE_FP8_GEMM1_TWO_PASS=1 (read when the backend is created): the staged FP8 GEMM 1 as the plain grouped GEMM
// (BF16 gate/up) + swiglu_quant_fp8, against the host reference with the BF16 rounding of gate / up in its
// tolerance. hidden 256 (<= 4096: without the switch W13 would be packed for v9; the switch packs kGateUp), both
// activations, the top-k weight in GEMM 1 (apply_topk_in_fc1) and in the combine, a CUDA graph replay, experts of
// 0 rows (kPadded routing); a bad value of the variable is rejected at creation.
TEST_F(EpSingle, StagedGemm1TwoPassMatchesReference) {
  auto group = single_rank_group();
  ASSERT_EQ(setenv("MEGAMOE_FP8_GEMM1_TWO_PASS", "1", 1), 0);
  BackendCaseOptions options;
  options.graph_replay = true;
  options.repeats = 1;
  options.bf16_gate_up = true;
  LayerCase lc;
  lc.config.hidden = 256;
  lc.config.intermediate = 256;
  lc.config.num_experts = 8;
  lc.config.top_k = 3;
  lc.config.weight_format = WeightFormat::kFp8Block;
  lc.config.max_tokens_per_rank = 96;
  lc.tokens_per_rank = {77};
  lc.routing = Routing::kPadded;
  run_backend_case("staged", *group, lc, stream_, options);
  LayerCase fc1;
  fc1.config = MoeConfig{256, 128, 4, 2, WeightFormat::kFp8Block, Activation{Activation::Kind::kSwigluClamped}, true, 0, 64};
  fc1.tokens_per_rank = {40};
  run_backend_case("staged", *group, fc1, stream_, options);
  LayerCase wide;  // hidden > 4096 (split-N packing either way), I = 3 blocks
  wide.config = MoeConfig{5120, 384, 4, 2, WeightFormat::kFp8Block, Activation{}, false, 0, 32};
  wide.tokens_per_rank = {29};
  run_backend_case("staged", *group, wide, stream_, options);
  ASSERT_EQ(setenv("MEGAMOE_FP8_GEMM1_TWO_PASS", "yes", 1), 0);
  EXPECT_THROW(make_backend("staged", lc.config, group.get()), Error);
  unsetenv("MEGAMOE_FP8_GEMM1_TWO_PASS");
}

}  // namespace
}  // namespace megamoe::testing
