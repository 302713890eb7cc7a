// The reference MoE layer.
//  * Exact tests: inputs and weights are chosen so that every quantization step of every format is
//    exact (as vLLM's MegaMoE test does); the expected output is derived here in closed form from the
//    chosen real values (its own E4M3/E2M1 tables and BF16 rounding, nothing from the library), and
//    compared bit for bit.
//  * Random tests: vs an independent fp64 dense computation (no activation quantization), with a
//    rel-L2 bound and an elementwise bound per format.
//  * Edge cases and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu/formats_test_util.h"
#include "megamoe/cpu_ep.h"
#include "megamoe/error.h"
#include "megamoe/formats.h"
#include "megamoe/moe.h"
#include "megamoe/reference.h"

using namespace megamoe;
using megamoe::test::expect_error_mentions;

namespace {

// ---- test-local number formats (independent of src/formats) -------------------------------------
double e4m3_value(int code) {
  const int sign = code >> 7, exponent = (code >> 3) & 15, mantissa = code & 7;
  if (exponent == 15 && mantissa == 7) return NAN;
  const double magnitude = exponent == 0 ? mantissa / 8.0 * std::ldexp(1.0, -6)
                                         : (1.0 + mantissa / 8.0) * std::ldexp(1.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}
double e2m1_value(int code) {
  static const double magnitudes[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8) ? -magnitudes[code & 7] : magnitudes[code & 7];
}
// Code of an exactly representable value, or -1 (zero -> the +0 code).
int exact_code(double value, bool e4m3) {
  static const auto table = [](bool fp8) {
    std::map<double, int> codes;
    for (int code = fp8 ? 255 : 15; code >= 0; --code) {  // ends on the lower (+0) code for zero
      const double v = fp8 ? e4m3_value(code) : e2m1_value(code);
      if (!std::isnan(v)) codes[v] = code;
    }
    return codes;
  };
  static const std::map<double, int> e4m3_codes = table(true), e2m1_codes = table(false);
  const std::map<double, int>& codes = e4m3 ? e4m3_codes : e2m1_codes;
  const auto found = codes.find(value);
  return found == codes.end() ? -1 : found->second;
}
uint16_t bf16_bits_rne(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);  // finite inputs only
}
float bf16_rne(float value) { return std::bit_cast<float>(static_cast<uint32_t>(bf16_bits_rne(value)) << 16); }

// Encodes a dense matrix of exactly representable values; every scale is a power of two found by
// search, so dequantization is exact. Fails the test if the values do not fit the format.
formats::QuantizedMatrix encode_exact(const std::vector<double>& w, int64_t rows, int64_t cols, WeightFormat format,
                                      std::array<float, 2> nvfp4_globals = {0.5f, 0.25f}) {
  formats::QuantizedMatrix m;
  m.format = format;
  m.rows = rows;
  m.cols = cols;
  auto at = [&](int64_t r, int64_t c) { return w[r * cols + c]; };
  auto fail = [&](int64_t r, int64_t c) {
    ADD_FAILURE() << "test design: value " << at(r, c) << " at (" << r << ", " << c << ") does not fit "
                  << weight_format_name(format);
  };
  switch (format) {
    case WeightFormat::kBf16:
      for (int64_t i = 0; i < rows * cols; ++i) {
        const uint32_t bits = std::bit_cast<uint32_t>(static_cast<float>(w[i]));
        if ((bits & 0xFFFF) != 0 || static_cast<float>(w[i]) != w[i]) fail(i / cols, i % cols);
        m.data.push_back(static_cast<uint8_t>(bits >> 16));
        m.data.push_back(static_cast<uint8_t>(bits >> 24));
      }
      break;
    case WeightFormat::kFp8Block: {
      const int64_t block_rows = (rows + 127) / 128, block_cols = (cols + 127) / 128;
      m.data.assign(rows * cols, 0);
      for (int64_t br = 0; br < block_rows; ++br) {
        for (int64_t bc = 0; bc < block_cols; ++bc) {
          bool found = false;
          for (int k = 6; k >= -6 && !found; --k) {  // largest power-of-two scale that fits
            const double scale = std::ldexp(1.0, k);
            bool fits = true;
            for (int64_t r = br * 128; r < std::min(rows, br * 128 + 128) && fits; ++r)
              for (int64_t c = bc * 128; c < std::min(cols, bc * 128 + 128) && fits; ++c)
                fits = exact_code(at(r, c) / scale, true) >= 0;
            if (!fits) continue;
            found = true;
            m.block_scales.push_back(static_cast<float>(scale));
            for (int64_t r = br * 128; r < std::min(rows, br * 128 + 128); ++r)
              for (int64_t c = bc * 128; c < std::min(cols, bc * 128 + 128); ++c)
                m.data[r * cols + c] = static_cast<uint8_t>(exact_code(at(r, c) / scale, true));
          }
          if (!found) fail(br * 128, bc * 128);
        }
      }
      break;
    }
    case WeightFormat::kNvfp4:
    case WeightFormat::kMxfp4: {
      const bool nv = format == WeightFormat::kNvfp4;
      const int group = nv ? 16 : 32;
      if (nv) m.global_scales = nvfp4_globals;
      m.data.assign(rows * ((cols + 1) / 2), 0);
      for (int64_t r = 0; r < rows; ++r) {
        const double global = nv ? (r < rows / 2 ? nvfp4_globals[0] : nvfp4_globals[1]) : 1.0;
        for (int64_t g = 0; g < cols / group; ++g) {
          bool found = false;
          for (int k = 6; k >= -6 && !found; --k) {
            const double scale = std::ldexp(1.0, k) * global;  // nvfp4 group scale = 2^k (an E4M3 value)
            bool fits = true;
            for (int64_t c = g * group; c < (g + 1) * group && fits; ++c) fits = exact_code(at(r, c) / scale, false) >= 0;
            if (!fits) continue;
            found = true;
            m.group_scales.push_back(nv ? static_cast<uint8_t>(exact_code(std::ldexp(1.0, k), true))
                                        : static_cast<uint8_t>(127 + k));
            for (int64_t c = g * group; c < (g + 1) * group; ++c) {
              const int code = exact_code(at(r, c) / scale, false);
              m.data[r * (cols / 2) + c / 2] |= static_cast<uint8_t>(c % 2 == 0 ? code : code << 4);
            }
          }
          if (!found) fail(r, g * group);
        }
      }
      break;
    }
  }
  return m;
}

// ---- the exactly representable layer -------------------------------------------------------------
// Real-valued design (see the comment of ExactLayer::make); every intermediate is exact.
struct DenseWeights {
  int intermediate = 0;
  std::vector<double> w13;  // [2I, H]
  std::vector<double> w2;   // [H, I]
};

struct ExactLayer {
  static constexpr int H = 256, I = 128, E = 4, K = 2, T = 6, kSharedI = 128;
  MoeConfig config;
  std::vector<float> x;  // [T, H]
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::vector<DenseWeights> experts;
  DenseWeights shared;

