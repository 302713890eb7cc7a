// MoeWorkspace on N GPUs (N = MEGAMOE_TEST_RANKS, default 2; one process per GPU): 3 layers of staged / mega sharing one workspace (one
// symmetric window for all) equal 3 layers with private windows bit for bit, in a mixed layer order
// with unequal and zero token counts per rank (common/ep_test_ranks.h: workspace_tokens), and against
// the host reference.
#include "common/ep_harness.h"

namespace megamoe::testing {
namespace {

TEST(MoeWorkspaceMulti, SharedLayersEqualPrivateLayersOnAllRanks) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  auto group = EpGroup::bootstrap(rank.rank, rank.ranks, rank.rendezvous);
  MEGAMOE_CUDA_CHECK(cudaSetDevice(group->device()));
  cudaStream_t stream = nullptr;
  MEGAMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int R = group->size(), me = group->rank();
  const MoeConfig c{256, 256, experts_for_ranks(8, R), 3, WeightFormat::kFp8Block, Activation{}, false, 0, 128};
  constexpr int kLayers = 3;
  for (const std::string backend : {"staged", "mega[fused]"}) {
    std::vector<std::vector<HostExpert>> experts;
    for (int l = 0; l < kLayers; ++l) experts.push_back(make_experts(c, 300 + l));
    auto workspace = make_moe_workspace();
    std::vector<std::unique_ptr<MoeBackend>> shared, priv;
    for (int l = 0; l < kLayers; ++l) {  // same creation order on every rank (collective)
      shared.push_back(make_test_backend(backend, c, group.get(), workspace));
      priv.push_back(make_test_backend(backend, c, group.get()));
      for (auto* b : {shared.back().get(), priv.back().get()}) {
        for (int e = 0; e < b->num_local_experts(); ++e) b->load_expert(e, experts[l][b->first_local_expert() + e].weights);
        b->warmup(stream);
      }
    }
    ASSERT_EQ(workspace->regions().size(), 1u);
    const int order[] = {2, 0, 1, 1, 0, 2};
    for (int call = 0; call < 6; ++call) {
      const int l = order[call], T = workspace_tokens(me, call);
      SCOPED_TRACE(::testing::Message() << backend << " rank " << me << " call " << call << " layer " << l << " T=" << T);
      const RankInputs in = make_rank_inputs(500 + call, me, T, c.hidden, c.num_experts, c.top_k, R, Routing::kUniform);
      DeviceInputs a(in, c.hidden, c.top_k), b(in, c.hidden, c.top_k);
      poison_device_buffer(a.out, static_cast<size_t>(T) * c.hidden * 2, 0xFF, stream);
      poison_device_buffer(b.out, static_cast<size_t>(T) * c.hidden * 2, 0xFF, stream);
      MoeInputs ia{a.hidden_view(), a.ids_view(), a.weights_view()}, ib{b.hidden_view(), b.ids_view(), b.weights_view()};
      MoeOutputs oa{a.out_view()}, ob{b.out_view()};
      shared[l]->forward(ia, oa, stream);  // collective: every rank calls the same layer
      priv[l]->forward(ib, ob, stream);
      group->synchronize(stream);
      const auto got = a.download_out();
      ASSERT_EQ(got, b.download_out());
      if (T > 0) {
        std::vector<double> tolerance;
        const auto ref = reference_layer(c, experts[l], in, &tolerance, reference_combine_ranks(backend, R));
        const Comparison cmp = compare_outputs(got, ref, c.hidden, tolerance);
        EXPECT_LT(cmp.rel_l2, rel_l2_budget(c.weight_format));
        EXPECT_EQ(cmp.elementwise_failures, 0) << "first: " << cmp.first_failure;
      }
    }
    std::printf("[%s] rank %d: 3 layers on one workspace region (%.1f MiB local + %.1f MiB symmetric) == private\n",
                backend.c_str(), me, workspace->device_bytes() / 1048576.0, workspace->symmetric_bytes() / 1048576.0);
    for (auto& b : shared) b->destroy();
    for (auto& b : priv) b->destroy();
    workspace->release();
  }
  cudaStreamDestroy(stream);
  group->destroy();
}

}  // namespace
}  // namespace megamoe::testing
