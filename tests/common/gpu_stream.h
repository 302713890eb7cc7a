// The CUDA stream the GPU tests run on: a non-blocking stream on one device, destroyed with its owner.
//   DeviceStream        one rank's stream in a launched multi-GPU test (`DeviceStream s(group->device())`)
//   OneGpuTest<Base>    fixture base of the one-GPU suites: skips without a Hopper GPU, else `stream_`
//                       on device 0 (Base: ::testing::Test or ::testing::TestWithParam<T>)
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "common/gpu_skip.h"
#include "megamoe/error_cuda.h"

namespace megamoe::testing {

struct DeviceStream {
  cudaStream_t stream = nullptr;
  explicit DeviceStream(int device) {
    MEGAMOE_CUDA_CHECK(cudaSetDevice(device));
    MEGAMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~DeviceStream() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;
};

template <class Base = ::testing::Test>
class OneGpuTest : public Base {
 protected:
  void SetUp() override {
    MEGAMOE_REQUIRE_GPUS(1);
    MEGAMOE_CUDA_CHECK(cudaSetDevice(0));
    MEGAMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

}  // namespace megamoe::testing