  // hidden: x[t, 0] = 7 and x[t, 128] = -7 (the amax of each 128-group, so the FP8 scale is 7/448 =
  //   2^-6 exactly), x[t, 1] = 4, the rest from {0, +-0.5, +-1, +-1.5, +-2, +-3, ..., +-7}.
  // W13 gate row c: one nonzero, at column 1, so gate = 4 * G:
  //   silu: G in {0, 8} -> gate in {0, 32}: silu(0) = 0, silu(32) = 32 exactly in fp32
  //         (1 + expf(-32) rounds to 1).
  //   swiglu_clamped (limit 7, alpha 8): G in {0, 1, -4} -> gate in {0, 4, -16}; glu(4) = 4
  //         (alpha*4 = 32), glu(-16) = -0 (expf(128) = inf), glu(0) = 0; row 0 has G = 8:
  //         gate 32 clamps to 7, glu = 7.
  // W13 up row c: one nonzero U in {+-1, +-2, +-4} at a random column; row 0: U = 4 at column 0
  //   -> up = 28 (swiglu: clamps to 7). So h row 0 is the amax of h: silu 32 * 28 = 896 (scale 2),
  //   swiglu 7 * 8 = 56 (scale 1/8); every other h has <= 3 significant bits and fits E4M3 after
  //   the scale. Top-k weights are powers of two, so apply_topk_in_fc1 keeps all of that exact.
  // W2: dense, values in {0, +-0.5, +-1, +-2, +-4}: GEMM-2 sums are exact in fp32.
  static ExactLayer make(WeightFormat format, Activation::Kind kind, bool fc1, bool shared_expert, unsigned seed) {
    ExactLayer L;
    std::mt19937 rng(seed);
    L.config.hidden = H;
    L.config.intermediate = I;
    L.config.num_experts = E;
    L.config.top_k = K;
    L.config.weight_format = format;
    L.config.activation.kind = kind;
    L.config.activation.limit = 7.0f;
    L.config.activation.alpha = 8.0f;
    L.config.apply_topk_in_fc1 = fc1;
    L.config.shared_intermediate = shared_expert ? kSharedI : 0;
    L.config.max_tokens_per_rank = 64;
    const double values[] = {0, 0.5, -0.5, 1, -1, 1.5, -1.5, 2, -2, 3, -3, 4, -4, 5, -5, 6, -6, 7, -7};
    L.x.resize(T * H);
    for (int t = 0; t < T; ++t) {
      for (int i = 0; i < H; ++i) L.x[t * H + i] = static_cast<float>(values[rng() % 19]);
      L.x[t * H + 0] = 7.0f;
      L.x[t * H + 128] = -7.0f;
      L.x[t * H + 1] = 4.0f;
    }
    // t2: all padding; t3, t4: one padding slot (first or second); t5: the same expert twice;
    // expert 3 receives no token.
    L.ids = {0, 1, 2, 0, -1, -1, 1, -1, -1, 2, 0, 0};
    L.weights = {0.5f, 0.25f, 1.0f, 0.5f, 0.0f, 0.0f, 2.0f, 0.0f, 0.0f, 0.5f, 0.25f, 0.5f};
    for (int e = 0; e < E; ++e) L.experts.push_back(make_expert(I, kind, rng));
    if (shared_expert) L.shared = make_expert(kSharedI, kind, rng);
    return L;
  }

