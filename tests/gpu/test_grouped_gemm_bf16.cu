// BF16 x BF16 grouped GEMMs (src/kernels/grouped_gemm.h, sm90_bf16_grouped_gemm.cuh) against an fp64
// CPU reference on the same bf16 operands, rounded where docs/reference.md rounds (GEMM outputs to
// fp32, activation in fp32, result to BF16). `--gtest_filter=*Bf16*` selects these tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_skip.h"
#include "common/scoped_overrides.h"
#include "gpu/fp8_test_util.h"
#include "kernels/grouped_gemm.h"
#include "megamoe/error.h"
#include "megamoe/poison.h"

namespace megamoe {
namespace {

using testing::bf16_decode;
using testing::bf16_round;
using testing::DeviceBuffer;
using testing::ScopedEnv;

constexpr int kLeadingPadRows = 5, kTrailingPadRows = 7;

// Rows of all experts, contiguous, between poisoned padding rows that belong to no expert.
struct Bf16Problem {
  int experts = 0, n = 0, k = 0;
  std::vector<int32_t> offsets;  // [E+1]
  int64_t capacity = 0;
  std::vector<uint16_t> a;       // [capacity, k] bf16
  std::vector<uint16_t> w;       // canonical [E, n, k] bf16
};

// exact: a = i/4, w = j/64 with i, j in [-4, 4]: every product is a multiple of 2^-8 and every partial
// sum (|sum| < 2^16 here) is exact in FP32, so whatever the accumulation order, GEMM outputs are exact.
Bf16Problem make_problem(const std::vector<int>& counts, int n, int k, uint64_t seed, bool exact,
                         float a_std = 1.0f) {
  Bf16Problem p;
  p.experts = static_cast<int>(counts.size());
  p.n = n;
  p.k = k;
  p.offsets.push_back(kLeadingPadRows);
  for (int c : counts) p.offsets.push_back(p.offsets.back() + c);
  p.capacity = p.offsets.back() + kTrailingPadRows;
  p.a.resize(p.capacity * k);
  p.w.resize(static_cast<size_t>(p.experts) * n * k);
  std::mt19937_64 rng(seed);
  if (exact) {
    std::uniform_int_distribution<int> value(-4, 4);
    for (auto& x : p.a) x = bf16_round(value(rng) / 4.0f);
    for (auto& x : p.w) x = bf16_round(value(rng) / 64.0f);
    return p;
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float w_std = 1.0f / std::sqrt(static_cast<float>(k));
  for (auto& x : p.a) x = bf16_round(normal(rng) * a_std);
  for (auto& x : p.w) x = bf16_round(normal(rng) * w_std);
  return p;
}

// fp64 sum and sum of |terms| of row r of A times canonical weight row `wrow` of expert e.
void reference_dot(const Bf16Problem& p, int e, int64_t r, int wrow, double* value, double* magnitude) {
  const uint16_t* a = &p.a[r * p.k];
  const uint16_t* w = &p.w[(static_cast<size_t>(e) * p.n + wrow) * p.k];
  double sum = 0, abs_sum = 0;
  for (int i = 0; i < p.k; ++i) {
    const double product = static_cast<double>(bf16_decode(a[i])) * bf16_decode(w[i]);
    sum += product;
    abs_sum += std::fabs(product);
  }
  *value = sum;
  *magnitude = abs_sum;
}

int expert_of_row(const Bf16Problem& p, int64_t r) {
  for (int e = 0; e < p.experts; ++e)
    if (r >= p.offsets[e] && r < p.offsets[e + 1]) return e;
  return -1;
}

std::string describe(const Bf16Problem& p, uint64_t seed) {
  std::string text = "seed " + std::to_string(seed) + " n " + std::to_string(p.n) + " k " + std::to_string(p.k) +
                     " offsets";
  for (int o : p.offsets) text += " " + std::to_string(o);
  return text;
}

// Bound on |fp32 tensor-core sum - exact sum|: 2^-12 of the sum of |terms| (K/16 chained wgmma
// accumulations with at most ~2^-22 relative error each, for K <= 7168, with margin).
double accumulation_error(double magnitude) { return std::ldexp(magnitude, -12); }

// Equal BF16 values: identical bits, or +0 and -0 (an exact zero sum may come out of the tensor core
// with either sign; the reference's fp64 sum gives +0).
bool same_bf16_value(uint16_t a, uint16_t b) { return a == b || ((a | b) & 0x7FFF) == 0; }

enum class Entry { kPlain, kGemm2 };

// v2: GroupedGemm*Bf16Args::v2 (-1 default, 0 v1 tiles, 1 BF16 v2). Returns the output bits.
std::vector<uint16_t> run_plain(const std::vector<int>& counts, int n, int k, uint64_t seed, int rows_hint, bool exact,
                                Entry entry = Entry::kPlain, int v2 = -1) {
  const Bf16Problem p = make_problem(counts, n, k, seed, exact);
  SCOPED_TRACE(describe(p, seed) + " hint " + std::to_string(rows_hint) + " v2 " + std::to_string(v2));
  DeviceBuffer a(p.a), w(p.w), offsets(p.offsets);
  DeviceBuffer out(p.capacity * n * sizeof(uint16_t));
  poison_device_buffer(out.data, out.bytes);
  if (entry == Entry::kPlain) {
    kernels::GroupedGemmBf16Args args;
    args.a = a.as<uint16_t>();
    args.weights = w.as<uint16_t>();
    args.expert_offsets = offsets.as<int32_t>();
    args.out = out.as<uint16_t>();
    args.m_capacity = p.capacity;
    args.num_experts = p.experts;
    args.n = n;
    args.k = k;
    args.rows_per_expert_hint = rows_hint;
    args.v2 = v2;
    kernels::grouped_gemm_bf16(args, nullptr);
  } else {
    kernels::GroupedGemm2Bf16Args args;
    args.a = a.as<uint16_t>();
    args.weights = w.as<uint16_t>();
    args.expert_offsets = offsets.as<int32_t>();
    args.out = out.as<uint16_t>();
    args.m_capacity = p.capacity;
    args.num_experts = p.experts;
    args.hidden = n;
    args.intermediate = k;
    args.rows_per_expert_hint = rows_hint;
    args.v2 = v2;
    kernels::grouped_gemm2_bf16(args, nullptr);
  }
  MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
  const auto result = out.download<uint16_t>();

  double error_sq = 0, ref_sq = 0;
  int64_t bad = 0, mismatched_bits = 0;
  for (int64_t r = 0; r < p.capacity; ++r) {
    const int e = expert_of_row(p, r);
    for (int c = 0; c < n; ++c) {
      const uint16_t got_bits = result[r * n + c];
      if (e < 0) {  // rows of no expert stay poisoned
        if (got_bits != 0xFFFF && bad++ < 5) ADD_FAILURE() << "row " << r << " of no expert was written";
        continue;
      }
      double ref, magnitude;
      reference_dot(p, e, r, c, &ref, &magnitude);
      const float got = bf16_decode(got_bits);
      if (!std::isfinite(got)) {
        if (bad++ < 5) ADD_FAILURE() << "non-finite out[" << r << ", " << c << "]";
        continue;
      }
      const uint16_t ref_bits = bf16_round(static_cast<float>(ref));  // GEMM output fp32, then BF16 RNE
      if (exact) {
        if (!same_bf16_value(got_bits, ref_bits) && mismatched_bits++ < 5)
          ADD_FAILURE() << "out[" << r << ", " << c << "] = " << got << " != bf16(" << ref << ")";
        continue;
      }
      const double rounded = bf16_decode(ref_bits);
      error_sq += (got - rounded) * (got - rounded);
      ref_sq += rounded * rounded;
      // BF16 rounding (<= 2^-9 relative, doubled for margin) + FP32 accumulation-order error.
      const double bound = std::ldexp(std::fabs(ref), -8) + accumulation_error(magnitude) + 1e-30;
      if (std::fabs(got - ref) > bound && bad++ < 5)
        ADD_FAILURE() << "out[" << r << ", " << c << "] = " << got << " ref " << ref << " bound " << bound;
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(mismatched_bits, 0);
  if (!exact) {
    const double rel_l2 = std::sqrt(error_sq / ref_sq);
    EXPECT_LT(rel_l2, 2e-3);
    std::printf("bf16 grouped GEMM n=%d k=%d hint=%d v2=%d rel-L2 %.3g\n", n, k, rows_hint, v2, rel_l2);
  }
  return result;
}

TEST(GroupedGemmBf16, PlainSplitMRandomShapes) {
  MEGAMOE_REQUIRE_GPUS(1);
  run_plain({0, 1, 130, 63, 200, 64, 129}, 384, 512, 4234, 0, false);    // 256 x 128 tiles
  run_plain({0, 1, 130, 63, 200, 64, 129}, 384, 512, 4235, 200, false);  // 128 x 128 tiles
}

TEST(GroupedGemmBf16, PlainSplitNSmallGroups) {
  MEGAMOE_REQUIRE_GPUS(1);
  run_plain({8, 0, 1, 17, 64, 33}, 512, 384, 4099, 16, false);  // 64 x 256 tiles
}

TEST(GroupedGemmBf16, PlainDeepK) {
  MEGAMOE_REQUIRE_GPUS(1);
  run_plain({100, 0, 129}, 256, 7168, 4007, 0, false);
}

TEST(GroupedGemmBf16, Gemm2Entry) {
  MEGAMOE_REQUIRE_GPUS(1);
  run_plain({3, 70, 0, 1}, 256, 384, 4011, 0, false, Entry::kGemm2);
}

TEST(GroupedGemmBf16, PlainBitExactSmallValues) {
  MEGAMOE_REQUIRE_GPUS(1);
  run_plain({3, 0, 128, 77}, 256, 1024, 4005, 0, true);
  run_plain({3, 0, 128, 77}, 256, 1024, 4006, 8, true);
  run_plain({3, 0, 128, 77}, 256, 1024, 4008, 128, true);
}

// ---- BF16 v2 (docs/grouped_gemm.md "BF16 v2") ------------------------------------------------------
// Every v2 plain path against the fp64 reference, then bit for bit against v1 on the same problem (same
// FP32 tensor-core sums per element in the same K order; wgmma m64n256 vs m64n128 is asserted, not
// assumed, to give identical per-element results).
void expect_v2_plain_matches_v1(const std::vector<int>& counts, int n, int k, uint64_t seed, int rows_hint, bool exact,
                                Entry entry = Entry::kPlain) {
  const auto v2 = run_plain(counts, n, k, seed, rows_hint, exact, entry, 1);
  const auto v1 = run_plain(counts, n, k, seed, rows_hint, exact, entry, 0);
  ASSERT_EQ(v2.size(), v1.size());
  int64_t differing = 0;
  for (size_t i = 0; i < v1.size(); ++i)
    if (v1[i] != v2[i] && differing++ < 5)
      ADD_FAILURE() << "v2 out[" << i / n << ", " << i % n << "] bits " << v2[i] << " != v1 " << v1[i];
  EXPECT_EQ(differing, 0) << "seed " << seed << " n " << n << " k " << k << " hint " << rows_hint;
}

TEST(GroupedGemmBf16, V2PlainWideTileRandomShapes) {  // 128 x 256 wide tile (wgmma m64n256k16)
  MEGAMOE_REQUIRE_GPUS(1);
  expect_v2_plain_matches_v1({0, 1, 130, 63, 64, 65, 200, 129, 127, 256}, 512, 512, 4301, 0, false);
  expect_v2_plain_matches_v1({0, 1, 130, 63, 64, 65, 200, 129, 127, 256}, 768, 384, 4302, 1024, false);
  expect_v2_plain_matches_v1({65, 0, 1, 300}, 256, 256, 4303, 200, false, Entry::kGemm2);
}

TEST(GroupedGemmBf16, V2PlainSmallGroupsAndOddN) {  // 64 x 256 split-N bulk; 128 x 128 bulk (n % 256 = 128)
  MEGAMOE_REQUIRE_GPUS(1);
  expect_v2_plain_matches_v1({8, 0, 1, 17, 64, 33}, 512, 384, 4304, 16, false);
  expect_v2_plain_matches_v1({0, 1, 130, 63, 65, 200}, 384, 512, 4305, 0, false);
}

TEST(GroupedGemmBf16, V2PlainDeepK) {
  MEGAMOE_REQUIRE_GPUS(1);
  expect_v2_plain_matches_v1({100, 0, 129, 1}, 256, 7168, 4306, 0, false);
}

TEST(GroupedGemmBf16, V2PlainBitExactSmallValues) {
  MEGAMOE_REQUIRE_GPUS(1);
  expect_v2_plain_matches_v1({3, 0, 128, 77, 64, 65}, 512, 1024, 4307, 0, true);
  expect_v2_plain_matches_v1({3, 0, 128, 77}, 256, 1024, 4308, 8, true);
}

// The environment variable decides v2 = -1; a bad value is an error naming it.
TEST(GroupedGemmBf16, V2EnvironmentVariable) {
  MEGAMOE_REQUIRE_GPUS(1);
  ASSERT_EQ(setenv("MEGAMOE_BF16_GEMM_V2", "1", 1), 0);
  EXPECT_TRUE(kernels::bf16_gemm_v2_default());
  const auto forced_v2 = run_plain({70, 0, 1}, 256, 256, 4309, 0, false, Entry::kPlain, -1);
  ASSERT_EQ(setenv("MEGAMOE_BF16_GEMM_V2", "0", 1), 0);
  EXPECT_FALSE(kernels::bf16_gemm_v2_default());
  const auto forced_v1 = run_plain({70, 0, 1}, 256, 256, 4309, 0, false, Entry::kPlain, -1);
  EXPECT_EQ(forced_v2, forced_v1);
  ASSERT_EQ(setenv("MEGAMOE_BF16_GEMM_V2", "yes", 1), 0);
  try {
    (void)kernels::bf16_gemm_v2_default();
    ADD_FAILURE() << "MEGAMOE_BF16_GEMM_V2=yes accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("MEGAMOE_BF16_GEMM_V2 = 'yes' must be 0 or 1"), std::string::npos)
        << error.what();
  }
  unsetenv("MEGAMOE_BF16_GEMM_V2");
}

// docs/reference.md step 4 in fp32, in the reference's order.
float reference_activation(float gate, float up, const Activation& act) {
  if (act.kind == Activation::Kind::kSiluMul) return (gate / (1.0f + std::exp(-gate))) * up;
  const float g = std::fmin(gate, act.limit);
  const float u = std::fmin(std::fmax(up, -act.limit), act.limit);
  return (g * (1.0f / (1.0f + std::exp(-(act.alpha * g))))) * (u + 1.0f);
}

// packing: kGateUp (the split-N kernel) or kGateUpInterleaved8 (BF16 v2). Returns the output bits.
std::vector<uint16_t> run_gemm1(const std::vector<int>& counts, int hidden, int intermediate, uint64_t seed,
                                const Activation& act, bool use_topk, bool exact, int rows_hint,
                                kernels::GemmRole packing = kernels::GemmRole::kGateUp) {
  const float a_std = act.kind == Activation::Kind::kSwigluClamped ? 6.0f : 1.0f;  // make the clamp bite
  const Bf16Problem p = make_problem(counts, 2 * intermediate, hidden, seed, exact, a_std);
  const bool v2 = packing == kernels::GemmRole::kGateUpInterleaved8;
  SCOPED_TRACE(describe(p, seed) + " hint " + std::to_string(rows_hint) + (v2 ? " v2 (interleaved8)" : ""));
  std::vector<float> topk(p.capacity);
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  for (auto& t : topk) t = weight(rng);
  // Pack each expert into the kernel layout through the public transform.
  const auto size = kernels::packed_weight_bytes(WeightFormat::kBf16, 2 * intermediate, hidden);
  EXPECT_EQ(size.scale_count, 0u);
  std::vector<uint8_t> packed(size.data_bytes * p.experts);
  const auto* canonical_bytes = reinterpret_cast<const uint8_t*>(p.w.data());
  for (int e = 0; e < p.experts; ++e) {
    formats::QuantizedMatrix m;
    m.format = WeightFormat::kBf16;
    m.rows = 2 * intermediate;
    m.cols = hidden;
    m.data.assign(canonical_bytes + e * size.data_bytes, canonical_bytes + (e + 1) * size.data_bytes);
    kernels::pack_expert_weights(m, packing, packed.data() + e * size.data_bytes, nullptr);
  }
  DeviceBuffer a(p.a), w(packed), offsets(p.offsets), topk_d(topk);
  DeviceBuffer out(p.capacity * intermediate * sizeof(uint16_t));
  poison_device_buffer(out.data, out.bytes);
  kernels::GroupedGemm1Bf16Args args;
  args.a = a.as<uint16_t>();
  args.weights = w.as<uint16_t>();
  args.expert_offsets = offsets.as<int32_t>();
  args.topk_weights = use_topk ? topk_d.as<float>() : nullptr;
  args.out = out.as<uint16_t>();
  args.m_capacity = p.capacity;
  args.num_experts = p.experts;
  args.hidden = hidden;
  args.intermediate = intermediate;
  args.activation = act;
  args.rows_per_expert_hint = rows_hint;
  args.packing = packing;
  kernels::grouped_gemm1_bf16(args, nullptr);
  MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
  const auto result = out.download<uint16_t>();

  const double alpha = act.kind == Activation::Kind::kSiluMul ? 1.0 : act.alpha;
  double error_sq = 0, ref_sq = 0;
  int64_t bad = 0, flips = 0, values = 0, clamped = 0;
  for (int64_t r = 0; r < p.capacity; ++r) {
    const int e = expert_of_row(p, r);
    for (int c = 0; c < intermediate; ++c) {
      const uint16_t got_bits = result[r * intermediate + c];
      if (e < 0) {
        if (got_bits != 0xFFFF && bad++ < 5) ADD_FAILURE() << "row " << r << " of no expert was written";
        continue;
      }
      double gate, up, gate_magnitude, up_magnitude;
      reference_dot(p, e, r, c, &gate, &gate_magnitude);
      reference_dot(p, e, r, intermediate + c, &up, &up_magnitude);
      if (act.kind == Activation::Kind::kSwigluClamped && (gate > act.limit || std::fabs(up) > act.limit)) ++clamped;
      const float w_row = use_topk ? topk[r] : 1.0f;
      float h = reference_activation(static_cast<float>(gate), static_cast<float>(up), act);
      if (use_topk) h = h * w_row;
      const uint16_t ref_bits = bf16_round(h);
      const float got = bf16_decode(got_bits);
      ++values;
      if (!std::isfinite(got)) {
        if (bad++ < 5) ADD_FAILURE() << "non-finite out[" << r << ", " << c << "]";
        continue;
      }
      if (!same_bf16_value(got_bits, ref_bits)) ++flips;
      // h's error from the GEMM accumulation through the activation (|d act/d gate| <= (1 + alpha|g|/4)
      // (|u| + 1), |d act/d up| <= |g|), zero for exact inputs; plus BF16 rounding and expf ulps.
      const double gate_error = exact ? 0.0 : accumulation_error(gate_magnitude);
      const double up_error = exact ? 0.0 : accumulation_error(up_magnitude);
      const double h_error = w_row * ((1.0 + alpha * std::fabs(gate) / 4) * (std::fabs(up) + 1.0) * gate_error +
                                      (std::fabs(gate) + gate_error) * up_error);
      const double bound = std::ldexp(std::fabs(h), -8) + std::ldexp(std::fabs(h), -16) + h_error + 1e-30;
      if (std::fabs(got - h) > bound && bad++ < 5)
        ADD_FAILURE() << "out[" << r << ", " << c << "] = " << got << " ref " << h << " (gate " << gate << ", up "
                      << up << ") bound " << bound;
      const double rounded = bf16_decode(ref_bits);
      error_sq += (got - rounded) * (got - rounded);
      ref_sq += rounded * rounded;
    }
  }
  EXPECT_EQ(bad, 0);
  const double rel_l2 = std::sqrt(error_sq / ref_sq);
  EXPECT_LT(rel_l2, 2e-3);
  std::printf("bf16 gemm1%s %s topk=%d exact=%d hint=%d: rel-L2 %.3g, bf16 flips %lld / %lld, clamped %lld\n",
              v2 ? " v2" : "", act.kind == Activation::Kind::kSiluMul ? "silu" : "swiglu_clamped", use_topk, exact, rows_hint,
              rel_l2, static_cast<long long>(flips), static_cast<long long>(values), static_cast<long long>(clamped));
  // Exact inputs: gate and up are exact, so only expf's ulps (CUDA vs host libm) can flip a BF16
  // rounding, and only next to a rounding midpoint.
  if (exact) EXPECT_LE(flips, values / 1000);
  if (act.kind == Activation::Kind::kSwigluClamped) EXPECT_GT(clamped, 0) << "the clamp was never exercised";
  return result;
}

TEST(GroupedGemmBf16, Gemm1ExactInputsMatchReference) {
  MEGAMOE_REQUIRE_GPUS(1);
  run_gemm1({0, 1, 70, 63, 130}, 512, 256, 4031, Activation{}, true, true, 0);  // 128 x 256 tiles
  run_gemm1({0, 1, 70, 63, 130}, 512, 256, 4032, Activation{}, true, true, 8);  //  64 x 256 tiles
}

TEST(GroupedGemmBf16, Gemm1SiluTopk) {
  MEGAMOE_REQUIRE_GPUS(1);
  run_gemm1({0, 1, 70, 63, 65, 130}, 512, 256, 4021, Activation{}, true, false, 0);
  run_gemm1({0, 1, 70, 63, 65, 130}, 512, 256, 4024, Activation{}, true, false, 16);
}

TEST(GroupedGemmBf16, Gemm1SwigluClampedNoTopk) {
  MEGAMOE_REQUIRE_GPUS(1);
  const Activation act{Activation::Kind::kSwigluClamped, 7.0f, 1.702f};
  run_gemm1({5, 0, 129, 1}, 384, 384, 4022, act, false, false, 0);
}

TEST(GroupedGemmBf16, Gemm1DeepHidden) {
  MEGAMOE_REQUIRE_GPUS(1);
  run_gemm1({33, 0, 80}, 7168, 256, 4023, Activation{}, true, false, 0);
}

// BF16 v2 GEMM 1 (weights packed kGateUpInterleaved8, the wide kernel with the in-thread SwiGLU
// epilogue) against the reference, then bit for bit against the split-N kernel on kGateUp weights.
void expect_v2_gemm1_matches_v1(const std::vector<int>& counts, int hidden, int intermediate, uint64_t seed,
                                const Activation& act, bool use_topk, bool exact, int rows_hint) {
  const auto v2 = run_gemm1(counts, hidden, intermediate, seed, act, use_topk, exact, rows_hint,
                            kernels::GemmRole::kGateUpInterleaved8);
  const auto v1 = run_gemm1(counts, hidden, intermediate, seed, act, use_topk, exact, rows_hint, kernels::GemmRole::kGateUp);
  ASSERT_EQ(v2.size(), v1.size());
  int64_t differing = 0;
  for (size_t i = 0; i < v1.size(); ++i)
    if (v1[i] != v2[i] && differing++ < 5)
      ADD_FAILURE() << "v2 out[" << i / intermediate << ", " << i % intermediate << "] bits " << v2[i] << " != v1 "
                    << v1[i];
  EXPECT_EQ(differing, 0) << "seed " << seed << " hidden " << hidden << " intermediate " << intermediate;
}

TEST(GroupedGemmBf16, V2Gemm1ExactInputs) {
  MEGAMOE_REQUIRE_GPUS(1);
  expect_v2_gemm1_matches_v1({0, 1, 70, 63, 64, 65, 130}, 512, 256, 4331, Activation{}, true, true, 0);
  expect_v2_gemm1_matches_v1({0, 1, 70, 63, 130}, 512, 384, 4332, Activation{}, false, true, 8);
}

TEST(GroupedGemmBf16, V2Gemm1SiluTopk) {
  MEGAMOE_REQUIRE_GPUS(1);
  expect_v2_gemm1_matches_v1({0, 1, 70, 63, 65, 130, 127}, 512, 256, 4333, Activation{}, true, false, 0);
  expect_v2_gemm1_matches_v1({0, 1, 70, 63, 65, 130}, 384, 512, 4334, Activation{}, true, false, 16);
}

TEST(GroupedGemmBf16, V2Gemm1SwigluClamped) {
  MEGAMOE_REQUIRE_GPUS(1);
  const Activation act{Activation::Kind::kSwigluClamped, 7.0f, 1.702f};
  expect_v2_gemm1_matches_v1({5, 0, 129, 1, 64}, 384, 384, 4335, act, false, false, 0);
  expect_v2_gemm1_matches_v1({5, 0, 129, 1, 65}, 256, 256, 4336, act, true, false, 0);
}

TEST(GroupedGemmBf16, V2Gemm1DeepHidden) {
  MEGAMOE_REQUIRE_GPUS(1);
  expect_v2_gemm1_matches_v1({33, 0, 80, 200}, 7168, 256, 4337, Activation{}, true, false, 0);
}

// ---- BF16 clusters (MEGAMOE_BF16_CLUSTER; docs/grouped_gemm.md "BF16 clusters") --------------------------
// ScopedEnv (common/scoped_overrides.h): the suite also runs with MEGAMOE_BF16_CLUSTER=1 in the environment
// (scripts/gpu_bf16_cluster.sh), which these tests must leave as found.

void expect_same_bits(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, int cols,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int64_t differing = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (want[i] != got[i] && differing++ < 5)
      ADD_FAILURE() << what << ": cluster out[" << i / cols << ", " << i % cols << "] bits " << got[i]
                    << " != no-cluster " << want[i];
  EXPECT_EQ(differing, 0) << what;
}

// The v2 wide kernel (plain, rows hint 0 -> 128 x 256) with MEGAMOE_BF16_CLUSTER=1 against =0, bit for bit (each
// run also against the fp64 reference inside run_plain).
void expect_plain_cluster_matches(const std::vector<int>& counts, int n, int k, uint64_t seed, bool exact = false) {
  std::vector<uint16_t> clustered, single;
  {
    ScopedEnv cluster("MEGAMOE_BF16_CLUSTER", "1");
    clustered = run_plain(counts, n, k, seed, 0, exact, Entry::kPlain, 1);
  }
  {
    ScopedEnv cluster("MEGAMOE_BF16_CLUSTER", "0");
    single = run_plain(counts, n, k, seed, 0, exact, Entry::kPlain, 1);
  }
  expect_same_bits(clustered, single, n, "plain n " + std::to_string(n) + " k " + std::to_string(k) + " seed " +
                                             std::to_string(seed));
}

// The v2 GEMM 1 (kGateUpInterleaved8 weights) with MEGAMOE_BF16_CLUSTER=1 against =0, bit for bit.
void expect_gemm1_cluster_matches(const std::vector<int>& counts, int hidden, int intermediate, uint64_t seed,
                                  const Activation& act, bool use_topk) {
  std::vector<uint16_t> clustered, single;
  {
    ScopedEnv cluster("MEGAMOE_BF16_CLUSTER", "1");
    clustered = run_gemm1(counts, hidden, intermediate, seed, act, use_topk, false, 0,
                          kernels::GemmRole::kGateUpInterleaved8);
  }
  {
    ScopedEnv cluster("MEGAMOE_BF16_CLUSTER", "0");
    single = run_gemm1(counts, hidden, intermediate, seed, act, use_topk, false, 0,
                       kernels::GemmRole::kGateUpInterleaved8);
  }
  expect_same_bits(clustered, single, intermediate,
                   "gemm1 hidden " + std::to_string(hidden) + " intermediate " + std::to_string(intermediate) +
                       " seed " + std::to_string(seed));
}

// Schedule corners of the cluster-of-2 units (locate_cluster_tile): one expert of 1 m-tile (a lone unit; at 1
// n-tile CTA 1 has no tile), one of 3 (a pair + lone units), experts of 0 / 1 / 129 / 256 / 257 / 640 / 383 rows
// (0, 1, 2, 2, 3, 5, 0, 3 m-tiles), n-tile counts 1, 2, 3, 7; then many units per cluster.
TEST(GroupedGemmBf16, V2ClusterMatchesNoCluster) {
  MEGAMOE_REQUIRE_GPUS(1);
  expect_plain_cluster_matches({77}, 256, 512, 4351);                      // 1 m-tile, 1 n-tile
  expect_plain_cluster_matches({77}, 768, 256, 4352);                      // 1 m-tile, 3 n-tiles
  expect_plain_cluster_matches({300}, 512, 1024, 4353);                    // 3 m-tiles, 2 n-tiles
  expect_plain_cluster_matches({0, 1, 129, 256, 257, 640, 0, 383}, 768, 512, 4354);
  expect_plain_cluster_matches({0, 1, 129, 256, 257, 640, 0, 383}, 256, 256, 4355);
  expect_plain_cluster_matches({3, 0, 128, 77, 64, 65}, 512, 1024, 4356, true);  // exact inputs
  // Many units per cluster: 32 experts of 0..400 rows (~50 m-tiles, pairs and lone units) at 7 n-tiles.
  std::vector<int> counts;
  std::mt19937_64 rng(4357);
  std::uniform_int_distribution<int> rows(0, 400);
  for (int i = 0; i < 32; ++i) counts.push_back(rows(rng));
  expect_plain_cluster_matches(counts, 1792, 128, 4357);
  // The GEMM-2 entry point takes the same kernel.
  {
    ScopedEnv cluster("MEGAMOE_BF16_CLUSTER", "1");
    const auto clustered = run_plain({65, 0, 1, 300}, 768, 256, 4358, 200, false, Entry::kGemm2, 1);
    ScopedEnv off("MEGAMOE_BF16_CLUSTER", "0");
    const auto single = run_plain({65, 0, 1, 300}, 768, 256, 4358, 200, false, Entry::kGemm2, 1);
    expect_same_bits(clustered, single, 768, "gemm2 entry");
  }
}

TEST(GroupedGemmBf16, V2Gemm1ClusterMatchesNoCluster) {
  MEGAMOE_REQUIRE_GPUS(1);
  const Activation clamped{Activation::Kind::kSwigluClamped, 7.0f, 1.702f};
  expect_gemm1_cluster_matches({77}, 512, 128, 4361, Activation{}, true);   // 1 m-tile, 1 n-tile (n 256)
  expect_gemm1_cluster_matches({300}, 512, 384, 4362, Activation{}, true);  // 3 m-tiles, 3 n-tiles
  expect_gemm1_cluster_matches({0, 1, 129, 256, 257, 640, 0, 383}, 512, 256, 4363, Activation{}, false);
  expect_gemm1_cluster_matches({5, 0, 129, 1, 65, 383}, 384, 384, 4364, clamped, true);
  expect_gemm1_cluster_matches({33, 0, 80, 200}, 7168, 256, 4365, Activation{}, true);  // deep K
}

// A small v2 case of each kernel for compute-sanitizer (scripts/gpu_bf16_v2.sh).
TEST(GroupedGemmBf16, V2SanitizerSmall) {
  MEGAMOE_REQUIRE_GPUS(1);
  run_plain({0, 1, 65, 130}, 256, 256, 4341, 0, false, Entry::kPlain, 1);
  run_plain({0, 1, 17}, 256, 256, 4342, 16, false, Entry::kPlain, 1);
  run_gemm1({0, 1, 65, 130}, 256, 256, 4343, Activation{}, true, false, 0, kernels::GemmRole::kGateUpInterleaved8);
}

TEST(GroupedGemmBf16, RejectsBadShapesAndPointers) {
  auto expect_error = [](auto call, const std::string& needle) {
    try {
      call();
      ADD_FAILURE() << "accepted; expected an error mentioning '" << needle << "'";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
    }
  };
  kernels::GroupedGemm2Bf16Args g2;
  g2.m_capacity = 16;
  g2.num_experts = 2;
  g2.hidden = 100;
  g2.intermediate = 256;
  expect_error([&] { kernels::grouped_gemm2_bf16(g2, nullptr); }, "hidden = 100");
  g2.hidden = 256;
  expect_error([&] { kernels::grouped_gemm2_bf16(g2, nullptr); }, "a must be non-null");
  kernels::GroupedGemm1Bf16Args g1;
  g1.m_capacity = 16;
  g1.num_experts = 2;
  g1.hidden = 256;
  g1.intermediate = 192;
  expect_error([&] { kernels::grouped_gemm1_bf16(g1, nullptr); }, "intermediate = 192");
  g1.intermediate = 256;
  g1.num_experts = 0;
  expect_error([&] { kernels::grouped_gemm1_bf16(g1, nullptr); }, "num_experts = 0");
  // GEMM-1 weights must be packed kGateUp or kGateUpInterleaved8 (BF16 v2); v2 must be -1, 0 or 1.
  // (Host pointers: the checks run before anything touches the device, so this needs no GPU.)
  alignas(16) static uint16_t dummy[64];
  alignas(16) static int32_t offsets[4];
  g1.num_experts = 2;
  g1.a = g1.weights = g1.out = dummy;
  g1.expert_offsets = offsets;
  g1.packing = kernels::GemmRole::kDown;
  expect_error([&] { kernels::grouped_gemm1_bf16(g1, nullptr); }, "must be kGateUp or kGateUpInterleaved8");
  g2.a = g2.weights = g2.out = dummy;
  g2.expert_offsets = offsets;
  g2.v2 = 2;
  expect_error([&] { kernels::grouped_gemm2_bf16(g2, nullptr); }, "v2 = 2 must be -1 (default), 0 or 1");
}

}  // namespace
}  // namespace megamoe
