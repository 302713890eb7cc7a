// SM clock, power and clock-limit reasons of the current CUDA device, read through NVML after each timed
// forward of `megamoe bench layer`, so that a spread between runs can be told apart from a change in the
// code: under sustained FP8 GEMM load the H200 slows down in steps (docs/perf.md, session 10, call 5).
// NVML is loaded with dlopen: a machine without the driver (CI) builds and runs the benchmark, and the
// probe then reports itself unavailable. Reads only; never sets clocks or limits.
#pragma once

#include <cstdint>
#include <string>

namespace megamoe::bench {

struct GpuClockSample {
  unsigned sm_mhz = 0;
  double power_w = 0;
  uint64_t limit_reasons = 0;  // NVML clock-event (throttle) reason bits, e.g. 0x4 = software power cap
};

class GpuClockProbe {
 public:
  // The device that cudaGetDevice() names now (matched to NVML by PCI bus id).
  GpuClockProbe();
  bool available() const { return device_ != nullptr; }
  const std::string& why_unavailable() const { return why_; }
  GpuClockSample sample() const;

 private:
  void* device_ = nullptr;
  std::string why_;
};

}  // namespace megamoe::bench
