// SM partitions of one GPU with one non-blocking stream each: CUDA green contexts (driver API, CUDA >= 12.4), so
// that in-process EP ranks (EpGroup::loopback) each run on their own SMs (megamoe/ep.h, EpLoopbackFabric NOTES).
// Header-only, for the programs that run such ranks (the loopback tests, `megamoe bench ep --loopback`); the
// library itself only reads a stream's partition (stream_sms.h). The driver functions come through
// cudaGetDriverEntryPointByVersion: the binaries do not link libcuda, which CI machines (no GPU driver) lack.
//   SmPartitionStreams parts(device, ranks);   // parts.stream(r), parts.sm_count(r)
// When green contexts are unavailable (old driver, too few SMs), `fallback` says why and every part is a plain
// non-blocking stream over all SMs.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "megamoe/error_cuda.h"

namespace megamoe::detail {

class SmPartitionStreams {
 public:
  SmPartitionStreams(int device, int parts) : streams_(parts, nullptr), sm_counts_(parts, 0) {
    MEGAMOE_CHECK(parts >= 1, "SmPartitionStreams: parts = ", parts, " must be >= 1");
    MEGAMOE_CUDA_CHECK(cudaSetDevice(device));
    MEGAMOE_CUDA_CHECK(cudaFree(nullptr));  // the primary context exists before any green context retains it
    const char* partitions = std::getenv("MEGAMOE_LOOPBACK_PARTITIONS");  // 0: plain streams (an A/B knob)
    fallback_ = partitions != nullptr && std::string(partitions) == "0" ? std::string("MEGAMOE_LOOPBACK_PARTITIONS=0")
                                                                      : make_green_streams(device, parts);
    if (!fallback_.empty()) {
      for (cudaStream_t& s : streams_)
        if (s != nullptr) cudaStreamDestroy(std::exchange(s, nullptr));
      int sms = 0;
      MEGAMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      for (int p = 0; p < parts; ++p) {
        MEGAMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&streams_[p], cudaStreamNonBlocking));
        sm_counts_[p] = sms;
      }
    }
  }
  ~SmPartitionStreams() {
    for (cudaStream_t s : streams_)
      if (s != nullptr) cudaStreamDestroy(s);
    for (CUgreenCtx g : contexts_)
      if (destroy_ != nullptr) destroy_(g);
  }
  SmPartitionStreams(const SmPartitionStreams&) = delete;
  SmPartitionStreams& operator=(const SmPartitionStreams&) = delete;

  cudaStream_t stream(int part) const { return streams_.at(part); }
  int sm_count(int part) const { return sm_counts_.at(part); }
  // Empty when every part has its own green context; else why not.
  const std::string& fallback() const { return fallback_; }

 private:
  template <class Fn>
  static Fn entry(const char* name, std::string* missing) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult query{};
    if (cudaGetDriverEntryPointByVersion(name, &fn, CUDA_VERSION, cudaEnableDefault, &query) != cudaSuccess ||
        query != cudaDriverEntryPointSuccess || fn == nullptr) {
      if (missing->empty()) *missing = std::string("driver has no ") + name;
      return nullptr;
    }
    return reinterpret_cast<Fn>(fn);
  }

  // Splits the device's SMs into `parts` equal groups (a multiple of the co-scheduling alignment each, so that
  // 2-CTA clusters fit) and makes a green context + stream per group; returns "" or why it could not.
  std::string make_green_streams(int device, int parts) {
    std::string missing;
    auto get_device = entry<decltype(&cuDeviceGet)>("cuDeviceGet", &missing);
    auto get_resource = entry<decltype(&cuDeviceGetDevResource)>("cuDeviceGetDevResource", &missing);
    auto split = entry<decltype(&cuDevSmResourceSplitByCount)>("cuDevSmResourceSplitByCount", &missing);
    auto describe = entry<decltype(&cuDevResourceGenerateDesc)>("cuDevResourceGenerateDesc", &missing);
    auto create = entry<decltype(&cuGreenCtxCreate)>("cuGreenCtxCreate", &missing);
    auto stream_create = entry<decltype(&cuGreenCtxStreamCreate)>("cuGreenCtxStreamCreate", &missing);
    destroy_ = entry<decltype(&cuGreenCtxDestroy)>("cuGreenCtxDestroy", &missing);
    if (!missing.empty()) return missing;
    CUdevice dev = 0;
    if (get_device(&dev, device) != CUDA_SUCCESS) return "cuDeviceGet failed";
    CUdevResource whole{};
    if (get_resource(dev, &whole, CU_DEV_RESOURCE_TYPE_SM) != CUDA_SUCCESS) return "cuDeviceGetDevResource failed";
    const unsigned alignment = std::max(whole.sm.smCoscheduledAlignment, 2u);
    const unsigned per_part = whole.sm.smCount / parts / alignment * alignment;
    if (per_part < std::max(whole.sm.minSmPartitionSize, alignment))
      return std::to_string(whole.sm.smCount) + " SMs do not split into " + std::to_string(parts) + " partitions";
    std::vector<CUdevResource> groups(parts);
    unsigned made = parts;
    CUdevResource remaining{};
    if (split(groups.data(), &made, &whole, &remaining, 0, per_part) != CUDA_SUCCESS || made < static_cast<unsigned>(parts))
      return "cuDevSmResourceSplitByCount made " + std::to_string(made) + " of " + std::to_string(parts) + " groups";
    for (int p = 0; p < parts; ++p) {
      CUdevResourceDesc desc{};
      CUgreenCtx context{};
      CUstream stream{};
      if (describe(&desc, &groups[p], 1) != CUDA_SUCCESS) return "cuDevResourceGenerateDesc failed";
      if (create(&context, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM) != CUDA_SUCCESS) return "cuGreenCtxCreate failed";
      contexts_.push_back(context);
      if (stream_create(&stream, context, CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS) return "cuGreenCtxStreamCreate failed";
      streams_[p] = reinterpret_cast<cudaStream_t>(stream);
      sm_counts_[p] = static_cast<int>(groups[p].sm.smCount);
    }
    return "";
  }

  std::vector<cudaStream_t> streams_;
  std::vector<int> sm_counts_;
  std::vector<CUgreenCtx> contexts_;
  decltype(&cuGreenCtxDestroy) destroy_ = nullptr;
  std::string fallback_;
};

}  // namespace megamoe::detail
