// Number formats (host code, exact) and the canonical per-expert weight representation.
//
// Everything here is the oracle the GPU kernels are tested against, so every rounding rule is
// spelled out. See docs/formats.md for formulas and worked numbers.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "megamoe/types.h"

namespace megamoe::formats {

// ---- scalar conversions -------------------------------------------------------------------------
// All float -> narrow conversions round to nearest, ties to even (RNE). Overflow is judged after
// rounding with an unbounded exponent (IEEE 754 / OCP): E4M3 464 (midpoint of 448 and 480) rounds to
// 448; anything above overflows. NaN inputs keep their sign and become the target's canonical quiet
// NaN: BF16 0x7FC0, FP16 0x7E00, E4M3 0x7F, E5M2 0x7F (sign bit OR-ed in); E2M1 has no NaN (-> +6).
// Infinite inputs: kSaturate -> +-max finite (PTX .satfinite); kNaN -> E4M3 NaN, E5M2 +-inf.
// BF16 and FP16 have infinities and always round overflow to +-inf (IEEE).
enum class Overflow : uint8_t {
  kSaturate,  // clamp to the largest finite magnitude (NaN stays NaN)
  kNaN,       // E4M3: produce NaN; E5M2: produce +-inf (OCP "non-saturating" mode)
};

uint16_t f32_to_bf16(float value);
float bf16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);
float f16_to_f32(uint16_t bits);
uint8_t f32_to_e4m3(float value, Overflow overflow = Overflow::kSaturate);
float e4m3_to_f32(uint8_t bits);
uint8_t f32_to_e5m2(float value, Overflow overflow = Overflow::kSaturate);
float e5m2_to_f32(uint8_t bits);
// E2M1 (values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives): RNE, saturates to +-6, NaN -> +6 (documented).
uint8_t f32_to_e2m1(float value);
float e2m1_to_f32(uint8_t code);  // code in [0, 16)
// UE8M0: 2^(bits-127); bits 255 = NaN; bits 0 = 2^-127.
float ue8m0_to_f32(uint8_t bits);
// Smallest power of two >= value, as UE8M0 bits (OCP MX scale rule is floor(log2(amax)) - emax_elem;
// see mxfp4 quantization below). value <= 2^-127 (including 0 and negatives) -> 0 (2^-127);
// value > 2^127, inf or NaN -> 255 (NaN): never a silent clamp to 2^127.
uint8_t f32_to_ue8m0_ceil(float value);

inline float round_to_bf16(float value) { return bf16_to_f32(f32_to_bf16(value)); }

constexpr float kE4M3Max = 448.0f;
constexpr float kE2M1Max = 6.0f;
constexpr int kFp8BlockSize = 128;   // FP8 block weights: 128x128; activations: 1x128
constexpr int kNvfp4GroupSize = 16;
constexpr int kMxfp4GroupSize = 32;
constexpr float kFp8ScaleEps = 1e-10f;  // amax floor in activation quantization (as vLLM)

// ---- activations: FP8 E4M3, one FP32 scale per token per 128 channels ---------------------------
// For each row r and group g of 128 columns (the last group may be shorter):
//   amax  = max(max_i |x[r, g*128 + i]|, kFp8ScaleEps)
//   scale = amax / 448.0f                       (IEEE fp32 division)
//   q[i]  = f32_to_e4m3(x[i] / scale)           (IEEE fp32 division, RNE, saturating)
// GPU kernels reproduce this bit for bit (__fdiv_rn).
struct Fp8Activations {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> values;  // [rows, cols] E4M3
  std::vector<float> scales;    // [rows, ceil(cols/128)]
};
// NaN elements are ignored by amax (fmaxf semantics) and quantize to E4M3 NaN; an inf element makes
// scale = inf, so its group becomes 0 (finite elements) and NaN (inf / inf).
Fp8Activations quantize_fp8_activations(const float* x, int64_t rows, int64_t cols);
// value = fp32(e4m3(q) * scale), the product formed in FP64 and rounded once.
std::vector<float> dequantize_fp8_activations(const Fp8Activations& q);
// The same values unrounded (exact): for fp64 oracles.
std::vector<double> dequantize_fp8_activations_f64(const Fp8Activations& q);
int64_t fp8_activation_groups(int64_t cols);  // ceil(cols / 128)