  static DenseWeights make_expert(int inter, Activation::Kind kind, std::mt19937& rng) {
    DenseWeights d;
    d.intermediate = inter;
    d.w13.assign(2 * inter * H, 0.0);
    d.w2.assign(H * inter, 0.0);
    const bool silu = kind == Activation::Kind::kSiluMul;
    const double gate_choices_silu[] = {0, 8, 8};
    const double gate_choices_swiglu[] = {0, 1, 1, -4};
    const double up_choices[] = {1, -1, 2, -2, 4, -4};
    for (int c = 0; c < inter; ++c) {
      d.w13[c * H + 1] = c == 0 ? 8.0 : (silu ? gate_choices_silu[rng() % 3] : gate_choices_swiglu[rng() % 4]);
      const int column = c == 0 ? 0 : static_cast<int>(rng() % H);
      d.w13[(inter + c) * H + column] = c == 0 ? 4.0 : up_choices[rng() % 6];
    }
    const double w2_choices[] = {0, 0.5, -0.5, 1, -1, 2, -2, 4, -4};
    for (double& v : d.w2) v = w2_choices[rng() % 9];
    return d;
  }

  // Closed-form expected output of one expert, y [H] (before the top-k weight unless fc1).
  std::vector<double> expert_output(const DenseWeights& d, int t, double fc1_weight) const {
    const int inter = d.intermediate;
    std::vector<double> h(inter);
    for (int c = 0; c < inter; ++c) {
      double gate = 0, up = 0;
      for (int i = 0; i < H; ++i) {
        gate += x[t * H + i] * d.w13[c * H + i];
        up += x[t * H + i] * d.w13[(inter + c) * H + i];
      }
      if (config.activation.kind == Activation::Kind::kSiluMul) {
        h[c] = gate * up;  // silu(gate) == gate for gate in {0, 32}
      } else {
        const double limit = config.activation.limit;
        const double glu = gate <= 0 ? 0.0 : std::min(gate, limit);  // sigmoid is exactly 1 or 0 here
        h[c] = glu * (std::clamp(up, -limit, limit) + 1.0);
      }
      h[c] *= fc1_weight;
    }
    std::vector<double> y(H, 0.0);
    for (int r = 0; r < H; ++r)
      for (int c = 0; c < inter; ++c) y[r] += h[c] * d.w2[r * inter + c];
    return y;
  }

  // Expected output bits: bf16 (uint16 in the low half) or fp32 bit patterns.
  std::vector<uint32_t> expected(bool bf16_io) const {
    std::vector<uint32_t> out(T * H);
    for (int t = 0; t < T; ++t) {
      std::vector<float> acc(H, 0.0f);
      auto add = [&](const std::vector<double>& y, double weight) {
        for (int r = 0; r < H; ++r) {
          float v = static_cast<float>(y[r] * weight);
          EXPECT_EQ(static_cast<double>(v), y[r] * weight) << "test design: contribution not exact in fp32";
          if (bf16_io) v = bf16_rne(v);
          acc[r] += v;
        }
      };
      for (int j = 0; j < K; ++j) {
        const int id = ids[t * K + j];
        if (id < 0) continue;
        const double w = weights[t * K + j];
        if (config.apply_topk_in_fc1) add(expert_output(experts[id], t, w), 1.0);
        else add(expert_output(experts[id], t, 1.0), w);
      }
      if (config.shared_intermediate > 0) add(expert_output(shared, t, 1.0), 1.0);
      for (int r = 0; r < H; ++r)
        out[t * H + r] = bf16_io ? bf16_bits_rne(acc[r]) : std::bit_cast<uint32_t>(acc[r]);
    }
    return out;
  }

  std::unique_ptr<MoeBackend> backend(Accumulation accumulation) const {
    auto b = make_reference_backend(config, ReferenceOptions{accumulation});
    for (int e = 0; e < E; ++e)
      b->load_expert(e, {encode_exact(experts[e].w13, 2 * I, H, config.weight_format),
                         encode_exact(experts[e].w2, H, I, config.weight_format, {0.5f, 0.5f})});
    if (config.shared_intermediate > 0)
      b->load_shared_expert({encode_exact(shared.w13, 2 * kSharedI, H, config.weight_format),
                             encode_exact(shared.w2, H, kSharedI, config.weight_format, {0.5f, 0.5f})});
    b->warmup(nullptr);
    return b;
  }

