// Pass 2 of the two-pass FP8 GEMM 1 (kernels/swiglu_quant.h) against a host reference: BF16 gate/up -> the
// activation in FP32 in the kernel's order -> the top-k weight -> formats::quantize_fp8_activations (the formats
// rule), so codes and scales must match bit for bit.
// NOTES: the one piece the host takes from the device is expf: CUDA's expf is within 2 ulp but not correctly
// rounded, so a host expf would move some h by an ulp (and with it the amax of its block, i.e. the scale). The
// test evaluates expf on the device for exactly the arguments the kernel forms (-g; -alpha * min(g, limit)) and
// does everything else on the host. (The device folds `1 + expf(x)` into fma(2^n, p, 1); 2^n * p is exact unless
// subnormal, where 1 + it rounds to 1 either way, so host 1 + e is the same value.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_skip.h"
#include "gpu/fp8_test_util.h"
#include "kernels/swiglu_quant.h"
#include "megamoe/error.h"
#include "megamoe/formats.h"
#include "megamoe/poison.h"

namespace megamoe {
namespace {

using testing::bf16_decode;
using testing::bf16_round;
using testing::DeviceBuffer;

__global__ void device_expf(const float* x, float* y, int64_t count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) y[i] = expf(x[i]);
}

std::vector<float> expf_on_device(const std::vector<float>& x) {
  if (x.empty()) return {};
  DeviceBuffer x_d(x), y_d(x.size() * sizeof(float));
  const int64_t count = static_cast<int64_t>(x.size());
  device_expf<<<static_cast<unsigned>((count + 255) / 256), 256>>>(x_d.as<float>(), y_d.as<float>(), count);
  MEGAMOE_CUDA_CHECK(cudaGetLastError());
  MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
  return y_d.download<float>();
}

// Inputs of one pass-2 case: BF16 [capacity, 2I] in the packed gate/up order, offsets [E+1] (offsets[E] may exceed
// capacity: clamped), per-row weights.
struct SwigluCase {
  int intermediate = 0;
  int64_t capacity = 0;
  std::vector<int32_t> offsets;
  std::vector<uint16_t> in;
  std::vector<float> topk;
  int64_t first() const { return std::min<int64_t>(std::max(offsets.front(), 0), capacity); }
  int64_t end() const { return std::min<int64_t>(std::max<int64_t>(offsets.back(), first()), capacity); }
};

// Rows of expert e get values normal * 2^s (s per row in [-6, 4]; clamped: also a x4 so the clamp bites); some
// special rows: all zeros (the amax floor), one with a single huge value, one of +-0 and tiny values. Rows of no
// expert hold BF16 NaN (never read, so never visible).
SwigluCase make_case(const std::vector<int>& counts, int leading, int trailing, int intermediate, uint64_t seed,
                     bool clamped) {
  SwigluCase c;
  c.intermediate = intermediate;
  c.offsets.push_back(leading);
  for (int n : counts) c.offsets.push_back(c.offsets.back() + n);
  c.capacity = c.offsets.back() + trailing;
  const int64_t cols = 2 * static_cast<int64_t>(intermediate);
  c.in.assign(c.capacity * cols, 0x7FC0);  // NaN
  c.topk.resize(c.capacity);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-6, 4);
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  for (auto& t : c.topk) t = weight(rng);
  for (int64_t r = c.offsets.front(); r < c.offsets.back(); ++r) {
    const float scale = std::ldexp(clamped ? 4.0f : 1.0f, exponent(rng));
    const int special = static_cast<int>(r % 11);
    for (int64_t j = 0; j < cols; ++j) {
      float value = normal(rng) * scale;
      if (special == 3) value = 0.0f;                                       // amax floor: scale 1e-10 / 448
      if (special == 5 && j % 256 == 17) value = 3.0e4f;                    // one huge value per block
      if (special == 7) value = j % 3 == 0 ? -0.0f : value * 1e-30f;        // signed zeros, tiny values
      c.in[r * cols + j] = bf16_round(value);
    }
  }
  return c;
}

struct Reference {
  std::vector<uint8_t> codes;  // [capacity, I], 0xFF where not written
  std::vector<float> scales;   // [capacity, I/128], bits 0xFFFFFFFF where not written
};

