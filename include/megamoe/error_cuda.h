// CUDA and NCCL members of the MEGAMOE_CHECK family. Include only from code that links CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include "megamoe/error.h"

#define MEGAMOE_CUDA_CHECK(call)                                                                   \
  do {                                                                                             \
    const cudaError_t megamoe_cuda_status = (call);                                                \
    if (megamoe_cuda_status != cudaSuccess) [[unlikely]]                                           \
      ::megamoe::detail::throw_error(__FILE__, __LINE__, #call,                                    \
                                     ::megamoe::detail::concat("CUDA error ",                      \
                                                               cudaGetErrorName(megamoe_cuda_status), \
                                                               ": ",                               \
                                                               cudaGetErrorString(megamoe_cuda_status))); \
  } while (0)

// After every kernel launch: catches bad launch configurations immediately.
#define MEGAMOE_LAUNCH_CHECK() MEGAMOE_CUDA_CHECK(cudaGetLastError())

#define MEGAMOE_NCCL_CHECK(call)                                                                   \
  do {                                                                                             \
    const ncclResult_t megamoe_nccl_status = (call);                                               \
    if (megamoe_nccl_status != ncclSuccess) [[unlikely]]                                           \
      ::megamoe::detail::throw_error(__FILE__, __LINE__, #call,                                    \
                                     ::megamoe::detail::concat("NCCL error ",                      \
                                                               ncclGetErrorString(megamoe_nccl_status), \
                                                               " (", ncclGetLastError(nullptr), ")")); \
  } while (0)
