// MoeWorkspace (moe.h) on ONE GPU: layers of `staged` and `mega` that share one workspace give the
// same bits as each layer with its own buffers, in any layer order, eagerly and replayed from one
// CUDA graph holding several layers; the shared region is allocated once (not per layer).
#include <map>

#include "common/gpu_stream.h"
#include "common/ep_harness.h"

namespace megamoe::testing {
namespace {

int64_t device_used_bytes() {
  size_t free_bytes = 0, total_bytes = 0;
  MEGAMOE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(total_bytes - free_bytes);
}

struct Layers {
  std::shared_ptr<MoeWorkspace> workspace;
  std::vector<std::unique_ptr<MoeBackend>> backends;
};

Layers make_layers(const std::string& backend, const MoeConfig& c, EpGroup& group,
                   const std::vector<std::vector<HostExpert>>& experts, bool shared, cudaStream_t stream) {
  Layers layers;
  if (shared) layers.workspace = make_moe_workspace();
  for (size_t l = 0; l < experts.size(); ++l) {
    layers.backends.push_back(make_test_backend(backend, c, &group, layers.workspace));
    for (int e = 0; e < layers.backends.back()->num_local_experts(); ++e)
      layers.backends.back()->load_expert(e, experts[l][e].weights);
    layers.backends.back()->warmup(stream);
  }
  return layers;
}

class MoeWorkspaceSingle : public OneGpuTest<::testing::TestWithParam<const char*>> {};

TEST_P(MoeWorkspaceSingle, SharedLayersEqualPrivateLayersBitForBit) {
  const std::string backend = GetParam();
  auto group = single_rank_group();
  // C = 2048 tokens: the shared region (~tens of MB) dwarfs the allocation granularity.
  const MoeConfig c{256, 256, 8, 3, WeightFormat::kFp8Block, Activation{}, false, 0, 2048};
  constexpr int kLayers = 4;
  std::vector<std::vector<HostExpert>> experts;
  for (int l = 0; l < kLayers; ++l) experts.push_back(make_experts(c, 700 + l));

  const int64_t before_private = device_used_bytes();
  Layers priv = make_layers(backend, c, *group, experts, false, stream_);
  const int64_t private_bytes = device_used_bytes() - before_private;
  const int64_t before_shared = device_used_bytes();
  Layers shared = make_layers(backend, c, *group, experts, true, stream_);
  const int64_t shared_bytes = device_used_bytes() - before_shared;

  const auto regions = shared.workspace->regions();
  ASSERT_EQ(regions.size(), 1u);
  EXPECT_EQ(regions[0].users, kLayers);
  const int64_t region_bytes = static_cast<int64_t>(regions[0].device_bytes + regions[0].symmetric_bytes);
  std::printf("[%s] %d layers: private %.1f MiB, shared %.1f MiB, region %.1f MiB (%s)\n", backend.c_str(), kLayers,
              private_bytes / 1048576.0, shared_bytes / 1048576.0, region_bytes / 1048576.0, regions[0].key.c_str());
  EXPECT_GT(region_bytes, 4 << 20);
  // Private layers hold kLayers regions, shared ones one: the difference is (kLayers - 1) regions
  // (private allocations round up, never down).
  EXPECT_GE(private_bytes - shared_bytes, static_cast<int64_t>(0.9 * (kLayers - 1) * region_bytes));

  // Layer order 0 1 2 3 2 0 3 1 with a fresh input (and T) per call: shared == private, bit for bit;
  // the first call of each layer also against the host reference.
  const int order[] = {0, 1, 2, 3, 2, 0, 3, 1};
  const int tokens[] = {77, 1, 300, 2048, 0, 64, 129, 5};
  for (int call = 0; call < 8; ++call) {
    const int l = order[call], T = tokens[call];
    SCOPED_TRACE(::testing::Message() << backend << " call " << call << " layer " << l << " T=" << T);
    const RankInputs in = make_rank_inputs(9000 + call, 0, T, c.hidden, c.num_experts, c.top_k, 1, Routing::kUniform);
    DeviceInputs a(in, c.hidden, c.top_k), b(in, c.hidden, c.top_k);
    poison_device_buffer(a.out, static_cast<size_t>(T) * c.hidden * 2, 0xFF, stream_);
    poison_device_buffer(b.out, static_cast<size_t>(T) * c.hidden * 2, 0xFF, stream_);
    MoeInputs ia{a.hidden_view(), a.ids_view(), a.weights_view()}, ib{b.hidden_view(), b.ids_view(), b.weights_view()};
    MoeOutputs oa{a.out_view()}, ob{b.out_view()};
    shared.backends[l]->forward(ia, oa, stream_);
    priv.backends[l]->forward(ib, ob, stream_);
    group->synchronize(stream_);
    const auto got = a.download_out(), want = b.download_out();
    ASSERT_EQ(got, want);
    if (call < kLayers && T > 0) {
      std::vector<double> tolerance;
      const auto ref = reference_layer(c, experts[l], in, &tolerance);
      const Comparison cmp = compare_outputs(got, ref, c.hidden, tolerance);
      EXPECT_LT(cmp.rel_l2, rel_l2_budget(c.weight_format));
      EXPECT_EQ(cmp.elementwise_failures, 0) << "first: " << cmp.first_failure;
    }
  }
  for (auto& b : shared.backends) b->destroy();
  for (auto& b : priv.backends) b->destroy();
  shared.workspace->release();
  group->destroy();
}

// Several layers of one workspace inside ONE CUDA graph (how the runner's decode graphs use them):
// replays equal the eager calls bit for bit, replay after replay.
TEST_P(MoeWorkspaceSingle, LayersSharingAWorkspaceReplayFromOneGraph) {
  const std::string backend = GetParam();
  auto group = single_rank_group();
  const MoeConfig c{256, 256, 8, 3, WeightFormat::kFp8Block, Activation{}, false, 0, 64};
  constexpr int kLayers = 3;
  std::vector<std::vector<HostExpert>> experts;
  for (int l = 0; l < kLayers; ++l) experts.push_back(make_experts(c, 40 + l));
  Layers layers = make_layers(backend, c, *group, experts, true, stream_);
  const int T = 24;
  const RankInputs in = make_rank_inputs(3, 0, T, c.hidden, c.num_experts, c.top_k, 1, Routing::kUniform);
  // Chain: layer l reads the previous layer's output (as a model would), same routing each layer.
  std::vector<std::unique_ptr<DeviceInputs>> io;
  for (int l = 0; l < kLayers; ++l) io.push_back(std::make_unique<DeviceInputs>(in, c.hidden, c.top_k));
  auto run_chain = [&] {
    for (int l = 0; l < kLayers; ++l) {
      MoeInputs i{l == 0 ? io[0]->hidden_view()
                         : TensorView::make2d(io[l - 1]->out, DType::kBF16, T, c.hidden, Device::kCuda),
                  io[l]->ids_view(), io[l]->weights_view()};
      MoeOutputs o{io[l]->out_view()};
      layers.backends[l]->forward(i, o, stream_);
    }
  };
  run_chain();
  group->synchronize(stream_);
  const auto eager = io[kLayers - 1]->download_out();

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  MEGAMOE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  run_chain();
  MEGAMOE_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  MEGAMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    for (int l = 0; l < kLayers; ++l) poison_device_buffer(io[l]->out, static_cast<size_t>(T) * c.hidden * 2, 0xFF, stream_);
    MEGAMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    group->synchronize(stream_);
    EXPECT_EQ(io[kLayers - 1]->download_out(), eager) << backend << " replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  for (auto& b : layers.backends) b->destroy();
  group->destroy();
}

// Different geometries get different regions; a null group shares nothing (the backend's private group).
TEST_P(MoeWorkspaceSingle, RegionsAreKeyedByGeometryAndGroup) {
  const std::string backend = GetParam();
  auto group = single_rank_group();
  const MoeConfig a{256, 256, 8, 3, WeightFormat::kFp8Block, Activation{}, false, 0, 64};
  MoeConfig b = a;
  b.max_tokens_per_rank = 128;
  auto ws = make_moe_workspace();
  auto l0 = make_test_backend(backend, a, group.get(), ws);
  auto l1 = make_test_backend(backend, a, group.get(), ws);
  auto l2 = make_test_backend(backend, b, group.get(), ws);
  auto l3 = make_test_backend(backend, a, nullptr, ws);
  const auto regions = ws->regions();
  ASSERT_EQ(regions.size(), 3u);
  std::map<int, int> users;
  for (const auto& r : regions) ++users[r.users];
  EXPECT_EQ(users[2], 1);  // l0 + l1
  EXPECT_EQ(users[1], 2);  // l2, l3
  for (auto* l : {l0.get(), l1.get(), l2.get(), l3.get()}) l->destroy();
  ws->release();
  group->destroy();
}

// `mega` with its path forced to the fused kernel: these tests count the fused kernel's region (the
// split path's scratch is the staged region, MoeWorkspaceSplit below). Test names stay .../mega.
INSTANTIATE_TEST_SUITE_P(Backends, MoeWorkspaceSingle, ::testing::Values("staged", "mega[fused]"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           const std::string name = info.param;
                           return name.rfind("mega", 0) == 0 ? std::string("mega") : name;
                         });

// `mega` layers whose forwards can take the split path hold the staged pipeline's region, under
// staged's key: a model's mega layers share one, and a staged layer of the same geometry shares it
// too; a layer that can never split (capacity 8: 3 rows per expert) adds none.
class MoeWorkspaceSplit : public OneGpuTest<> {};

TEST_F(MoeWorkspaceSplit, MegaSplitPathSharesTheStagedRegion) {
  auto group = single_rank_group();
  const MoeConfig c{256, 256, 8, 3, WeightFormat::kFp8Block, Activation{}, false, 0, 512};  // up to 192 rows
  MoeConfig tiny = c;
  tiny.max_tokens_per_rank = 8;
  auto ws = make_moe_workspace();
  auto m0 = make_test_backend("mega[auto]", c, group.get(), ws);
  auto m1 = make_test_backend("mega[auto]", c, group.get(), ws);
  auto st = make_test_backend("staged", c, group.get(), ws);
  auto small = make_test_backend("mega[auto]", tiny, group.get(), ws);
  const auto regions = ws->regions();
  ASSERT_EQ(regions.size(), 3u) << "mega C=512, staged C=512 (shared by m0, m1, st), mega C=8";
  int staged_users = -1;
  for (const auto& r : regions)
    if (r.key.rfind("staged", 0) == 0) staged_users = r.users;
  EXPECT_EQ(staged_users, 3);
  for (auto* l : {m0.get(), m1.get(), st.get(), small.get()}) l->destroy();
  ws->release();
  group->destroy();
}

}  // namespace
}  // namespace megamoe::testing
