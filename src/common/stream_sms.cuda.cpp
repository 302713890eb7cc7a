// stream_green_context_sms: the SMs of a stream's green context (see stream_sms.h).
#include "common/stream_sms.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include "megamoe/error_cuda.h"

namespace megamoe::detail {
namespace {

struct GreenContextEntryPoints {
  PFN_cuStreamGetGreenCtx_v12040 stream_green_ctx = nullptr;
  PFN_cuGreenCtxGetDevResource_v12040 green_ctx_resource = nullptr;
};

const GreenContextEntryPoints& green_context_entry_points() {
  static const GreenContextEntryPoints entries = [] {
    GreenContextEntryPoints e;
    auto lookup = [](const char* name) -> void* {
      void* fn = nullptr;
      cudaDriverEntryPointQueryResult query{};
      if (cudaGetDriverEntryPointByVersion(name, &fn, 12040, cudaEnableDefault, &query) != cudaSuccess ||
          query != cudaDriverEntryPointSuccess) {
        cudaGetLastError();  // an old driver: no green contexts, so no partition to find
        return nullptr;
      }
      return fn;
    };
    e.stream_green_ctx = reinterpret_cast<PFN_cuStreamGetGreenCtx_v12040>(lookup("cuStreamGetGreenCtx"));
    e.green_ctx_resource = reinterpret_cast<PFN_cuGreenCtxGetDevResource_v12040>(lookup("cuGreenCtxGetDevResource"));
    return e;
  }();
  return entries;
}

}  // namespace

int stream_green_context_sms(cudaStream_t stream) {
  // NOTES: the default streams (0, cudaStreamLegacy, cudaStreamPerThread) belong to the primary context, never to a
  // green context; only a created stream can be one (cuGreenCtxStreamCreate).
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return 0;
  const GreenContextEntryPoints& driver = green_context_entry_points();
  if (driver.stream_green_ctx == nullptr || driver.green_ctx_resource == nullptr) return 0;
  CUgreenCtx green = nullptr;
  if (driver.stream_green_ctx(reinterpret_cast<CUstream>(stream), &green) != CUDA_SUCCESS || green == nullptr)
    return 0;  // a stream of an ordinary context
  CUdevResource resource{};
  const CUresult status = driver.green_ctx_resource(green, &resource, CU_DEV_RESOURCE_TYPE_SM);
  MEGAMOE_CHECK(status == CUDA_SUCCESS, "cuGreenCtxGetDevResource failed (CUresult ", static_cast<int>(status),
                ") for the green context of stream ", static_cast<const void*>(stream));
  return static_cast<int>(resource.sm.smCount);
}

}  // namespace megamoe::detail
