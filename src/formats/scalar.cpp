// Scalar conversions between FP32 and the narrow formats (BF16, FP16, FP8 E4M3/E5M2, E2M1, UE8M0).
//
// NOTES: one generic "minifloat" encoder does every format except BF16 (which is FP32 with the low
// 16 mantissa bits dropped, so the classic add-and-shift RNE trick is exact and much faster). The
// encoder works in double: |x| (24 significant bits) divided by a power-of-two quantum is exact, so
// the only rounding is the explicit round-half-to-even below.
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
  double max_finite;
  uint32_t max_code;      // positive largest finite magnitude
  uint32_t nan_code;      // positive canonical NaN (sign is OR-ed in)
  uint32_t inf_code;      // positive infinity (ieee_specials only)
};

constexpr MiniFloat kFp16{5, 10, 15, true, true, 65504.0, 0x7BFF, 0x7E00, 0x7C00};
constexpr MiniFloat kE4M3{4, 3, 7, false, true, 448.0, 0x7E, 0x7F, 0};
constexpr MiniFloat kE5M2{5, 2, 15, true, true, 57344.0, 0x7B, 0x7F, 0x7C};
constexpr MiniFloat kE2M1{2, 1, 1, false, false, 6.0, 0x7, 0, 0};

double round_half_to_even(double q) {
  const double lower = std::floor(q);
  const double fraction = q - lower;  // exact: q < 2^12 here
  if (fraction > 0.5) return lower + 1.0;
  if (fraction < 0.5) return lower;
  return std::fmod(lower, 2.0) == 0.0 ? lower : lower + 1.0;
}

// floor(log2(a)) for finite a > 0.
int floor_log2(double a) {
  int exponent = 0;
  std::frexp(a, &exponent);  // a = f * 2^exponent, f in [0.5, 1)
  return exponent - 1;
}

uint32_t encode(const MiniFloat& fmt, float value, Overflow overflow) {
  const uint32_t sign = std::signbit(value) ? (1u << (fmt.exponent_bits + fmt.mantissa_bits)) : 0u;
  if (std::isnan(value)) return fmt.has_nan ? (sign | fmt.nan_code) : fmt.max_code;  // E2M1: NaN -> +6
  const bool saturate = overflow == Overflow::kSaturate || !fmt.has_nan;
  auto overflowed = [&]() -> uint32_t {
    if (saturate) return sign | fmt.max_code;
    return sign | (fmt.ieee_specials ? fmt.inf_code : fmt.nan_code);
  };
  if (std::isinf(value)) return overflowed();
  const double magnitude = std::fabs(static_cast<double>(value));
  if (magnitude == 0.0) return sign;

  const int min_normal_exponent = 1 - fmt.bias;
  const int exponent = std::max(floor_log2(magnitude), min_normal_exponent);
  const double quantum = std::ldexp(1.0, exponent - fmt.mantissa_bits);
  const double rounded = round_half_to_even(magnitude / quantum) * quantum;
  // Overflow is judged after rounding with an unbounded exponent (IEEE 754 / OCP rule): e.g. E4M3
  // 464 is the midpoint of 448 and (unrepresentable) 480 and rounds to even 448; 464.1 overflows.
  if (rounded > fmt.max_finite) return overflowed();
  if (rounded == 0.0) return sign;

  const int rounded_exponent = floor_log2(rounded);
  if (rounded_exponent < min_normal_exponent) {  // subnormal: exponent field 0
    return sign | static_cast<uint32_t>(rounded / std::ldexp(1.0, min_normal_exponent - fmt.mantissa_bits));
  }
  const uint32_t mantissa = static_cast<uint32_t>(rounded / std::ldexp(1.0, rounded_exponent - fmt.mantissa_bits)) -
                            (1u << fmt.mantissa_bits);
  const uint32_t exponent_field = static_cast<uint32_t>(rounded_exponent + fmt.bias);
  return sign | (exponent_field << fmt.mantissa_bits) | mantissa;
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

uint32_t f32_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
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
float f16_to_f32(uint16_t bits) { return decode(kFp16, bits); }

uint8_t f32_to_e4m3(float value, Overflow overflow) { return static_cast<uint8_t>(encode(kE4M3, value, overflow)); }
float e4m3_to_f32(uint8_t bits) { return decode(kE4M3, bits); }

uint8_t f32_to_e5m2(float value, Overflow overflow) { return static_cast<uint8_t>(encode(kE5M2, value, overflow)); }
float e5m2_to_f32(uint8_t bits) { return decode(kE5M2, bits); }

uint8_t f32_to_e2m1(float value) { return static_cast<uint8_t>(encode(kE2M1, value, Overflow::kSaturate)); }
float e2m1_to_f32(uint8_t code) {
  MEGAMOE_CHECK(code < 16, "E2M1 code ", static_cast<int>(code), " must be < 16");
  return decode(kE2M1, code);
}

float ue8m0_to_f32(uint8_t bits) {
  if (bits == 0xFF) return NAN;
  return std::ldexp(1.0f, static_cast<int>(bits) - 127);  // bits 0 -> 2^-127 (an FP32 subnormal, exact)
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
