// Scalar conversions between FP32 and the narrow formats (BF16, FP16, FP8 E4M3/E5M2, E2M1, UE8M0).
//
// NOTES: one generic "minifloat" encoder does every format except BF16 (which is FP32 with the low
// 16 mantissa bits dropped, so the classic add-and-shift RNE trick is exact). The encoder works on
// FP32 bit patterns:
//   normal results:    add (half ulp - 1 + lowest kept bit) to the FP32 bits and shift: RNE, and a
//                      mantissa carry correctly bumps the exponent;
//   subnormal results: add a power of two whose ulp is the target's subnormal quantum, letting the
//                      FPU round (RNE; this file must not be built with -ffast-math or FTZ/DAZ);
//   overflow:          judged on the rounded code (code > max finite code), i.e. after rounding
//                      with an unbounded exponent as IEEE 754 / OCP require.
// Decoding uses tables built once from the obviously-correct formula in decode().
#include <array>
#include <cmath>
#include <cstring>

#include "megamoe/error.h"
#include "megamoe/formats.h"

namespace megamoe::formats {
namespace {

struct MiniFloat {
  int exponent_bits;
  int mantissa_bits;
  int bias;
  bool ieee_specials;     // top exponent field reserved for inf (mantissa 0) and NaN (FP16, E5M2)
  bool has_nan;           // false only for E2M1
  int max_exponent;       // unbiased exponent of the largest finite value
  uint32_t max_code;      // positive largest finite magnitude
  uint32_t nan_code;      // positive canonical NaN (sign is OR-ed in)
  uint32_t inf_code;      // positive infinity (ieee_specials only)
};

constexpr MiniFloat kFp16{5, 10, 15, true, true, 15, 0x7BFF, 0x7E00, 0x7C00};
constexpr MiniFloat kE4M3{4, 3, 7, false, true, 8, 0x7E, 0x7F, 0};
constexpr MiniFloat kE5M2{5, 2, 15, true, true, 15, 0x7B, 0x7F, 0x7C};
constexpr MiniFloat kE2M1{2, 1, 1, false, false, 2, 0x7, 0, 0};

uint32_t f32_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

float f32_from_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

uint32_t encode(const MiniFloat& fmt, float value, Overflow overflow) {
  const uint32_t bits = f32_bits(value);
  const uint32_t sign = (bits >> 31) << (fmt.exponent_bits + fmt.mantissa_bits);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return fmt.has_nan ? (sign | fmt.nan_code) : fmt.max_code;  // NaN (E2M1: +6)
  const bool saturate = overflow == Overflow::kSaturate || !fmt.has_nan;
  const uint32_t overflowed = saturate ? (sign | fmt.max_code) : (sign | (fmt.ieee_specials ? fmt.inf_code : fmt.nan_code));
  // |x| >= 2^(max_exponent + 1) (this includes inf) overflows whatever the rounding.
  if (magnitude >= static_cast<uint32_t>(fmt.max_exponent + 1 + 127) << 23) return overflowed;

  const int min_normal_exponent = 1 - fmt.bias;
  const int dropped_bits = 23 - fmt.mantissa_bits;
  uint32_t code;
  if (magnitude < static_cast<uint32_t>(min_normal_exponent + 127) << 23) {
    // Subnormal (or zero) result: 2^(min_normal_exponent + dropped_bits) has an ulp equal to the
    // target's subnormal quantum, so the FPU's RNE addition does the rounding; the difference of the
    // bit patterns is the code (2^mantissa_bits when it rounds up to the smallest normal: correct).
    const uint32_t magic_bits = static_cast<uint32_t>(min_normal_exponent + dropped_bits + 127) << 23;
    code = f32_bits(f32_from_bits(magnitude) + f32_from_bits(magic_bits)) - magic_bits;
  } else {
    const uint32_t lowest_kept_bit = (magnitude >> dropped_bits) & 1u;
    const uint32_t rebiased = magnitude - (static_cast<uint32_t>(127 - fmt.bias) << 23);
    code = (rebiased + (1u << (dropped_bits - 1)) - 1u + lowest_kept_bit) >> dropped_bits;
  }
  if (code > fmt.max_code) return overflowed;
  return sign | code;
}

float decode(const MiniFloat& fmt, uint32_t bits) {
  const uint32_t mantissa_mask = (1u << fmt.mantissa_bits) - 1;
  const uint32_t exponent_mask = (1u << fmt.exponent_bits) - 1;
  const bool negative = (bits >> (fmt.exponent_bits + fmt.mantissa_bits)) & 1u;
  const uint32_t exponent_field = (bits >> fmt.mantissa_bits) & exponent_mask;
  const uint32_t mantissa = bits & mantissa_mask;
  double magnitude;
  if (fmt.ieee_specials && exponent_field == exponent_mask) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else if (fmt.has_nan && !fmt.ieee_specials && (bits & fmt.nan_code) == fmt.nan_code) {
    magnitude = NAN;  // E4M3: S.1111.111
  } else if (exponent_field == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), 1 - fmt.bias - fmt.mantissa_bits);
  } else {
    magnitude = std::ldexp(static_cast<double>(mantissa + (1u << fmt.mantissa_bits)),
                           static_cast<int>(exponent_field) - fmt.bias - fmt.mantissa_bits);
  }
  return static_cast<float>(negative ? -magnitude : magnitude);
}