// ---- canonical weight matrix of one expert --------------------------------------------------------
// A [rows, cols] matrix, K-major (cols = reduction dimension K). For W13, rows = 2I (gate rows then
// up rows) and cols = H; for W2, rows = H and cols = I.
struct QuantizedMatrix {
  WeightFormat format = WeightFormat::kBf16;
  int64_t rows = 0, cols = 0;
  // kBf16: rows*cols uint16 BF16 bit patterns stored little-endian (2 bytes each).
  // kFp8Block: rows*cols E4M3 bytes.
  // kNvfp4 / kMxfp4: rows*ceil(cols/2) bytes, low nibble = even column.
  std::vector<uint8_t> data;
  // kFp8Block: [ceil(rows/128), ceil(cols/128)] FP32 dequant factors (DeepSeek weight_scale_inv).
  std::vector<float> block_scales;
  // kNvfp4: [rows, cols/16] E4M3 bytes.  kMxfp4: [rows, cols/32] UE8M0 bytes.
  std::vector<uint8_t> group_scales;
  // kNvfp4 only: FP32 dequant factor for rows [0, rows/2) (index 0) and [rows/2, rows) (index 1).
  // Equal for W2 and for W13 whose gate and up share a global scale. Applied per output row, so a
  // different gate/up global is exact, never approximated.
  std::array<float, 2> global_scales{1.0f, 1.0f};

  // Throws megamoe::Error naming the field whose size is wrong (and the expected size), a cols that
  // is not a multiple of the group (nvfp4: 16, mxfp4: 32; fp8_block and bf16 take any shape, the last
  // block may be partial), a non-finite or non-positive nvfp4 global, or a global other than {1, 1}
  // on a format that has none.
  void validate() const;

  int64_t expected_data_bytes() const;
  int64_t expected_block_scales() const;
  int64_t expected_group_scales() const;
  // kNvfp4 / kMxfp4: the E2M1 code of element (r, c) (no bounds check).
  uint8_t fp4_code(int64_t r, int64_t c) const;
};

// value(r, c) as FP32 exactly as the format defines it:
//   kBf16:     bf16(data)
//   kFp8Block: e4m3(data) * block_scales[r/128, c/128]
//   kNvfp4:    e2m1(nibble) * e4m3(group_scales[r, c/16]) * global_scales[r < rows/2 ? 0 : 1]
//   kMxfp4:    e2m1(nibble) * ue8m0(group_scales[r, c/32])
// The products are computed in FP64 and are exact (at most 4+4+24 significant bits), then rounded
// to FP32 (documented for NVFP4, where the global scale may make the product inexact).
std::vector<float> dequantize(const QuantizedMatrix& matrix);
// The exact FP64 products, not rounded to FP32 (fp64 oracles; differs from dequantize only where the
// product needs more than 24 significant bits, e.g. an NVFP4 global that is not a power of two).
std::vector<double> dequantize_f64(const QuantizedMatrix& matrix);

// Online quantization of a dense FP32 matrix (used by --quantization and by tests).
//   kFp8Block: scale = amax(block)/448 (floor kFp8ScaleEps), q = e4m3(w / scale).
//   kNvfp4: global = amax(all)/(448*6) (1 if zero); group scale s = e4m3(amax(group)/6/global);
//           q = e2m1(w / (e4m3_to_f32(s) * global)); a zero group scale gives zero codes.
//   kMxfp4: OCP: e = floor(log2(amax(group))) - 2 (clamped to [-127, 127]), q = e2m1(w / 2^e).
// All arithmetic is FP32 in the order written (amax/6.0f/global; e4m3(s)*global, then w / that).
// Throws megamoe::Error naming the element when a weight is inf or NaN.
QuantizedMatrix quantize(const float* w, int64_t rows, int64_t cols, WeightFormat format);
// kNvfp4 with one global per half (rows [0, rows/2) and [rows/2, rows)), as a W13 whose gate and up
// were quantized separately has.
QuantizedMatrix quantize_nvfp4_per_half(const float* w, int64_t rows, int64_t cols);

}  // namespace megamoe::formats
