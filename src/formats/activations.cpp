// FP8 E4M3 activations with one FP32 scale per token per 128 channels (formula in formats.h).
#include <cmath>

#include "megamoe/error.h"
#include "megamoe/formats.h"

namespace megamoe::formats {

int64_t fp8_activation_groups(int64_t cols) { return (cols + kFp8BlockSize - 1) / kFp8BlockSize; }

Fp8Activations quantize_fp8_activations(const float* x, int64_t rows, int64_t cols) {
  MEGAMOE_CHECK(rows >= 0 && cols >= 0, "activation shape [", rows, ", ", cols, "] must be non-negative");
  MEGAMOE_CHECK(x != nullptr || rows * cols == 0, "activations: data pointer is null");
  Fp8Activations q;
  q.rows = rows;
  q.cols = cols;
  const int64_t groups = fp8_activation_groups(cols);
  q.values.resize(static_cast<size_t>(rows * cols));
  q.scales.resize(static_cast<size_t>(rows * groups));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t begin = g * kFp8BlockSize;
      const int64_t end = std::min(cols, begin + kFp8BlockSize);
      // NOTES: fmaxf ignores NaN (as the GPU's max does), so a NaN element does not poison the
      // scale of its group; it becomes an E4M3 NaN below.
      float amax = kFp8ScaleEps;
      for (int64_t c = begin; c < end; ++c) amax = std::fmax(amax, std::fabs(x[r * cols + c]));
      const float scale = amax / kE4M3Max;
      q.scales[static_cast<size_t>(r * groups + g)] = scale;
      for (int64_t c = begin; c < end; ++c) {
        q.values[static_cast<size_t>(r * cols + c)] = f32_to_e4m3(x[r * cols + c] / scale, Overflow::kSaturate);
      }
    }
  }
  return q;
}

namespace {
template <typename Out>
std::vector<Out> dequantize_activations_as(const Fp8Activations& q) {
  const int64_t groups = fp8_activation_groups(q.cols);
  MEGAMOE_CHECK(q.rows >= 0 && q.cols >= 0, "activation shape [", q.rows, ", ", q.cols, "] must be non-negative");
  MEGAMOE_CHECK(static_cast<int64_t>(q.values.size()) == q.rows * q.cols, "Fp8Activations.values has ",
                q.values.size(), " elements, expected rows*cols = ", q.rows * q.cols);
  MEGAMOE_CHECK(static_cast<int64_t>(q.scales.size()) == q.rows * groups, "Fp8Activations.scales has ",
                q.scales.size(), " elements, expected rows*ceil(cols/128) = ", q.rows * groups);
  std::vector<Out> out(q.values.size());
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t c = 0; c < q.cols; ++c) {
      // E4M3 (4 significant bits) times an FP32 scale is exact in FP64.
      const double value = static_cast<double>(e4m3_to_f32(q.values[static_cast<size_t>(r * q.cols + c)])) *
                           q.scales[static_cast<size_t>(r * groups + c / kFp8BlockSize)];
      out[static_cast<size_t>(r * q.cols + c)] = static_cast<Out>(value);
    }
  }
  return out;
}
}  // namespace

std::vector<float> dequantize_fp8_activations(const Fp8Activations& q) { return dequantize_activations_as<float>(q); }
std::vector<double> dequantize_fp8_activations_f64(const Fp8Activations& q) {
  return dequantize_activations_as<double>(q);
}

}  // namespace megamoe::formats