Reference host_reference(const SwigluCase& c, const Activation& act, bool use_topk) {
  const int I = c.intermediate, groups = I / 128;
  const int64_t cols = 2 * static_cast<int64_t>(I);
  const bool clamped = act.kind == Activation::Kind::kSwigluClamped;
  const int64_t rows = c.end() - c.first();
  std::vector<float> gate(rows * I), up(rows * I), argument(rows * I);
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < I; ++j) {
      const uint16_t* row = &c.in[(c.first() + r) * cols];
      const int column = (j / 128) * 256 + j % 128;  // packed: gate block j/128, then its up block
      float g = bf16_decode(row[column]), u = bf16_decode(row[column + 128]);
      if (clamped) {  // activate(): g = fminf(gate, limit); u = fminf(fmaxf(up, -limit), limit)
        g = std::fmin(g, act.limit);
        u = std::fmin(std::fmax(u, -act.limit), act.limit);
      }
      gate[r * I + j] = g;
      up[r * I + j] = u;
      argument[r * I + j] = clamped ? -act.alpha * g : -g;
    }
  const std::vector<float> e = expf_on_device(argument);
  Reference ref;
  ref.codes.assign(c.capacity * I, 0xFF);
  ref.scales.assign(c.capacity * groups, 0.0f);
  std::memset(ref.scales.data(), 0xFF, ref.scales.size() * sizeof(float));
  std::vector<float> x(128);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = c.first() + r;
    const float w = use_topk ? c.topk[row] : 1.0f;
    for (int b = 0; b < groups; ++b) {
      for (int i = 0; i < 128; ++i) {
        const int64_t at = r * I + b * 128 + i;
        const float g = gate[at], u = up[at];
        // kSiluMul: g / (1 + expf(-g)) * u; kSwigluClamped: g / (1 + expf(-alpha g)) * (u + 1), FP32, this order
        const float h = clamped ? g / (1.0f + e[at]) * (u + 1.0f) : g / (1.0f + e[at]) * u;
        x[i] = h * w;  // the weight multiplies the value; amax |h * w| = fl(amax |h| * |w|) (monotonic rounding)
      }
      const formats::Fp8Activations q = formats::quantize_fp8_activations(x.data(), 1, 128);
      std::memcpy(&ref.codes[row * I + b * 128], q.values.data(), 128);
      ref.scales[row * groups + b] = q.scales[0];
    }
  }
  return ref;
}

void run_case(const SwigluCase& c, const Activation& act, bool use_topk, const std::string& what) {
  const int I = c.intermediate, groups = I / 128;
  SCOPED_TRACE(what + " I " + std::to_string(I) + " capacity " + std::to_string(c.capacity) + " rows [" +
               std::to_string(c.first()) + ", " + std::to_string(c.end()) + ") activation " +
               std::string(activation_name(act.kind)) + " topk " + std::to_string(use_topk));
  DeviceBuffer in(c.in), offsets(c.offsets), topk(c.topk), out(c.capacity * I),
      out_scales(c.capacity * groups * sizeof(float));
  poison_device_buffer(out.data, out.bytes);
  poison_device_buffer(out_scales.data, out_scales.bytes);
  kernels::SwigluQuantFp8Args args;
  args.in = in.as<uint16_t>();
  args.expert_offsets = offsets.as<int32_t>();
  args.topk_weights = use_topk ? topk.as<float>() : nullptr;
  args.out = out.as<uint8_t>();
  args.out_scales = out_scales.as<float>();
  args.m_capacity = c.capacity;
  args.num_experts = static_cast<int>(c.offsets.size()) - 1;
  args.intermediate = I;
  args.activation = act;
  kernels::swiglu_quant_fp8(args, nullptr);
  MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
  const auto codes = out.download<uint8_t>();
  const auto scales = out_scales.download<float>();
  const Reference ref = host_reference(c, act, use_topk);
  int64_t code_diffs = 0, scale_diffs = 0, written = 0;
  for (int64_t r = 0; r < c.capacity; ++r) {
    const bool inside = r >= c.first() && r < c.end();
    written += inside;
    for (int b = 0; b < groups; ++b) {
      if (std::memcmp(&scales[r * groups + b], &ref.scales[r * groups + b], sizeof(float)) != 0 && scale_diffs++ < 5)
        ADD_FAILURE() << "scale[" << r << ", " << b << "] = " << scales[r * groups + b] << " reference "
                      << ref.scales[r * groups + b] << (inside ? "" : " (row of no expert: must stay poisoned)");
      for (int i = 0; i < 128; ++i) {
        const int64_t at = r * I + b * 128 + i;
        if (codes[at] != ref.codes[at] && code_diffs++ < 5)
          ADD_FAILURE() << "code[" << r << ", " << b * 128 + i << "] = 0x" << std::hex << int{codes[at]}
                        << " reference 0x" << int{ref.codes[at]} << std::dec
                        << (inside ? "" : " (row of no expert: must stay poisoned)");
      }
    }
  }
  EXPECT_EQ(code_diffs, 0);
  EXPECT_EQ(scale_diffs, 0);
  std::printf("swiglu_quant %s I=%d %s topk=%d: %lld rows written, %lld code / %lld scale differences\n", what.c_str(), I,
              std::string(activation_name(act.kind)).c_str(), use_topk, static_cast<long long>(written),
              static_cast<long long>(code_diffs), static_cast<long long>(scale_diffs));
}