  // Runs the layer; returns output bits (poisoned beforehand).
  std::vector<uint32_t> run(MoeBackend& b, bool bf16_io) const {
    std::vector<uint16_t> hidden16(T * H), out16(T * H, 0xFFFF);
    std::vector<float> out32(T * H, NAN);
    std::vector<float> hidden32 = x;
    for (int i = 0; i < T * H; ++i) hidden16[i] = bf16_bits_rne(x[i]);
    std::vector<int32_t> ids_copy = ids;
    std::vector<float> weights_copy = weights;
    MoeInputs in;
    in.hidden = bf16_io ? TensorView::make2d(hidden16.data(), DType::kBF16, T, H, Device::kCpu)
                        : TensorView::make2d(hidden32.data(), DType::kF32, T, H, Device::kCpu);
    in.topk_ids = TensorView::make2d(ids_copy.data(), DType::kI32, T, K, Device::kCpu);
    in.topk_weights = TensorView::make2d(weights_copy.data(), DType::kF32, T, K, Device::kCpu);
    MoeOutputs out;
    out.out = bf16_io ? TensorView::make2d(out16.data(), DType::kBF16, T, H, Device::kCpu)
                      : TensorView::make2d(out32.data(), DType::kF32, T, H, Device::kCpu);
    b.forward(in, out, nullptr);
    std::vector<uint32_t> bits(T * H);
    for (int i = 0; i < T * H; ++i) bits[i] = bf16_io ? out16[i] : std::bit_cast<uint32_t>(out32[i]);
    return bits;
  }
};

struct ExactCase {
  WeightFormat format;
  Activation::Kind activation;
  bool fc1;
  bool shared;
};

std::string case_name(const ::testing::TestParamInfo<ExactCase>& info) {
  return std::string(weight_format_name(info.param.format)) + "_" + std::string(activation_name(info.param.activation)) +
         (info.param.fc1 ? "_fc1" : "") + (info.param.shared ? "_shared" : "");
}

class ReferenceExact : public ::testing::TestWithParam<ExactCase> {};

TEST_P(ReferenceExact, BitExactAgainstClosedForm) {
  const ExactCase c = GetParam();
  const unsigned seed = 1000 + static_cast<unsigned>(c.format) * 16 + static_cast<unsigned>(c.activation) * 4 +
                        (c.fc1 ? 2 : 0) + (c.shared ? 1 : 0);
  const ExactLayer layer = ExactLayer::make(c.format, c.activation, c.fc1, c.shared, seed);
  for (Accumulation accumulation : {Accumulation::kF64, Accumulation::kF32}) {
    auto backend = layer.backend(accumulation);
    for (bool bf16_io : {true, false}) {
      const std::vector<uint32_t> want = layer.expected(bf16_io);
      const std::vector<uint32_t> got = layer.run(*backend, bf16_io);
      int mismatches = 0, nonzero = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        nonzero += (want[i] & 0x7FFFFFFF) != 0;
        if (want[i] != got[i] && ++mismatches <= 5)
          ADD_FAILURE() << "seed " << seed << " " << (bf16_io ? "bf16" : "f32") << " out[" << i / ExactLayer::H
                        << ", " << i % ExactLayer::H << "]: got 0x" << std::hex << got[i] << " want 0x" << want[i];
      }
      EXPECT_EQ(mismatches, 0) << "seed " << seed << " accumulation "
                               << (accumulation == Accumulation::kF64 ? "f64" : "f32");
      // Tokens 0, 1, 3, 4, 5 are routed: most of their outputs are nonzero (not a test on zeros).
      EXPECT_GT(nonzero, 4 * ExactLayer::H) << "seed " << seed;
    }
  }
}

std::vector<ExactCase> all_exact_cases() {
  std::vector<ExactCase> cases;
  for (WeightFormat f : {WeightFormat::kBf16, WeightFormat::kFp8Block, WeightFormat::kNvfp4, WeightFormat::kMxfp4})
    for (Activation::Kind a : {Activation::Kind::kSiluMul, Activation::Kind::kSwigluClamped})
      for (bool fc1 : {false, true})
        for (bool shared : {false, true}) cases.push_back({f, a, fc1, shared});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllFormatsActivations, ReferenceExact, ::testing::ValuesIn(all_exact_cases()),
                         case_name);

// Padding-only tokens give +0; a token routed to nothing but with a shared expert gets the shared
// expert's output. (Covered bit-exactly above; this pins the all-padding row explicitly.)
TEST(ReferenceMoe, AllPaddingRowIsPositiveZero) {
  const ExactLayer layer = ExactLayer::make(WeightFormat::kFp8Block, Activation::Kind::kSiluMul, false, false, 7);
  auto backend = layer.backend(Accumulation::kF64);
  const std::vector<uint32_t> got = layer.run(*backend, true);
  for (int r = 0; r < ExactLayer::H; ++r) ASSERT_EQ(got[2 * ExactLayer::H + r], 0u) << r;
}

// ---- random inputs vs an independent fp64 dense layer ----------------------------------------------
struct RandomLayer {
  MoeConfig config;
  std::vector<float> x;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::vector<std::vector<double>> w13, w2;  // dequantized exactly (what the layer multiplies by)
  std::vector<ExpertWeights> quantized;
  std::vector<double> shared_w13, shared_w2;
  ExpertWeights shared_quantized;
};

RandomLayer make_random_layer(WeightFormat format, Activation::Kind kind, bool fc1, bool shared, int T, unsigned seed) {
  RandomLayer L;
  MoeConfig& c = L.config;
  c.hidden = 256;
  c.intermediate = 256;
  c.num_experts = 8;
  c.top_k = 3;
  c.weight_format = format;
  c.activation.kind = kind;
  c.apply_topk_in_fc1 = fc1;
  c.shared_intermediate = shared ? 128 : 0;
  c.max_tokens_per_rank = std::max(T, 1);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.05f, 1.0f);
  const int H = c.hidden;
  L.x.resize(static_cast<size_t>(T) * H);
  for (float& v : L.x) v = formats::round_to_bf16(normal(rng));
  auto random_matrix = [&](int64_t rows, int64_t cols) {
    std::vector<float> m(rows * cols);
    const float s = 1.0f / std::sqrt(static_cast<float>(cols));
    for (float& v : m) v = normal(rng) * s * 2.0f;
    return m;
  };
  auto quantize = [&](const std::vector<float>& m, int64_t rows, int64_t cols, bool is_w13) {
    if (format == WeightFormat::kNvfp4 && is_w13) return formats::quantize_nvfp4_per_half(m.data(), rows, cols);
    return formats::quantize(m.data(), rows, cols, format);
  };
  for (int e = 0; e < c.num_experts; ++e) {
    ExpertWeights q{quantize(random_matrix(2 * c.intermediate, H), 2 * c.intermediate, H, true),
                    quantize(random_matrix(H, c.intermediate), H, c.intermediate, false)};
    L.w13.push_back(formats::dequantize_f64(q.w13));
    L.w2.push_back(formats::dequantize_f64(q.w2));
    L.quantized.push_back(std::move(q));
  }
  if (shared) {
    L.shared_quantized = {quantize(random_matrix(2 * c.shared_intermediate, H), 2 * c.shared_intermediate, H, true),
                          quantize(random_matrix(H, c.shared_intermediate), H, c.shared_intermediate, false)};
    L.shared_w13 = formats::dequantize_f64(L.shared_quantized.w13);
    L.shared_w2 = formats::dequantize_f64(L.shared_quantized.w2);
  }
  // Distinct experts per token; ~1 in 8 slots padding; expert 7 never used (no tokens).
  for (int t = 0; t < T; ++t) {
    std::vector<int> pool = {0, 1, 2, 3, 4, 5, 6};
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int j = 0; j < c.top_k; ++j) {
      const bool pad = rng() % 8 == 0;
      L.ids.push_back(pad ? -1 : pool[j]);
      L.weights.push_back(pad ? 0.0f : uniform(rng));
    }
  }
  return L;
}

