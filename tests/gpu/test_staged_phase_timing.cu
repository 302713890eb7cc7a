// `staged` phase timing (MoeBackend::set_phase_timing / last_phase_times) on ONE GPU: four phases
// that cover the forward, and a forward whose output does not depend on whether timing is on.
#include <cstdio>

#include "common/ep_harness.h"
#include "common/gpu_stream.h"

namespace megamoe::testing {
namespace {

class StagedPhaseTiming : public OneGpuTest<> {};

TEST_F(StagedPhaseTiming, FourPhasesCoverTheForwardAndLeaveTheOutputAlone) {
  constexpr uint64_t kSeed = 23;
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  auto group = single_rank_group();
  MoeConfig c;
  c.hidden = 1024;
  c.intermediate = 512;
  c.num_experts = 16;
  c.top_k = 4;
  c.weight_format = WeightFormat::kFp8Block;
  c.max_tokens_per_rank = 512;
  const auto experts = make_experts(c, kSeed);
  auto backend = make_backend("staged", c, group.get());
  for (int e = 0; e < backend->num_local_experts(); ++e)
    backend->load_expert(e, experts[backend->first_local_expert() + e].weights);
  backend->warmup(stream_);
  EXPECT_TRUE(backend->last_phase_times().empty()) << "timing is off by default";

  const RankInputs in = make_rank_inputs(kSeed, 0, 512, c.hidden, c.num_experts, c.top_k, 1, Routing::kUniform);
  DeviceInputs dev(in, c.hidden, c.top_k);
  const size_t out_bytes = static_cast<size_t>(in.tokens) * c.hidden * 2;
  MoeInputs inputs{dev.hidden_view(), dev.ids_view(), dev.weights_view()};
  MoeOutputs outputs{dev.out_view()};

  // Timing off: the output to match (and a sanity check against the host reference).
  poison_device_buffer(dev.out, out_bytes, 0xFF, stream_);
  backend->forward(inputs, outputs, stream_);
  group->synchronize(stream_);
  const std::vector<uint16_t> untimed = dev.download_out();
  std::vector<double> tolerance;
  const Comparison cmp = compare_outputs(untimed, reference_layer(c, experts, in, &tolerance, 1), c.hidden, tolerance);
  EXPECT_LT(cmp.rel_l2, rel_l2_budget(c.weight_format));
  EXPECT_EQ(cmp.elementwise_failures, 0) << "first: " << cmp.first_failure;

  backend->set_phase_timing(true);
  EXPECT_TRUE(backend->last_phase_times().empty()) << "no forward has run with timing on yet";
  for (int iter = 0; iter < 3; ++iter) {
    SCOPED_TRACE(::testing::Message() << "timed forward " << iter);
    const TimedForward timed = timed_forward(*backend, inputs, outputs, dev.out, out_bytes, stream_);
    const std::vector<MoeBackend::PhaseTime>& phases = timed.phases;
    const double total_us = timed.total_us;
    ASSERT_EQ(phases.size(), 4u);
    const char* names[] = {"dispatch", "gemm1", "gemm2", "combine"};
    double sum_us = 0;
    for (size_t p = 0; p < phases.size(); ++p) {
      EXPECT_EQ(phases[p].phase, names[p]);
      EXPECT_GT(phases[p].us, 0.0) << phases[p].phase;
      sum_us += phases[p].us;
    }
    std::printf("[staged phases] T=%d dispatch %.1f gemm1 %.1f gemm2 %.1f combine %.1f sum %.1f us, forward %.1f us\n",
                in.tokens, phases[0].us, phases[1].us, phases[2].us, phases[3].us, sum_us, total_us);
    EXPECT_GE(sum_us, 0.5 * total_us);
    EXPECT_LE(sum_us, 1.5 * total_us);
    EXPECT_TRUE(dev.download_out() == untimed) << "the output changed with phase timing on";
  }

  backend->set_phase_timing(false);
  EXPECT_TRUE(backend->last_phase_times().empty()) << "timing switched off";
  backend->set_phase_timing(true);  // destroy() must free the events
  backend->destroy();
  EXPECT_THROW(backend->set_phase_timing(false), Error);
  group->destroy();
}

}  // namespace
}  // namespace megamoe::testing