const Activation kClamped{Activation::Kind::kSwigluClamped, 7.0f, 1.702f};

// Both activations, with and without top-k; experts of 0 / 1 / odd row counts between poisoned rows of no expert.
TEST(SwigluQuantFp8, MatchesHostReference) {
  MEGAMOE_REQUIRE_GPUS(1);
  const std::vector<int> counts{0, 1, 37, 0, 130, 5, 1, 64, 0};
  for (const bool clamped : {false, true})
    for (const bool topk : {false, true})
      for (const int I : {128, 384}) {
        const SwigluCase c = make_case(counts, 3, 4, I, 100 + 10 * clamped + 2 * topk + I / 128, clamped);
        run_case(c, clamped ? kClamped : Activation{}, topk, "mixed experts");
      }
}

// More rows than the grid covers at once (the grid-stride loop; CTAs whose half-warps leave at different
// iterations), a wide I (dsv3's 2048: a CTA per row), the receive buffer filled exactly (offsets[0] = 0,
// offsets[E] = capacity), offsets[E] past m_capacity (clamped) and offsets[0] = offsets[E] (nothing written).
TEST(SwigluQuantFp8, GridStrideAndOffsetEdges) {
  MEGAMOE_REQUIRE_GPUS(1);
  run_case(make_case({9000, 0, 11001}, 0, 0, 256, 201, false), Activation{}, true, "grid stride, full buffer");
  run_case(make_case({700, 333}, 1, 2, 2048, 202, true), kClamped, false, "wide I");
  SwigluCase past = make_case({50, 20}, 5, 10, 256, 203, false);
  past.capacity = 60;  // offsets {5, 55, 75}: rows [5, 60) written, row 60.. do not exist
  past.in.resize(past.capacity * 2 * 256);
  past.topk.resize(past.capacity);
  run_case(past, Activation{}, true, "offsets past m_capacity");
  run_case(make_case({0, 0, 0}, 7, 9, 128, 204, false), Activation{}, false, "no rows");
}

// Runs without a GPU: every check happens before any CUDA call.
TEST(SwigluQuantFp8, RejectsBadArguments) {
  alignas(16) static uint8_t fake[256];
  const auto expect_error = [](const kernels::SwigluQuantFp8Args& args, const std::string& needle) {
    try {
      kernels::swiglu_quant_fp8(args, nullptr);
      ADD_FAILURE() << "accepted; expected an error containing '" << needle << "'";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
    }
  };
  kernels::SwigluQuantFp8Args good;
  good.in = reinterpret_cast<const uint16_t*>(fake);
  good.expert_offsets = reinterpret_cast<const int32_t*>(fake);
  good.out = fake;
  good.out_scales = reinterpret_cast<float*>(fake);
  good.m_capacity = 16;
  good.num_experts = 2;
  good.intermediate = 256;
  kernels::SwigluQuantFp8Args a = good;
  a.intermediate = 200;
  expect_error(a, "intermediate = 200 must be a positive multiple of 128");
  a = good;
  a.m_capacity = 0;
  expect_error(a, "m_capacity = 0 must be in [1, 2^31)");
  a = good;
  a.num_experts = 1025;
  expect_error(a, "num_experts = 1025 must be in [1, 1024]");
  a = good;
  a.in = reinterpret_cast<const uint16_t*>(fake + 8);
  expect_error(a, "in must be 16-byte aligned");
  a = good;
  a.out = nullptr;
  expect_error(a, "out must be non-null");
  a = good;
  a.out_scales = reinterpret_cast<float*>(fake + 4);
  expect_error(a, "out_scales must be 16-byte aligned");
  a = good;
  a.expert_offsets = nullptr;
  expect_error(a, "expert_offsets must be non-null");
  a = good;
  a.topk_weights = reinterpret_cast<const float*>(fake + 2);
  expect_error(a, "topk_weights must be 4-byte aligned");
  a = good;
  a.activation = Activation{Activation::Kind::kSwigluClamped, 0.0f, 1.702f};
  expect_error(a, "activation.limit = 0 must be > 0");
  // The two-pass entry point: v9 weights and a missing BF16 buffer are rejected before anything runs.
  kernels::GroupedGemm1Fp8Args g1;
  g1.packing = kernels::GemmRole::kGateUpInterleaved8;
  try {
    kernels::grouped_gemm1_fp8_two_pass(g1, reinterpret_cast<uint16_t*>(fake), nullptr);
    ADD_FAILURE() << "kGateUpInterleaved8 accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("packing = 2 must be kGateUp"), std::string::npos) << error.what();
  }
  g1.packing = kernels::GemmRole::kGateUp;
  try {
    kernels::grouped_gemm1_fp8_two_pass(g1, nullptr, nullptr);
    ADD_FAILURE() << "gate_up = null accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("gate_up must be non-null"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace megamoe
