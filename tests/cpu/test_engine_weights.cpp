// Expert loading: fused (transformers 5) and per-expert (Qwen / Mixtral) keys give the same canonical
// matrices; online quantization is formats::quantize of the checkpoint values; a rank loads only its
// experts.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/safetensors.h"
#include "engine/weights.h"
#include "cpu/engine_test_util.h"
#include "megamoe/error.h"
#include "megamoe/formats.h"

using namespace megamoe;
using namespace megamoe::engine;

namespace {

using megamoe::engine::testing::fixture;

std::vector<uint8_t> raw_bytes(const TensorRecord& record, int64_t first, int64_t count) {
  return std::vector<uint8_t>(record.data + first * 2, record.data + (first + count) * 2);
}

using megamoe::engine::testing::expect_same_matrix;

TEST(EngineWeights, FusedExpertKeysSliceTheRightExpert) {
  const ModelConfig config = load_model_config(fixture("tiny-qwen3-moe"));
  const Checkpoint checkpoint(fixture("tiny-qwen3-moe"));
  const auto source = make_checkpoint_source(config, fixture("tiny-qwen3-moe"));
  const int64_t H = config.hidden_size, I = config.moe_intermediate_size;
  const TensorRecord& gate_up = checkpoint.get("model.layers.2.mlp.experts.gate_up_proj");
  const TensorRecord& down = checkpoint.get("model.layers.2.mlp.experts.down_proj");
  for (int e : {0, 5, 7}) {
    const ExpertWeights w = source->expert(2, e, WeightFormat::kBf16);
    EXPECT_EQ(w.w13.rows, 2 * I);
    EXPECT_EQ(w.w13.cols, H);
    EXPECT_EQ(w.w13.data, raw_bytes(gate_up, e * 2 * I * H, 2 * I * H)) << "expert " << e;
    EXPECT_EQ(w.w2.data, raw_bytes(down, e * H * I, H * I)) << "expert " << e;
  }
  // Online quantization = formats::quantize of the checkpoint's values of that expert.
  const int64_t E = config.num_experts;
  const std::vector<float> gate_up_f32 = checkpoint.read_f32("model.layers.2.mlp.experts.gate_up_proj", {E, 2 * I, H});
  const std::vector<float> down_f32 = checkpoint.read_f32("model.layers.2.mlp.experts.down_proj", {E, H, I});
  const int e = 3;
  for (WeightFormat format : {WeightFormat::kFp8Block, WeightFormat::kNvfp4, WeightFormat::kMxfp4}) {
    SCOPED_TRACE(std::string(weight_format_name(format)));
    const ExpertWeights q = source->expert(2, e, format);
    expect_same_matrix(q.w13, formats::quantize(gate_up_f32.data() + e * 2 * I * H, 2 * I, H, format));
    expect_same_matrix(q.w2, formats::quantize(down_f32.data() + e * H * I, H, I, format));
  }
}

TEST(EngineWeights, PerExpertMixtralKeysConcatenateGateThenUp) {
  const ModelConfig config = load_model_config(fixture("tiny-mixtral"));
  const Checkpoint checkpoint(fixture("tiny-mixtral"));
  const auto source = make_checkpoint_source(config, fixture("tiny-mixtral"));
  const int64_t H = config.hidden_size, I = config.moe_intermediate_size;
  const std::string p = "model.layers.1.block_sparse_moe.experts.6.";
  std::vector<uint8_t> w13 = raw_bytes(checkpoint.get(p + "w1.weight"), 0, I * H);
  const std::vector<uint8_t> up = raw_bytes(checkpoint.get(p + "w3.weight"), 0, I * H);
  w13.insert(w13.end(), up.begin(), up.end());
  const ExpertWeights w = source->expert(1, 6, WeightFormat::kBf16);
  EXPECT_EQ(w.w13.data, w13);
  EXPECT_EQ(w.w2.data, raw_bytes(checkpoint.get(p + "w2.weight"), 0, H * I));

}

// Records which experts it was given; says it holds experts [first, first + count).
class RecordingBackend final : public MoeBackend {
 public:
  RecordingBackend(int first, int count) : first_(first), count_(count) {}
  std::string_view name() const override { return "recording"; }
  Capabilities capabilities() const override { return {}; }
  const MoeConfig& config() const override { return config_; }
  int first_local_expert() const override { return first_; }
  int num_local_experts() const override { return count_; }
  void load_expert(int local, const ExpertWeights& weights) override { loaded.emplace_back(local, weights); }
  void load_shared_expert(const ExpertWeights&) override { FAIL() << "no shared expert in mixtral"; }
  void warmup(StreamHandle) override {}
  void forward(const MoeInputs&, MoeOutputs&, StreamHandle) override {}
  void destroy() override {}
  std::vector<std::pair<int, ExpertWeights>> loaded;

 private:
  MoeConfig config_;
  int first_, count_;
};

TEST(EngineWeights, EachRankLoadsOnlyItsExperts) {
  const ModelConfig config = load_model_config(fixture("tiny-mixtral"));
  const auto source = make_checkpoint_source(config, fixture("tiny-mixtral"));
  // Rank 1 of 2: experts 4..7 of every layer.
  std::vector<RecordingBackend> rank1(config.num_layers, RecordingBackend(4, 4));
  std::vector<MoeBackend*> layers;
  for (auto& backend : rank1) layers.push_back(&backend);
  const ModelWeights weights = load_model_weights(config, *source, layers, WeightFormat::kBf16, false);
  EXPECT_TRUE(weights.lm_head.empty());  // tied
  for (int layer = 0; layer < config.num_layers; ++layer) {
    ASSERT_EQ(rank1[layer].loaded.size(), 4u);
    for (int local = 0; local < 4; ++local) {
      EXPECT_EQ(rank1[layer].loaded[local].first, local);
      const ExpertWeights want = source->expert(layer, 4 + local, WeightFormat::kBf16);
      EXPECT_EQ(rank1[layer].loaded[local].second.w13.data, want.w13.data) << "layer " << layer << " local " << local;
      EXPECT_EQ(rank1[layer].loaded[local].second.w2.data, want.w2.data);
    }
  }
}

}  // namespace
