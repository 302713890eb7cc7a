// Host helpers for the grouped-GEMM GPU tests: an exact E4M3 codec, block quantizers and a device
// buffer. Independent of the kernels (table-based nearest-even search), so it can judge them.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/fp8_codec.h"
#include "megamoe/error_cuda.h"

namespace megamoe::testing {

// Per-row per-128 FP8 quantization (the formats.h rule, in double for the division).
inline void quantize_rows(const std::vector<float>& x, int64_t rows, int cols, std::vector<uint8_t>& q,
                          std::vector<float>& scales) {
  q.assign(rows * cols, 0);
  scales.assign(rows * (cols / 128), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int g = 0; g < cols / 128; ++g) {
      float amax = 0;
      for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(x[r * cols + g * 128 + i]));
      const float scale = std::max(amax, 1e-10f) / 448.0f;
      scales[r * (cols / 128) + g] = scale;
      for (int i = 0; i < 128; ++i) q[r * cols + g * 128 + i] = e4m3_encode(x[r * cols + g * 128 + i] / scale);
    }
}

// 128x128-block FP8 quantization of `count` stacked [n, k] matrices.
inline void quantize_blocks(const std::vector<float>& w, int count, int n, int k, std::vector<uint8_t>& q,
                            std::vector<float>& scales) {
  q.assign(static_cast<size_t>(count) * n * k, 0);
  scales.assign(static_cast<size_t>(count) * (n / 128) * (k / 128), 0.0f);
  for (int e = 0; e < count; ++e)
    for (int nb = 0; nb < n / 128; ++nb)
      for (int kb = 0; kb < k / 128; ++kb) {
        float amax = 0;
        for (int i = 0; i < 128; ++i)
          for (int j = 0; j < 128; ++j)
            amax = std::max(amax, std::fabs(w[(static_cast<size_t>(e) * n + nb * 128 + i) * k + kb * 128 + j]));
        const float scale = std::max(amax, 1e-10f) / 448.0f;
        scales[(static_cast<size_t>(e) * (n / 128) + nb) * (k / 128) + kb] = scale;
        for (int i = 0; i < 128; ++i)
          for (int j = 0; j < 128; ++j) {
            const size_t index = (static_cast<size_t>(e) * n + nb * 128 + i) * k + kb * 128 + j;
            q[index] = e4m3_encode(w[index] / scale);
          }
      }
}

struct DeviceBuffer {
  void* data = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t size) : bytes(size) { MEGAMOE_CUDA_CHECK(cudaMalloc(&data, std::max<size_t>(size, 16))); }
  template <typename T>
  DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    MEGAMOE_CUDA_CHECK(cudaMemcpy(data, host.data(), bytes, cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(data); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
  template <typename T>
  std::vector<T> download() const {
    std::vector<T> host(bytes / sizeof(T));
    MEGAMOE_CUDA_CHECK(cudaMemcpy(host.data(), data, bytes, cudaMemcpyDeviceToHost));
    return host;
  }
};

}  // namespace megamoe::testing
