// The `mega` backend (one fused kernel per forward) on ONE GPU (a single-rank group), FP8-block and BF16
// weights: vs the host reference, vs `staged` bit for bit, graph replay, determinism, both tile heights,
// changing token counts, bad input.
#include "common/gpu_stream.h"
#include "common/ep_harness.h"
#include "moe/mega_backend.h"

namespace megamoe::testing {
namespace {

// Every test runs for both weight formats: MegaSingle.<test>/fp8_block and MegaSingle.<test>/bf16.
class MegaSingle : public OneGpuTest<::testing::TestWithParam<WeightFormat>> {};

MoeConfig small_config(int max_tokens, WeightFormat format = WeightFormat::kFp8Block) {
  return MoeConfig{256, 256, 8, 3, format, Activation{}, false, 0, max_tokens};
}

// mega vs staged on the same inputs and weights: 0 differing elements. Both run the same GEMM device
// code per row (each output element depends only on its row, its weight column and the fixed k-step
// order), round the GEMM-1 output the same way, and on one rank both combines sum a token's k slots
// in one fp32 fmaf chain in slot order.
TEST_P(MegaSingle, MatchesReferenceAndStagedReplaysAndRepeats) {
  auto group = single_rank_group();
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
    run_backend_case("mega", *group, lc, stream_, options);
  }
}

TEST_P(MegaSingle, ClampedSwigluTopkInFc1AndLargeTiles) {
  auto group = single_rank_group();
  // 64-row tiles (few rows per expert) and 128-row tiles (T * k / E > 64), with top-k in fc1.
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
    run_backend_case("mega", *group, lc, stream_, options);
  }
}

TEST_P(MegaSingle, ZeroTokensAndChangingTokenCounts) {
  auto group = single_rank_group();
  const MoeConfig c = small_config(128, GetParam());
  const auto experts = make_experts(c, 3);
  auto backend = make_backend("mega", c, group.get());
  for (int e = 0; e < backend->num_local_experts(); ++e) backend->load_expert(e, experts[e].weights);
  backend->warmup(stream_);
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
    std::vector<double> tolerance;
    const auto ref = reference_layer(c, experts, in, &tolerance);
    const Comparison cmp = compare_outputs(dev.download_out(), ref, c.hidden, tolerance);
    EXPECT_LT(cmp.rel_l2, rel_l2_budget(c.weight_format));
    EXPECT_EQ(cmp.elementwise_failures, 0) << "first: " << cmp.first_failure;
  }
  backend->destroy();
}

TEST_P(MegaSingle, CapacityOverflowThrowsBeforeLaunchAndBadIdIsReported) {
  auto group = single_rank_group();
  const MoeConfig c = small_config(8, GetParam());
  const auto experts = make_experts(c, 4);
  auto backend = make_backend("mega", c, group.get());
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

TEST_P(MegaSingle, RejectsUnsupportedConfigurationsWithReasons) {
  auto group = single_rank_group();
  MoeConfig nvfp4 = small_config(16);
  nvfp4.weight_format = WeightFormat::kNvfp4;
  try {
    make_backend("mega", nvfp4, group.get());
    ADD_FAILURE() << "mega accepted nvfp4 weights";
  } catch (const Error& e) {
    // The registry's capability check answers first (the detailed reason is mega_reject_reason's, CPU-tested).
    EXPECT_NE(std::string(e.what()).find("weight_format nvfp4 is not supported"), std::string::npos) << e.what();
  }
  MoeConfig narrow = small_config(16, GetParam());
  narrow.hidden = 384;  // multiple of 128, not of 256
  EXPECT_THROW(make_mega_backend(narrow, group.get()), Error);
}

// No instantiation prefix: the names stay MegaSingle.<test>/<format>.
INSTANTIATE_TEST_SUITE_P(, MegaSingle, ::testing::Values(WeightFormat::kFp8Block, WeightFormat::kBf16),
                         [](const ::testing::TestParamInfo<WeightFormat>& info) {
                           return std::string(weight_format_name(info.param));
                         });

}  // namespace
}  // namespace megamoe::testing
