// QuantizedMatrix: layout checks, exact dequantization and online quantization (formulas in
// formats.h and docs/formats.md).
#include <algorithm>
#include <cmath>

#include "megamoe/error.h"
#include "megamoe/formats.h"

namespace megamoe::formats {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

float amax_of(const float* w, int64_t cols, int64_t row_begin, int64_t row_end, int64_t col_begin, int64_t col_end) {
  float amax = 0.0f;
  for (int64_t r = row_begin; r < row_end; ++r)
    for (int64_t c = col_begin; c < col_end; ++c) amax = std::fmax(amax, std::fabs(w[r * cols + c]));
  return amax;
}

void put_nibble(std::vector<uint8_t>& data, int64_t row_bytes, int64_t r, int64_t c, uint8_t code) {
  uint8_t& byte = data[static_cast<size_t>(r * row_bytes + c / 2)];
  byte = (c & 1) ? static_cast<uint8_t>((byte & 0x0F) | (code << 4)) : static_cast<uint8_t>((byte & 0xF0) | code);
}

// NVFP4 for rows [row_begin, row_end) with dequant factor `global` (written by the caller).
void quantize_nvfp4_rows(const float* w, int64_t cols, int64_t row_begin, int64_t row_end, float global,
                         QuantizedMatrix& q) {
  const int64_t groups = cols / kNvfp4GroupSize;
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t begin = g * kNvfp4GroupSize;
      const float amax = amax_of(w, cols, r, r + 1, begin, begin + kNvfp4GroupSize);
      const uint8_t scale_code = f32_to_e4m3(amax / kE2M1Max / global, Overflow::kSaturate);
      q.group_scales[static_cast<size_t>(r * groups + g)] = scale_code;
      const float step = e4m3_to_f32(scale_code) * global;  // FP32 product, as the GPU computes it
      for (int64_t c = begin; c < begin + kNvfp4GroupSize; ++c) {
        put_nibble(q.data, cols / 2, r, c, step == 0.0f ? uint8_t{0} : f32_to_e2m1(w[r * cols + c] / step));
      }
    }
  }
}

float nvfp4_global_for(float amax) { return amax == 0.0f ? 1.0f : amax / (kE4M3Max * kE2M1Max); }

void check_quantize_args(const float* w, int64_t rows, int64_t cols) {
  MEGAMOE_CHECK(rows >= 0 && cols >= 0, "quantize: shape [", rows, ", ", cols, "] must be non-negative");
  MEGAMOE_CHECK(w != nullptr || rows * cols == 0, "quantize: weight pointer is null");
  // A non-finite weight would turn a whole block's or tensor's scale into inf/NaN: reject it.
  for (int64_t i = 0; i < rows * cols; ++i) {
    MEGAMOE_CHECK(std::isfinite(w[i]), "quantize: weight[", i / cols, ", ", i % cols, "] = ", w[i], " is not finite");
  }
}

}  // namespace

int64_t QuantizedMatrix::expected_data_bytes() const {
  switch (format) {
    case WeightFormat::kBf16: return rows * cols * 2;
    case WeightFormat::kFp8Block: return rows * cols;
    case WeightFormat::kNvfp4:
    case WeightFormat::kMxfp4: return rows * ceil_div(cols, 2);
  }
  return 0;
}

int64_t QuantizedMatrix::expected_block_scales() const {
  return format == WeightFormat::kFp8Block ? ceil_div(rows, kFp8BlockSize) * ceil_div(cols, kFp8BlockSize) : 0;
}

int64_t QuantizedMatrix::expected_group_scales() const {
  if (format == WeightFormat::kNvfp4) return rows * (cols / kNvfp4GroupSize);
  if (format == WeightFormat::kMxfp4) return rows * (cols / kMxfp4GroupSize);
  return 0;
}