// fp64, no activation quantization: the mathematical layer on the dequantized weights.
std::vector<double> dense_fp64(const RandomLayer& L, int T) {
  const MoeConfig& c = L.config;
  const int H = c.hidden;
  auto expert = [&](const std::vector<double>& w13, const std::vector<double>& w2, int inter, int t, double fc1_weight) {
    std::vector<double> h(inter), y(H, 0.0);
    for (int r = 0; r < inter; ++r) {
      double gate = 0, up = 0;
      for (int i = 0; i < H; ++i) {
        gate += static_cast<double>(L.x[t * H + i]) * w13[static_cast<size_t>(r) * H + i];
        up += static_cast<double>(L.x[t * H + i]) * w13[static_cast<size_t>(inter + r) * H + i];
      }
      if (c.activation.kind == Activation::Kind::kSiluMul) {
        h[r] = gate / (1.0 + std::exp(-gate)) * up;
      } else {
        const double limit = c.activation.limit, g = std::min(gate, limit);
        h[r] = g / (1.0 + std::exp(-c.activation.alpha * g)) * (std::clamp(up, -limit, limit) + 1.0);
      }
      h[r] *= fc1_weight;
    }
    for (int r = 0; r < H; ++r)
      for (int k = 0; k < inter; ++k) y[r] += h[k] * w2[static_cast<size_t>(r) * inter + k];
    return y;
  };
  std::vector<double> out(static_cast<size_t>(T) * H, 0.0);
  for (int t = 0; t < T; ++t) {
    for (int j = 0; j < c.top_k; ++j) {
      const int id = L.ids[t * c.top_k + j];
      if (id < 0) continue;
      const double w = L.weights[t * c.top_k + j];
      const std::vector<double> y = expert(L.w13[id], L.w2[id], c.intermediate, t, c.apply_topk_in_fc1 ? w : 1.0);
      for (int r = 0; r < H; ++r) out[t * H + r] += c.apply_topk_in_fc1 ? y[r] : w * y[r];
    }
    if (c.shared_intermediate > 0) {
      const std::vector<double> y = expert(L.shared_w13, L.shared_w2, c.shared_intermediate, t, 1.0);
      for (int r = 0; r < H; ++r) out[t * H + r] += y[r];
    }
  }
  return out;
}

std::vector<float> run_reference(const RandomLayer& L, int T, Accumulation accumulation, bool bf16_io) {
  const MoeConfig& c = L.config;
  auto backend = make_reference_backend(c, ReferenceOptions{accumulation});
  for (int e = 0; e < c.num_experts; ++e) backend->load_expert(e, L.quantized[e]);
  if (c.shared_intermediate > 0) backend->load_shared_expert(L.shared_quantized);
  backend->warmup(nullptr);
  const int H = c.hidden;
  std::vector<uint16_t> hidden16(static_cast<size_t>(T) * H), out16(static_cast<size_t>(T) * H, 0xFFFF);
  for (size_t i = 0; i < hidden16.size(); ++i) hidden16[i] = bf16_bits_rne(L.x[i]);
  std::vector<float> hidden32 = L.x, out32(static_cast<size_t>(T) * H, NAN);
  std::vector<int32_t> ids = L.ids;
  std::vector<float> weights = L.weights;
  MoeInputs in;
  in.hidden = bf16_io ? TensorView::make2d(hidden16.data(), DType::kBF16, T, H, Device::kCpu)
                      : TensorView::make2d(hidden32.data(), DType::kF32, T, H, Device::kCpu);
  in.topk_ids = TensorView::make2d(ids.data(), DType::kI32, T, c.top_k, Device::kCpu);
  in.topk_weights = TensorView::make2d(weights.data(), DType::kF32, T, c.top_k, Device::kCpu);
  MoeOutputs out;
  out.out = bf16_io ? TensorView::make2d(out16.data(), DType::kBF16, T, H, Device::kCpu)
                    : TensorView::make2d(out32.data(), DType::kF32, T, H, Device::kCpu);
  backend->forward(in, out, nullptr);
  if (bf16_io)
    for (size_t i = 0; i < out16.size(); ++i) out32[i] = std::bit_cast<float>(static_cast<uint32_t>(out16[i]) << 16);
  return out32;
}