template <size_t N>
std::array<float, N> decode_table(const MiniFloat& fmt) {
  std::array<float, N> table{};
  for (uint32_t bits = 0; bits < N; ++bits) table[bits] = decode(fmt, bits);
  return table;
}

}  // namespace

uint16_t f32_to_bf16(float value) {
  const uint32_t bits = f32_bits(value);
  if (std::isnan(value)) return static_cast<uint16_t>(((bits >> 16) & 0x8000u) | 0x7FC0u);
  // RNE on the dropped 16 bits: add 0x7FFF plus the lowest kept bit, then truncate. Overflow of the
  // mantissa carries into the exponent, and past the largest finite value into +-inf (IEEE).
  const uint32_t lowest_kept_bit = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7FFFu + lowest_kept_bit) >> 16);
}

float bf16_to_f32(uint16_t bits) {
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof value);
  return value;
}

uint16_t f32_to_f16(float value) { return static_cast<uint16_t>(encode(kFp16, value, Overflow::kNaN)); }
float f16_to_f32(uint16_t bits) {
  static const std::array<float, 65536> table = decode_table<65536>(kFp16);
  return table[bits];
}

uint8_t f32_to_e4m3(float value, Overflow overflow) { return static_cast<uint8_t>(encode(kE4M3, value, overflow)); }
float e4m3_to_f32(uint8_t bits) {
  static const std::array<float, 256> table = decode_table<256>(kE4M3);
  return table[bits];
}

uint8_t f32_to_e5m2(float value, Overflow overflow) { return static_cast<uint8_t>(encode(kE5M2, value, overflow)); }
float e5m2_to_f32(uint8_t bits) {
  static const std::array<float, 256> table = decode_table<256>(kE5M2);
  return table[bits];
}

uint8_t f32_to_e2m1(float value) { return static_cast<uint8_t>(encode(kE2M1, value, Overflow::kSaturate)); }
float e2m1_to_f32(uint8_t code) {
  MEGAMOE_CHECK(code < 16, "E2M1 code ", static_cast<int>(code), " must be < 16");
  static const std::array<float, 16> table = decode_table<16>(kE2M1);
  return table[code];
}

float ue8m0_to_f32(uint8_t bits) {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 255; ++b) t[b] = std::ldexp(1.0f, b - 127);  // b = 0 -> 2^-127, an exact FP32 subnormal
    t[255] = NAN;
    return t;
  }();
  return table[bits];
}

uint8_t f32_to_ue8m0_ceil(float value) {
  if (std::isnan(value) || std::isinf(value)) return 0xFF;
  if (value <= 0.0f) return 0;  // smallest scale 2^-127 (documented; callers pass value > 0)
  int exponent = 0;
  const double fraction = std::frexp(static_cast<double>(value), &exponent);  // value = f * 2^exponent
  const int ceil_log2 = fraction == 0.5 ? exponent - 1 : exponent;
  if (ceil_log2 < -127) return 0;
  if (ceil_log2 > 127) return 0xFF;  // 2^128 is not representable: NaN, never a silent clamp
  return static_cast<uint8_t>(ceil_log2 + 127);
}

}  // namespace megamoe::formats
