// The W4A8 weight decode rule of the grouped GEMM (src/kernels/grouped_gemm.h, "W4A8"), computed from a
// canonical NVFP4 / MXFP4 matrix independently of the kernel's packing code: the effective weights a
// CPU reference must use to be "rounded like the kernel".
//   p(B) = max p with 6 * max|scale in 128x128 block B| * 2^p <= 448  (0 for an all-zero block)
//   w8   = e4m3_rn(e2m1 * scale * 2^p(B)),   factor(B) = global * 2^-p(B) (FP32),   weight = w8 * factor
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/fp8_codec.h"
#include "megamoe/formats.h"

namespace megamoe::testing {

struct W4a8Decoded {
  std::vector<double> w8;      // [rows, cols] decoded E4M3 values
  std::vector<double> factor;  // [rows/128, cols/128] FP32 block factors
  int min_p = 1 << 30, max_p = -(1 << 30);
  double weight(int64_t r, int64_t c, int64_t cols) const {
    return w8[r * cols + c] * factor[(r / 128) * (cols / 128) + c / 128];
  }
};

inline double w4a8_scale_value(WeightFormat f, uint8_t bits) {
  return f == WeightFormat::kNvfp4 ? static_cast<double>(formats::e4m3_to_f32(bits))
                                   : std::ldexp(1.0, static_cast<int>(bits) - 127);
}

inline W4a8Decoded decode_w4a8_reference(const formats::QuantizedMatrix& m) {
  const int group = m.format == WeightFormat::kNvfp4 ? 16 : 32;
  const int64_t rows = m.rows, cols = m.cols, groups = cols / group;
  W4a8Decoded d;
  d.w8.assign(rows * cols, 0.0);
  d.factor.assign((rows / 128) * (cols / 128), 0.0);
  for (int64_t rb = 0; rb < rows / 128; ++rb)
    for (int64_t kb = 0; kb < cols / 128; ++kb) {
      double smax = 0;
      for (int64_t r = rb * 128; r < rb * 128 + 128; ++r)
        for (int64_t c = kb * 128; c < kb * 128 + 128; c += group)
          smax = std::max(smax, std::fabs(w4a8_scale_value(m.format, m.group_scales[r * groups + c / group])));
      int p = 0;
      if (smax > 0) {
        p = -300;
        while (6.0 * smax * std::ldexp(1.0, p + 1) <= 448.0) ++p;
      }
      d.min_p = std::min(d.min_p, p);
      d.max_p = std::max(d.max_p, p);
      const double global = m.format == WeightFormat::kNvfp4 ? m.global_scales[rb * 128 < rows / 2 ? 0 : 1] : 1.0;
      d.factor[rb * (cols / 128) + kb] = static_cast<float>(std::ldexp(global, -p));
      for (int64_t r = rb * 128; r < rb * 128 + 128; ++r)
        for (int64_t c = kb * 128; c < kb * 128 + 128; ++c) {
          const double exact = static_cast<double>(formats::e2m1_to_f32(m.fp4_code(r, c))) *
                               w4a8_scale_value(m.format, m.group_scales[r * groups + c / group]) * std::ldexp(1.0, p);
          d.w8[r * cols + c] = e4m3_decode(e4m3_encode(exact));
        }
    }
  return d;
}

}  // namespace megamoe::testing