struct Metrics {
  double rel_l2 = 0, worst_ratio = 0;  // worst |got - want| / (elementwise bound)
};
Metrics compare(const std::vector<float>& got, const std::vector<double>& want, double rtol, double atol_rms) {
  double diff2 = 0, ref2 = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff2 += (got[i] - want[i]) * (got[i] - want[i]);
    ref2 += want[i] * want[i];
  }
  const double rms = std::sqrt(ref2 / static_cast<double>(want.size()));
  Metrics m;
  m.rel_l2 = std::sqrt(diff2 / ref2);
  for (size_t i = 0; i < want.size(); ++i) {
    const double bound = rtol * std::abs(want[i]) + atol_rms * rms;
    m.worst_ratio = std::max(m.worst_ratio, std::isfinite(got[i]) ? std::abs(got[i] - want[i]) / bound : INFINITY);
  }
  return m;
}

class ReferenceRandom : public ::testing::TestWithParam<ExactCase> {};

TEST_P(ReferenceRandom, MatchesDenseFp64WithinFormatBudget) {
  const ExactCase c = GetParam();
  const int T = 33;
  const unsigned seed = 77 + static_cast<unsigned>(c.format) * 8 + static_cast<unsigned>(c.activation) * 2 + c.fc1;
  const RandomLayer L = make_random_layer(c.format, c.activation, c.fc1, c.shared, T, seed);
  const std::vector<double> want = dense_fp64(L, T);
  // Budgets: BF16 rounds the activation and the output to 8 bits; FP8 rounds both GEMM operands
  // to 4 significant bits (per-element relative error <= 2^-4) and averages out over K.
  const bool fp8 = uses_fp8_activations(c.format);
  const double max_rel_l2 = fp8 ? 0.06 : 0.01;
  const double rtol = fp8 ? 0.25 : 0.02, atol_rms = fp8 ? 0.25 : 0.02;
  for (bool bf16_io : {true, false}) {
    const std::vector<float> f64 = run_reference(L, T, Accumulation::kF64, bf16_io);
    const Metrics m = compare(f64, want, rtol, atol_rms);
    EXPECT_LT(m.rel_l2, max_rel_l2) << "seed " << seed << (bf16_io ? " bf16" : " f32");
    EXPECT_LE(m.worst_ratio, 1.0) << "seed " << seed << (bf16_io ? " bf16" : " f32") << " rel_l2 " << m.rel_l2;
    EXPECT_GT(m.rel_l2, 0.0) << "quantization must show (seed " << seed << ")";
    // fp32 accumulation differs from fp64 only by accumulation rounding (and the rare FP8/BF16 operand
    // rounding it flips): it must be far closer to the fp64 reference than the format budget.
    const std::vector<float> f32 = run_reference(L, T, Accumulation::kF32, bf16_io);
    std::vector<double> f64d(f64.begin(), f64.end());
    EXPECT_LT(compare(f32, f64d, 0, 1).rel_l2, fp8 ? 1e-3 : 1e-4) << "seed " << seed;
  }
}

std::vector<ExactCase> random_cases() {
  std::vector<ExactCase> cases;
  for (WeightFormat f : {WeightFormat::kBf16, WeightFormat::kFp8Block, WeightFormat::kNvfp4, WeightFormat::kMxfp4})
    for (Activation::Kind a : {Activation::Kind::kSiluMul, Activation::Kind::kSwigluClamped})
      cases.push_back({f, a, a == Activation::Kind::kSwigluClamped, f == WeightFormat::kFp8Block});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllFormatsActivations, ReferenceRandom, ::testing::ValuesIn(random_cases()),
                         case_name);

// ---- edge cases and bad input ------------------------------------------------------------------------
TEST(ReferenceMoe, ZeroTokensIsANoOp) {
  const RandomLayer L = make_random_layer(WeightFormat::kBf16, Activation::Kind::kSiluMul, false, false, 0, 5);
  EXPECT_TRUE(run_reference(L, 0, Accumulation::kF64, true).empty());
}

struct BadInputFixture {
  ExactLayer layer = ExactLayer::make(WeightFormat::kFp8Block, Activation::Kind::kSiluMul, false, false, 11);
  std::unique_ptr<MoeBackend> backend = layer.backend(Accumulation::kF64);
  static constexpr int T = ExactLayer::T, H = ExactLayer::H, K = ExactLayer::K;
  std::vector<uint16_t> hidden = std::vector<uint16_t>(T * H, 0x3F80);
  std::vector<int32_t> ids = layer.ids;
  std::vector<float> weights = layer.weights;
  std::vector<uint16_t> out = std::vector<uint16_t>(T * H, 0xABCD);
  MoeInputs in;
  MoeOutputs outputs;
  BadInputFixture() {
    in.hidden = TensorView::make2d(hidden.data(), DType::kBF16, T, H, Device::kCpu);
    in.topk_ids = TensorView::make2d(ids.data(), DType::kI32, T, K, Device::kCpu);
    in.topk_weights = TensorView::make2d(weights.data(), DType::kF32, T, K, Device::kCpu);
    outputs.out = TensorView::make2d(out.data(), DType::kBF16, T, H, Device::kCpu);
  }
  void forward() { backend->forward(in, outputs, nullptr); }
  bool out_untouched() const {
    return std::all_of(out.begin(), out.end(), [](uint16_t v) { return v == 0xABCD; });
  }
};