void QuantizedMatrix::validate() const {
  const std::string_view name = weight_format_name(format);
  MEGAMOE_CHECK(rows >= 0 && cols >= 0, name, " matrix: rows = ", rows, " and cols = ", cols, " must be >= 0");
  if (format == WeightFormat::kNvfp4) {
    MEGAMOE_CHECK(cols % kNvfp4GroupSize == 0, "nvfp4 matrix: cols = ", cols, " must be a multiple of ",
                  kNvfp4GroupSize, " (one E4M3 scale per 16 elements)");
  }
  if (format == WeightFormat::kMxfp4) {
    MEGAMOE_CHECK(cols % kMxfp4GroupSize == 0, "mxfp4 matrix: cols = ", cols, " must be a multiple of ",
                  kMxfp4GroupSize, " (one UE8M0 scale per 32 elements)");
  }
  MEGAMOE_CHECK(static_cast<int64_t>(data.size()) == expected_data_bytes(), name, " matrix [", rows, ", ", cols,
                "]: data has ", data.size(), " bytes, expected ", expected_data_bytes());
  MEGAMOE_CHECK(static_cast<int64_t>(block_scales.size()) == expected_block_scales(), name, " matrix [", rows,
                ", ", cols, "]: block_scales has ", block_scales.size(), " elements, expected ",
                expected_block_scales(),
                format == WeightFormat::kFp8Block ? " = ceil(rows/128)*ceil(cols/128)" : " (unused by this format)");
  MEGAMOE_CHECK(static_cast<int64_t>(group_scales.size()) == expected_group_scales(), name, " matrix [", rows,
                ", ", cols, "]: group_scales has ", group_scales.size(), " elements, expected ",
                expected_group_scales(),
                format == WeightFormat::kNvfp4   ? " = rows*cols/16"
                : format == WeightFormat::kMxfp4 ? " = rows*cols/32"
                                                 : " (unused by this format)");
  if (format == WeightFormat::kNvfp4) {
    for (int half = 0; half < 2; ++half) {
      MEGAMOE_CHECK(std::isfinite(global_scales[half]) && global_scales[half] > 0.0f, "nvfp4 matrix: global_scales[",
                    half, "] = ", global_scales[half], " must be finite and > 0");
    }
  } else {
    MEGAMOE_CHECK(global_scales[0] == 1.0f && global_scales[1] == 1.0f, name, " matrix: global_scales = {",
                  global_scales[0], ", ", global_scales[1], "} must be {1, 1} (used by nvfp4 only)");
  }
}

uint8_t QuantizedMatrix::fp4_code(int64_t r, int64_t c) const {
  const uint8_t byte = data[static_cast<size_t>(r * ceil_div(cols, 2) + c / 2)];
  return (c & 1) ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0x0F);
}

namespace {
// The exact value of every element in FP64 (every product has at most 4 + 4 + 24 significant bits),
// then converted to Out (one rounding for float, none for double).
template <typename Out>
std::vector<Out> dequantize_as(const QuantizedMatrix& m) {
  m.validate();
  std::vector<Out> out(static_cast<size_t>(m.rows * m.cols));
  const int64_t block_cols = ceil_div(m.cols, kFp8BlockSize);
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) {
      const size_t i = static_cast<size_t>(r * m.cols + c);
      double value = 0.0;
      switch (m.format) {
        case WeightFormat::kBf16:
          value = bf16_to_f32(static_cast<uint16_t>(m.data[2 * i] | (m.data[2 * i + 1] << 8)));
          break;
        case WeightFormat::kFp8Block:
          value = static_cast<double>(e4m3_to_f32(m.data[i])) *
                  m.block_scales[static_cast<size_t>((r / kFp8BlockSize) * block_cols + c / kFp8BlockSize)];
          break;
        case WeightFormat::kNvfp4:
          value = static_cast<double>(e2m1_to_f32(m.fp4_code(r, c))) *
                  e4m3_to_f32(m.group_scales[static_cast<size_t>(r * (m.cols / kNvfp4GroupSize) + c / kNvfp4GroupSize)]) *
                  m.global_scales[r < m.rows / 2 ? 0 : 1];
          break;
        case WeightFormat::kMxfp4:
          value = static_cast<double>(e2m1_to_f32(m.fp4_code(r, c))) *
                  ue8m0_to_f32(m.group_scales[static_cast<size_t>(r * (m.cols / kMxfp4GroupSize) + c / kMxfp4GroupSize)]);
          break;
      }
      out[i] = static_cast<Out>(value);
    }
  }
  return out;
}
}  // namespace

std::vector<float> dequantize(const QuantizedMatrix& m) { return dequantize_as<float>(m); }
std::vector<double> dequantize_f64(const QuantizedMatrix& m) { return dequantize_as<double>(m); }

