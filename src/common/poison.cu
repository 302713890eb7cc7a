// Fills device buffers with a byte pattern before a kernel runs, so that a test can prove every
// output element was written (0xFF bytes are NaN in bf16/fp32/e4m3).
#include <algorithm>
#include <cstdint>

#include "megamoe/error_cuda.h"
#include "megamoe/poison.h"

namespace megamoe {
namespace {
__global__ void poison_kernel(uint32_t* words, size_t num_words, uint32_t pattern) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < num_words;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    words[i] = pattern;
}
}  // namespace

void poison_device_buffer(void* data, size_t bytes, uint8_t byte, StreamHandle stream) {
  if (bytes == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const size_t num_words = bytes / 4;
  if (num_words > 0 && reinterpret_cast<uintptr_t>(data) % 4 == 0) {
    const uint32_t pattern = 0x01010101u * byte;
    const int blocks = static_cast<int>(std::min<size_t>((num_words + 255) / 256, 4096));
    poison_kernel<<<blocks, 256, 0, s>>>(static_cast<uint32_t*>(data), num_words, pattern);
    MEGAMOE_LAUNCH_CHECK();
    MEGAMOE_CUDA_CHECK(cudaMemsetAsync(static_cast<uint8_t*>(data) + num_words * 4, byte, bytes - num_words * 4, s));
  } else {
    MEGAMOE_CUDA_CHECK(cudaMemsetAsync(data, byte, bytes, s));
  }
}

}  // namespace megamoe
