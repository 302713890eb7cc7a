// A non-owning view of a dense row-major tensor on the host or on a CUDA device. The API edge uses
// it so that shapes and dtypes can be validated with messages naming the field.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "megamoe/types.h"

namespace megamoe {

enum class Device : uint8_t { kCpu, kCuda };

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int rank = 0;
  std::array<int64_t, 4> shape{0, 0, 0, 0};
  Device device = Device::kCpu;

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }

  static TensorView make2d(void* data, DType dtype, int64_t rows, int64_t cols, Device device) {
    TensorView t;
    t.data = data; t.dtype = dtype; t.rank = 2; t.shape = {rows, cols, 0, 0}; t.device = device;
    return t;
  }
};

// Throws megamoe::Error "<field>: expected <dtype> [d0, d1] on <device>, got ..." when the view does
// not match. A dimension of -1 in `shape` matches anything.
void check_tensor(std::string_view field, const TensorView& view, DType dtype,
                  std::initializer_list<int64_t> shape, Device device);

}  // namespace megamoe
