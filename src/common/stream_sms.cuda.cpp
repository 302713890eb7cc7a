// stream_sm_count: the SMs of a stream's green context (see stream_sms.h).
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

StreamSms stream_sm_count(cudaStream_t stream, int device) {
  StreamSms result;
  MEGAMOE_CUDA_CHECK(cudaDeviceGetAttribute(&result.device_sms, cudaDevAttrMultiProcessorCount, device));
  result.sms = result.device_sms;
  // NOTES: the default streams (0, cudaStreamLegacy, cudaStreamPerThread) belong to the primary context, never to a
  // green context; only a created stream can be one (cuGreenCtxStreamCreate).
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return result;
  const GreenContextEntryPoints& driver = green_context_entry_points();
  if (driver.stream_green_ctx == nullptr || driver.green_ctx_resource == nullptr) return result;
  CUgreenCtx green = nullptr;
  if (driver.stream_green_ctx(reinterpret_cast<CUstream>(stream), &green) != CUDA_SUCCESS || green == nullptr)
    return result;  // a stream of an ordinary context
  CUdevResource resource{};
  const CUresult status = driver.green_ctx_resource(green, &resource, CU_DEV_RESOURCE_TYPE_SM);
  MEGAMOE_CHECK(status == CUDA_SUCCESS, "cuGreenCtxGetDevResource failed (CUresult ", static_cast<int>(status),
                ") for the green context of stream ", static_cast<const void*>(stream));
  if (resource.sm.smCount > 0 && static_cast<int>(resource.sm.smCount) <= result.device_sms) {
    result.sms = static_cast<int>(resource.sm.smCount);
    result.partition = true;
  }
  return result;
}

}  // namespace megamoe::detail