QuantizedMatrix quantize(const float* w, int64_t rows, int64_t cols, WeightFormat format) {
  check_quantize_args(w, rows, cols);
  QuantizedMatrix q;
  q.format = format;
  q.rows = rows;
  q.cols = cols;
  if (format == WeightFormat::kNvfp4 || format == WeightFormat::kMxfp4) {
    const int group = format == WeightFormat::kNvfp4 ? kNvfp4GroupSize : kMxfp4GroupSize;
    MEGAMOE_CHECK(cols % group == 0, "quantize ", weight_format_name(format), ": cols = ", cols,
                  " must be a multiple of ", group);
  }
  q.data.assign(static_cast<size_t>(q.expected_data_bytes()), 0);
  q.block_scales.assign(static_cast<size_t>(q.expected_block_scales()), 0.0f);
  q.group_scales.assign(static_cast<size_t>(q.expected_group_scales()), 0);

  switch (format) {
    case WeightFormat::kBf16:
      for (int64_t i = 0; i < rows * cols; ++i) {
        const uint16_t bits = f32_to_bf16(w[i]);
        q.data[static_cast<size_t>(2 * i)] = static_cast<uint8_t>(bits & 0xFF);
        q.data[static_cast<size_t>(2 * i + 1)] = static_cast<uint8_t>(bits >> 8);
      }
      break;
    case WeightFormat::kFp8Block: {
      const int64_t block_cols = ceil_div(cols, kFp8BlockSize);
      for (int64_t br = 0; br < ceil_div(rows, kFp8BlockSize); ++br) {
        for (int64_t bc = 0; bc < block_cols; ++bc) {
          const int64_t r0 = br * kFp8BlockSize, r1 = std::min(rows, r0 + kFp8BlockSize);
          const int64_t c0 = bc * kFp8BlockSize, c1 = std::min(cols, c0 + kFp8BlockSize);
          const float scale = std::fmax(amax_of(w, cols, r0, r1, c0, c1), kFp8ScaleEps) / kE4M3Max;
          q.block_scales[static_cast<size_t>(br * block_cols + bc)] = scale;
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t c = c0; c < c1; ++c)
              q.data[static_cast<size_t>(r * cols + c)] = f32_to_e4m3(w[r * cols + c] / scale, Overflow::kSaturate);
        }
      }
      break;
    }
    case WeightFormat::kNvfp4: {
      const float global = nvfp4_global_for(amax_of(w, cols, 0, rows, 0, cols));
      q.global_scales = {global, global};
      quantize_nvfp4_rows(w, cols, 0, rows, global, q);
      break;
    }
    case WeightFormat::kMxfp4: {
      const int64_t groups = cols / kMxfp4GroupSize;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t begin = g * kMxfp4GroupSize;
          const float amax = amax_of(w, cols, r, r + 1, begin, begin + kMxfp4GroupSize);
          // OCP MX: shared exponent = floor(log2(amax)) - emax(E2M1) = floor(log2(amax)) - 2.
          int exponent = -127;
          if (amax > 0.0f) {
            int frexp_exponent = 0;
            std::frexp(amax, &frexp_exponent);
            exponent = std::clamp(frexp_exponent - 1 - 2, -127, 127);
          }
          q.group_scales[static_cast<size_t>(r * groups + g)] = static_cast<uint8_t>(exponent + 127);
          for (int64_t c = begin; c < begin + kMxfp4GroupSize; ++c) {
            // Scaling by a power of two is exact (the scaled value is < 8, so never overflows).
            put_nibble(q.data, cols / 2, r, c, f32_to_e2m1(std::ldexp(w[r * cols + c], -exponent)));
          }
        }
      }
      break;
    }
  }
  return q;
}

QuantizedMatrix quantize_nvfp4_per_half(const float* w, int64_t rows, int64_t cols) {
  check_quantize_args(w, rows, cols);
  MEGAMOE_CHECK(cols % kNvfp4GroupSize == 0, "quantize nvfp4: cols = ", cols, " must be a multiple of ",
                kNvfp4GroupSize);
  QuantizedMatrix q;
  q.format = WeightFormat::kNvfp4;
  q.rows = rows;
  q.cols = cols;
  q.data.assign(static_cast<size_t>(q.expected_data_bytes()), 0);
  q.group_scales.assign(static_cast<size_t>(q.expected_group_scales()), 0);
  const int64_t half = rows / 2;
  q.global_scales = {nvfp4_global_for(amax_of(w, cols, 0, half, 0, cols)),
                     nvfp4_global_for(amax_of(w, cols, half, rows, 0, cols))};
  quantize_nvfp4_rows(w, cols, 0, half, q.global_scales[0], q);
  quantize_nvfp4_rows(w, cols, half, rows, q.global_scales[1], q);
  return q;
}

}  // namespace megamoe::formats