TEST(ReferenceMoe, BadInputsNameFieldAndLimitAndWriteNothing) {
  {
    BadInputFixture f;
    f.in.hidden.shape[1] = 128;
    expect_error_mentions([&] { f.forward(); }, {"hidden", "[*, 256]"});
    EXPECT_TRUE(f.out_untouched());
  }
  {
    BadInputFixture f;
    f.in.topk_ids.shape[1] = 3;
    expect_error_mentions([&] { f.forward(); }, {"topk_ids", "[6, 2]"});
  }
  {
    BadInputFixture f;
    f.ids[3] = 4;
    expect_error_mentions([&] { f.forward(); }, {"topk_ids[1, 1] = 4", "num_experts = 4"});
    EXPECT_TRUE(f.out_untouched());
  }
  {
    BadInputFixture f;
    f.ids[0] = -2;
    expect_error_mentions([&] { f.forward(); }, {"topk_ids[0, 0] = -2", "[-1, num_experts = 4)"});
  }
  {
    BadInputFixture f;
    f.weights[1] = NAN;
    expect_error_mentions([&] { f.forward(); }, {"topk_weights[0, 1]", "finite"});
    EXPECT_TRUE(f.out_untouched());
  }
  {
    BadInputFixture f;
    f.outputs.out.dtype = DType::kF32;
    expect_error_mentions([&] { f.forward(); }, {"out", "bf16"});
  }
  {
    BadInputFixture f;
    f.in.hidden.dtype = DType::kF16;
    expect_error_mentions([&] { f.forward(); }, {"hidden", "f16", "bf16 or f32"});
  }
  {
    BadInputFixture f;
    f.in.hidden.device = Device::kCuda;
    expect_error_mentions([&] { f.forward(); }, {"hidden", "on cpu"});
  }
  {
    BadInputFixture f;
    f.layer.config.max_tokens_per_rank = 4;
    f.backend = f.layer.backend(Accumulation::kF64);
    expect_error_mentions([&] { f.forward(); }, {"T = 6", "max_tokens_per_rank = 4"});
  }
}

TEST(ReferenceMoe, BadWeightsAndConfigNameFieldAndLimit) {
  const ExactLayer layer = ExactLayer::make(WeightFormat::kFp8Block, Activation::Kind::kSiluMul, false, false, 3);
  auto backend = make_reference_backend(layer.config);
  ExpertWeights good{encode_exact(layer.experts[0].w13, 2 * ExactLayer::I, ExactLayer::H, WeightFormat::kFp8Block),
                     encode_exact(layer.experts[0].w2, ExactLayer::H, ExactLayer::I, WeightFormat::kFp8Block)};
  ExpertWeights bad = good;
  bad.w13.block_scales.resize(3);  // [2, 2] expected
  expect_error_mentions([&] { backend->load_expert(0, bad); }, {"expert 0 w13", "block_scales has 3", "expected 4"});
  bad = good;
  bad.w2.rows = 128;
  expect_error_mentions([&] { backend->load_expert(1, bad); }, {"expert 1 w2 shape = [128, 128]", "must be [256, 128]"});
  bad = good;
  bad.w13.format = WeightFormat::kBf16;
  expect_error_mentions([&] { backend->load_expert(0, bad); }, {"w13.format = bf16", "weight_format = fp8_block"});
  expect_error_mentions([&] { backend->load_expert(4, good); }, {"local_expert = 4", "num_local_experts = 4"});
  expect_error_mentions([&] { backend->load_shared_expert(good); }, {"shared_intermediate = 0"});
  // Forward with an expert that was never loaded.
  BadInputFixture f;
  f.backend = make_reference_backend(layer.config);
  f.backend->load_expert(0, good);
  expect_error_mentions([&] { f.forward(); }, {"topk_ids[0, 1] = 1", "never loaded"});
  // Config.
  MoeConfig c = layer.config;
  c.hidden = 100;
  expect_error_mentions([&] { c.validate(); }, {"hidden = 100", "multiple of 128", "fp8_block"});
  c = layer.config;
  c.top_k = 5;
  expect_error_mentions([&] { c.validate(); }, {"top_k = 5", "num_experts = 4"});
  c = layer.config;
  c.activation.kind = Activation::Kind::kSwigluClamped;
  c.activation.limit = -1;
  expect_error_mentions([&] { c.validate(); }, {"activation.limit = -1"});
  c = layer.config;
  c.max_tokens_per_rank = 0;
  expect_error_mentions([&] { c.validate(); }, {"max_tokens_per_rank = 0"});
  c = layer.config;
  c.weight_format = WeightFormat::kBf16;
  c.intermediate = 12;
  expect_error_mentions([&] { c.validate(); }, {"intermediate = 12", "multiple of 8"});
}

TEST(ReferenceMoe, DestroyIsIdempotentAndLaterCallsThrow) {
  BadInputFixture f;
  f.backend->destroy();
  f.backend->destroy();
  expect_error_mentions([&] { f.forward(); }, {"forward", "destroyed"});
  EXPECT_TRUE(f.out_untouched());
}

