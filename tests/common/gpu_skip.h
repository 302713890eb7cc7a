// Skip helpers for GPU tests: CI has no GPU, so these tests are registered but skip with the reason.
#pragma once

#include <gtest/gtest.h>

#ifdef MEGAMOE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include <string>

namespace megamoe::testing {

// Number of visible CUDA devices of compute capability 9.0, or -1 with `why` set.
inline int count_sm90_devices(std::string* why) {
#ifdef MEGAMOE_WITH_CUDA
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    *why = std::string("no CUDA device: cudaGetDeviceCount returned ") + cudaGetErrorName(status);
    return -1;
  }
  int sm90 = 0;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) == cudaSuccess && prop.major == 9) ++sm90;
  }
  if (sm90 == 0) *why = "no compute capability 9.x (Hopper) device among " + std::to_string(count);
  return sm90;
#else
  *why = "built without CUDA (MEGAMOE_ENABLE_CUDA=OFF)";
  return -1;
#endif
}

}  // namespace megamoe::testing

// Use at the top of a GPU test: skips with the reason unless `n` Hopper GPUs are visible.
#define MEGAMOE_REQUIRE_GPUS(n)                                                           \
  do {                                                                                    \
    std::string megamoe_why;                                                              \
    const int megamoe_have = ::megamoe::testing::count_sm90_devices(&megamoe_why);        \
    if (megamoe_have < (n)) {                                                             \
      if (megamoe_why.empty())                                                            \
        megamoe_why = "needs " + std::to_string(n) + " Hopper GPUs, found " +             \
                      std::to_string(megamoe_have);                                       \
      GTEST_SKIP() << megamoe_why;                                                        \
    }                                                                                     \
  } while (0)
