// A small, independent E4M3 / BF16 codec for judging kernels (table-based nearest-even search, no
// bit tricks), shared by the GPU tests and cross-checked against megamoe::formats in a CPU test.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace megamoe::testing {

inline float e4m3_decode(uint8_t bits) {
  const int sign = bits >> 7, exponent = (bits >> 3) & 15, mantissa = bits & 7;
  if (exponent == 15 && mantissa == 7) return NAN;
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                        : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
  return sign ? -magnitude : magnitude;
}

// Round to nearest E4M3, ties to the even code, saturating at 448 (codes 0x00..0x7E are increasing);
// the sign is kept, so a negative value that rounds to zero gives -0 (0x80) like the hardware cvt.
// The search reads the decoded magnitudes of codes 0x00..0x7E from a table made once by e4m3_decode
// (tests encode tens of millions of values; ldexp per probe made that seconds per problem).
inline const float* e4m3_positive_table() {
  static const auto table = [] {
    struct Table { float value[0x7F]; } t{};
    for (int code = 0; code < 0x7F; ++code) t.value[code] = e4m3_decode(static_cast<uint8_t>(code));
    return t;
  }();
  return table.value;
}

inline uint8_t e4m3_encode(double value) {
  const float* decoded = e4m3_positive_table();
  const double magnitude = std::min(std::fabs(value), 448.0);
  int low = 0, high = 0x7E;
  while (high - low > 1) {  // largest code with decode <= magnitude
    const int mid = (low + high) / 2;
    (decoded[mid] <= magnitude ? low : high) = mid;
  }
  if (decoded[high] <= magnitude) low = high;
  int code = low;
  if (low < 0x7E) {
    const double below = decoded[low], above = decoded[low + 1];
    if (magnitude - below > above - magnitude || (magnitude - below == above - magnitude && (low & 1))) code = low + 1;
  }
  return static_cast<uint8_t>(code | (std::signbit(value) ? 0x80 : 0));  // -0 for negatives rounding to 0, as cvt.rn
}

inline uint16_t bf16_round(float value) {  // RNE, finite inputs
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}
inline float bf16_decode(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

}  // namespace megamoe::testing
