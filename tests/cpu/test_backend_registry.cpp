// Backend registry: name normalisation, self-registration from another translation unit (as the
// staged/mega backends do), and the errors for unknown, unbuilt, unavailable and incapable backends.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "backends/registry.h"
#include "megamoe/error.h"
#include "megamoe/moe.h"

using namespace megamoe;

namespace {

template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected megamoe::Error";
  return "";
}

Capabilities silu_bf16_only() {
  Capabilities caps;
  caps.formats = {WeightFormat::kBf16};
  caps.activations = {Activation::Kind::kSiluMul};
  caps.supports_apply_topk_in_fc1 = false;
  return caps;
}

// Registered from this file exactly as a GPU backend registers from its own .cu/.cpp.
MEGAMOE_REGISTER_BACKEND(backends::BackendEntry{
    .name = "Test-Unavailable",
    .capabilities = silu_bf16_only,
    .unavailable_reason = [] { return std::string("no CUDA device visible (test)"); },
    .create = [](const MoeConfig&, EpGroup*, std::shared_ptr<MoeWorkspace>) -> std::unique_ptr<MoeBackend> { return nullptr; },
});
MEGAMOE_REGISTER_BACKEND(backends::BackendEntry{
    .name = "test_limited",
    .capabilities = silu_bf16_only,
    .unavailable_reason = nullptr,
    .create = [](const MoeConfig&, EpGroup*, std::shared_ptr<MoeWorkspace>) -> std::unique_ptr<MoeBackend> { return nullptr; },
});

MoeConfig small_config() {
  MoeConfig c;
  c.hidden = 128;
  c.intermediate = 128;
  c.num_experts = 4;
  c.top_k = 2;
  c.max_tokens_per_rank = 8;
  return c;
}

}  // namespace

TEST(BackendRegistry, NormalisesNamesAndAliases) {
  EXPECT_EQ(normalize_backend_name("Reference"), "reference");
  EXPECT_EQ(normalize_backend_name("REF"), "reference");
  EXPECT_EQ(normalize_backend_name("cpu"), "reference");
  EXPECT_EQ(normalize_backend_name("Reference-FP32"), "reference_fp32");
  EXPECT_EQ(normalize_backend_name("unfused"), "staged");
  EXPECT_EQ(normalize_backend_name("Staged"), "staged");
  EXPECT_EQ(normalize_backend_name("MegaMoE"), "mega");
  EXPECT_EQ(normalize_backend_name("fused"), "mega");
}

TEST(BackendRegistry, ListsSelfRegisteredBackends) {
  const std::vector<std::string> names = backend_names();
  for (const char* want : {"reference", "reference_fp32", "test_unavailable", "test_limited"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  auto backend = make_backend("CPU", small_config(), nullptr);
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->name(), "reference");
  EXPECT_EQ(backend->num_local_experts(), 4);
}

TEST(BackendRegistry, UnknownBackendListsKnownOnesAndWhy) {
  const std::string what = error_of([] { make_backend("warp9", small_config(), nullptr); });
  EXPECT_NE(what.find("'warp9' is unknown"), std::string::npos) << what;
  EXPECT_NE(what.find("reference (available)"), std::string::npos) << what;
  EXPECT_NE(what.find("test_unavailable (unavailable: no CUDA device visible (test))"), std::string::npos) << what;
#ifndef MEGAMOE_WITH_CUDA
  EXPECT_NE(what.find("staged (not built"), std::string::npos) << what;
  EXPECT_NE(what.find("mega (not built"), std::string::npos) << what;
  const std::string staged = error_of([] { make_backend("unfused", small_config(), nullptr); });
  EXPECT_NE(staged.find("backend 'unfused' is not built"), std::string::npos) << staged;
#endif
}

TEST(BackendRegistry, UnavailableAndIncapableBackendsSayWhy) {
  const std::string unavailable = error_of([] { make_backend("test-unavailable", small_config(), nullptr); });
  EXPECT_NE(unavailable.find("unavailable: no CUDA device visible (test)"), std::string::npos) << unavailable;
  MoeConfig c = small_config();
  c.activation.kind = Activation::Kind::kSwigluClamped;
  c.weight_format = WeightFormat::kMxfp4;
  c.apply_topk_in_fc1 = true;
  const std::string incapable = error_of([&] { make_backend("test_limited", c, nullptr); });
  EXPECT_NE(incapable.find("weight_format mxfp4 is not supported (supported: bf16)"), std::string::npos) << incapable;
  EXPECT_NE(incapable.find("activation swiglu_clamped is not supported (supported: silu)"), std::string::npos)
      << incapable;
  EXPECT_NE(incapable.find("apply_topk_in_fc1 is not supported"), std::string::npos) << incapable;
  // The configuration itself is validated before any backend sees it.
  c = small_config();
  c.top_k = 0;
  const std::string invalid = error_of([&] { make_backend("reference", c, nullptr); });
  EXPECT_NE(invalid.find("top_k = 0"), std::string::npos) << invalid;
}

TEST(BackendRegistry, RejectReasonChecksRanks) {
  Capabilities caps = silu_bf16_only();
  caps.min_ranks = 1;
  caps.max_ranks = 8;
  MoeConfig c = small_config();
  EXPECT_EQ(caps.reject_reason(c, 2), "");
  EXPECT_NE(caps.reject_reason(c, 3).find("num_experts = 4 must be divisible by ranks = 3"), std::string::npos);
  EXPECT_NE(caps.reject_reason(c, 9).find("ranks = 9 must be in [1, 8]"), std::string::npos);
  c.shared_intermediate = 128;
  caps.supports_shared_expert = false;
  EXPECT_NE(caps.reject_reason(c, 1).find("shared expert"), std::string::npos);
}
