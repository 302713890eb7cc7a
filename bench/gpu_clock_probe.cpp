#include "bench/gpu_clock_probe.h"

#include <dlfcn.h>

#ifdef MEGAMOE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace megamoe::bench {
namespace {

// The few NVML entry points used here, with the C ABI of nvml.h (the header is not installed on the
// build machines; these signatures are stable across NVML versions). nvmlReturn_t 0 = NVML_SUCCESS;
// nvmlClockType_t 1 = NVML_CLOCK_SM.
using NvmlInit = int (*)();
using NvmlHandleByBusId = int (*)(const char*, void**);
using NvmlClockInfo = int (*)(void*, int, unsigned*);
using NvmlPowerUsage = int (*)(void*, unsigned*);
using NvmlReasons = int (*)(void*, unsigned long long*);

struct Nvml {
  NvmlClockInfo clock_info = nullptr;
  NvmlPowerUsage power_usage = nullptr;
  NvmlReasons reasons = nullptr;
  NvmlHandleByBusId handle_by_bus_id = nullptr;
  bool ok = false;
  Nvml() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    const auto init = reinterpret_cast<NvmlInit>(dlsym(lib, "nvmlInit_v2"));
    handle_by_bus_id = reinterpret_cast<NvmlHandleByBusId>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    clock_info = reinterpret_cast<NvmlClockInfo>(dlsym(lib, "nvmlDeviceGetClockInfo"));
    power_usage = reinterpret_cast<NvmlPowerUsage>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
    reasons = reinterpret_cast<NvmlReasons>(dlsym(lib, "nvmlDeviceGetCurrentClocksEventReasons"));
    if (!reasons) reasons = reinterpret_cast<NvmlReasons>(dlsym(lib, "nvmlDeviceGetCurrentClocksThrottleReasons"));
    ok = init && handle_by_bus_id && clock_info && power_usage && init() == 0;
  }
};

const Nvml& nvml() {
  static const Nvml instance;  // NVML stays loaded for the process
  return instance;
}

}  // namespace

GpuClockProbe::GpuClockProbe() {
#ifdef MEGAMOE_WITH_CUDA
  if (!nvml().ok) {
    why_ = "NVML (libnvidia-ml.so.1) not loadable";
    return;
  }
  int device = 0;
  char bus_id[32] = {};
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) != cudaSuccess) {
    why_ = "no CUDA device";
    return;
  }
  void* handle = nullptr;
  if (nvml().handle_by_bus_id(bus_id, &handle) != 0) {
    why_ = std::string("NVML has no device at PCI bus id ") + bus_id;
    return;
  }
  device_ = handle;
#else
  why_ = "built without CUDA";
#endif
}

GpuClockSample GpuClockProbe::sample() const {
  GpuClockSample s;
  if (!device_) return s;
  unsigned mhz = 0, milliwatts = 0;
  unsigned long long reasons = 0;
  if (nvml().clock_info(device_, 1, &mhz) == 0) s.sm_mhz = mhz;
  if (nvml().power_usage(device_, &milliwatts) == 0) s.power_w = milliwatts * 1e-3;
  if (nvml().reasons && nvml().reasons(device_, &reasons) == 0) s.limit_reasons = reasons;
  return s;
}

}  // namespace megamoe::bench
