// The `mega` backend's capability report and rejection reasons (plain C++, runs in CI).
#include <gtest/gtest.h>

#include "moe/mega_backend.h"

namespace megamoe {
namespace {

MoeConfig dsv3_fp8() { return MoeConfig{7168, 2048, 256, 8, WeightFormat::kFp8Block, Activation{}, false, 0, 8192}; }

bool mentions(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

TEST(MegaCapabilities, ReportsWhatItRuns) {
  const Capabilities c = mega_capabilities();
  EXPECT_EQ(c.formats, (std::vector<WeightFormat>{WeightFormat::kFp8Block, WeightFormat::kBf16, WeightFormat::kNvfp4,
                                                  WeightFormat::kMxfp4}));
  EXPECT_EQ(c.activations.size(), 2u);
  EXPECT_EQ(c.min_ranks, 1);
  EXPECT_EQ(c.max_ranks, 8);
  EXPECT_TRUE(c.needs_gpu);
  EXPECT_TRUE(c.supports_apply_topk_in_fc1);
  EXPECT_FALSE(c.supports_shared_expert);
  for (int ranks : {1, 2, 4, 8}) EXPECT_EQ(mega_reject_reason(dsv3_fp8(), ranks), "") << ranks << " ranks";
  MoeConfig clamped = dsv3_fp8();
  clamped.activation = Activation{Activation::Kind::kSwigluClamped, 7.0f, 1.702f};
  clamped.apply_topk_in_fc1 = true;
  EXPECT_EQ(mega_reject_reason(clamped, 2), "");
  EXPECT_EQ(c.reject_reason(clamped, 2), "");
  MoeConfig bf16 = clamped;  // BF16 weights: the same shapes, 1..8 ranks
  bf16.weight_format = WeightFormat::kBf16;
  for (int ranks : {1, 2, 8}) EXPECT_EQ(mega_reject_reason(bf16, ranks), "") << ranks << " ranks";
  EXPECT_EQ(c.reject_reason(bf16, 2), "");
}

// W4A8 (nvfp4, mxfp4): the dsv3 shape on 1..8 ranks with either activation; the shape limits are the
// other formats' (256-column GEMM-2 tiles, I % 128, 512 local experts), each named with its field.
TEST(MegaCapabilities, AcceptsW4a8FormatsOnAnyRankCount) {
  const Capabilities caps = mega_capabilities();
  for (WeightFormat f : {WeightFormat::kNvfp4, WeightFormat::kMxfp4}) {
    SCOPED_TRACE(std::string(weight_format_name(f)));
    MoeConfig c = dsv3_fp8();
    c.weight_format = f;
    for (int ranks = 1; ranks <= 8; ++ranks) {
      if (c.num_experts % ranks == 0) {
        EXPECT_EQ(mega_reject_reason(c, ranks), "") << ranks << " ranks";
      }
    }
    EXPECT_EQ(caps.reject_reason(c, 2), "");
    c.activation = Activation{Activation::Kind::kSwigluClamped, 7.0f, 1.702f};
    c.apply_topk_in_fc1 = true;
    EXPECT_EQ(mega_reject_reason(c, 4), "");
    MoeConfig odd = c;  // 3 ranks need a multiple of 3 experts
    odd.num_experts = 96;
    EXPECT_EQ(mega_reject_reason(odd, 3), "");
    MoeConfig narrow = c;
    narrow.hidden = 7040;
    EXPECT_TRUE(mentions(mega_reject_reason(narrow, 2), "hidden = 7040 must be a positive multiple of 256"));
    MoeConfig thin = c;
    thin.intermediate = 2000;
    const std::string why = mega_reject_reason(thin, 2);
    EXPECT_TRUE(mentions(why, "intermediate = 2000 must be a positive multiple of 128") && mentions(why, "W4A8")) << why;
    MoeConfig many = c;
    many.num_experts = 2048;
    EXPECT_TRUE(mentions(mega_reject_reason(many, 2), "num_experts / ranks = 1024 local experts must be <= 512"));
    many.num_experts = 1024;
    EXPECT_EQ(mega_reject_reason(many, 2), "") << "512 local experts is the limit for W4A8 too";
    EXPECT_TRUE(mentions(mega_reject_reason(c, 9), "ranks = 9 must be in [1, 8]"));
  }
}

TEST(MegaCapabilities, UnknownFormatSaysWhatRuns) {
  MoeConfig c = dsv3_fp8();
  c.weight_format = static_cast<WeightFormat>(17);
  const std::string why = mega_reject_reason(c, 2);
  EXPECT_TRUE(mentions(why, "is not supported (mega runs fp8_block, bf16, nvfp4 and mxfp4)")) << why;
  EXPECT_FALSE(mega_capabilities().reject_reason(c, 2).empty());
}

TEST(MegaCapabilities, RejectedShapesNameFieldAndLimit) {
  auto reason = [](auto&& edit, int ranks = 2) {
    MoeConfig c = dsv3_fp8();
    edit(c);
    return mega_reject_reason(c, ranks);
  };
  EXPECT_TRUE(mentions(reason([](MoeConfig& c) { c.hidden = 7040; }), "hidden = 7040 must be a positive multiple of 256"));
  EXPECT_TRUE(mentions(reason([](MoeConfig& c) { c.intermediate = 2000; }), "intermediate = 2000"));
  EXPECT_TRUE(mentions(reason([](MoeConfig& c) { c.num_experts = 255; }), "num_experts = 255 must be a positive multiple of ranks = 2"));
  EXPECT_TRUE(mentions(reason([](MoeConfig& c) { c.num_experts = 2048; }, 2), "num_experts / ranks = 1024 local experts must be <= 512"));
  EXPECT_EQ(reason([](MoeConfig& c) { c.num_experts = 1024; }, 2), "") << "512 local experts is the limit, inclusive";
  EXPECT_TRUE(mentions(reason([](MoeConfig& c) { c.top_k = 33; }), "top_k = 33"));
  EXPECT_TRUE(mentions(reason([](MoeConfig& c) { c.max_tokens_per_rank = 0; }), "max_tokens_per_rank = 0"));
  EXPECT_TRUE(mentions(reason([](MoeConfig& c) { c.shared_intermediate = 512; }), "shared experts are not supported"));
  EXPECT_TRUE(mentions(reason([](MoeConfig&) {}, 9), "ranks = 9 must be in [1, 8]"));
  // Several problems: all of them, joined.
  const std::string many = reason([](MoeConfig& c) {
    c.hidden = 100;
    c.top_k = 0;
  });
  EXPECT_TRUE(mentions(many, "hidden = 100") && mentions(many, "top_k = 0") && mentions(many, "; ")) << many;
}

}  // namespace
}  // namespace megamoe