// ---- the collective reference backend over an in-process CpuEpGroup -------------------------------
// Tokens of one random layer split over 3 ranks (5, 0 and 3 tokens; 8 experts held 2, 3, 3): every
// rank's output must be bit-identical to the single-rank backend's rows for the same tokens.
TEST(ReferenceMoe, CpuExpertParallelThreeRanksBitIdenticalToOneRank) {
  const int counts[3] = {5, 0, 3}, T = 8;
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const WeightFormat format : {WeightFormat::kBf16, WeightFormat::kFp8Block, WeightFormat::kNvfp4}) {
    for (const bool fc1_and_shared : {false, true}) {
      for (const bool bf16_io : {false, true}) {
        SCOPED_TRACE(std::string(weight_format_name(format)) + (fc1_and_shared ? " fc1+shared" : "") +
                     (bf16_io ? " bf16" : " f32"));
        const RandomLayer L = make_random_layer(format, Activation::Kind::kSiluMul, fc1_and_shared, fc1_and_shared, T, seed);
        const std::vector<float> want = run_reference(L, T, Accumulation::kF64, bf16_io);
        const MoeConfig& c = L.config;
        const int H = c.hidden, K = c.top_k;
        CpuEpGroup group(3, /*timeout_seconds=*/60.0);
        std::vector<std::unique_ptr<MoeBackend>> ranks;
        for (int r = 0; r < 3; ++r) {
          ranks.push_back(make_reference_backend(c, ReferenceOptions{}, group, r));
          const auto [first, count] = CpuEpGroup::local_experts(c.num_experts, 3, r);
          ASSERT_EQ(ranks[r]->first_local_expert(), first);
          ASSERT_EQ(ranks[r]->num_local_experts(), count);
          EXPECT_THROW(ranks[r]->load_expert(count, L.quantized[first]), Error);  // not this rank's
          for (int e = 0; e < count; ++e) ranks[r]->load_expert(e, L.quantized[first + e]);
          if (c.shared_intermediate > 0) ranks[r]->load_shared_expert(L.shared_quantized);
        }
        std::vector<std::vector<float>> got(3);
        std::vector<std::thread> threads;
        for (int r = 0, begin = 0; r < 3; begin += counts[r++]) {
          threads.emplace_back([&, r, begin] {
            const int n = counts[r];
            // Output written over the input (aliasing allowed), poisoned first where it is separate.
            std::vector<uint16_t> io16(static_cast<size_t>(n) * H);
            std::vector<float> io32(L.x.begin() + static_cast<size_t>(begin) * H, L.x.begin() + static_cast<size_t>(begin + n) * H);
            for (size_t i = 0; i < io16.size(); ++i) io16[i] = bf16_bits_rne(io32[i]);
            std::vector<int32_t> ids(L.ids.begin() + begin * K, L.ids.begin() + (begin + n) * K);
            std::vector<float> weights(L.weights.begin() + begin * K, L.weights.begin() + (begin + n) * K);
            MoeInputs in;
            in.hidden = bf16_io ? TensorView::make2d(io16.data(), DType::kBF16, n, H, Device::kCpu)
                                : TensorView::make2d(io32.data(), DType::kF32, n, H, Device::kCpu);
            in.topk_ids = TensorView::make2d(ids.data(), DType::kI32, n, K, Device::kCpu);
            in.topk_weights = TensorView::make2d(weights.data(), DType::kF32, n, K, Device::kCpu);
            MoeOutputs out{in.hidden};
            ranks[r]->forward(in, out, nullptr);
            got[r].resize(static_cast<size_t>(n) * H);
            for (size_t i = 0; i < got[r].size(); ++i)
              got[r][i] = bf16_io ? std::bit_cast<float>(static_cast<uint32_t>(io16[i]) << 16) : io32[i];
          });
        }
        for (auto& t : threads) t.join();
        for (int r = 0, begin = 0; r < 3; begin += counts[r++]) {
          ASSERT_EQ(0, std::memcmp(got[r].data(), want.data() + static_cast<size_t>(begin) * H, got[r].size() * sizeof(float)))
              << "rank " << r;
        }
      }
    }
  }
}

// A rank with bad inputs fails the collective on every rank with its error, and nobody hangs.
TEST(ReferenceMoe, CpuExpertParallelBadInputOnOneRankFailsEveryRank) {
  const RandomLayer L = make_random_layer(WeightFormat::kBf16, Activation::Kind::kSiluMul, false, false, 2, 7);
  const MoeConfig& c = L.config;
  CpuEpGroup group(2, /*timeout_seconds=*/60.0);
  std::vector<std::unique_ptr<MoeBackend>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(make_reference_backend(c, ReferenceOptions{}, group, r));
    for (int e = 0; e < ranks[r]->num_local_experts(); ++e)
      ranks[r]->load_expert(e, L.quantized[ranks[r]->first_local_expert() + e]);
  }
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> x = L.x, out(x.size(), NAN);
      std::vector<int32_t> ids = L.ids;
      if (r == 1) ids[0] = c.num_experts;  // out of range
      std::vector<float> weights = L.weights;
      MoeInputs in;
      in.hidden = TensorView::make2d(x.data(), DType::kF32, 2, c.hidden, Device::kCpu);
      in.topk_ids = TensorView::make2d(ids.data(), DType::kI32, 2, c.top_k, Device::kCpu);
      in.topk_weights = TensorView::make2d(weights.data(), DType::kF32, 2, c.top_k, Device::kCpu);
      MoeOutputs o{TensorView::make2d(out.data(), DType::kF32, 2, c.hidden, Device::kCpu)};
      try {
        ranks[r]->forward(in, o, nullptr);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(errors[r].find("rank 1: topk_ids[0, 0] = 8 must be in [-1, num_experts = 8)"), std::string::npos)
        << "rank " << r << ": " << errors[r];
}

}  // namespace
