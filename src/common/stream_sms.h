// How many SMs a kernel launched on a stream can use: the device's, or the SM count of the green context (CUDA
// >= 12.4 execution partition) the stream was created in. A persistent kernel whose CTAs wait on each other
// sizes its grid with it (the `mega` backend): a grid of the whole device on a 16-SM partition could never be
// resident at once.
#pragma once

#include <cuda_runtime.h>

namespace megamoe::detail {

struct StreamSms {
  int sms = 0;             // SMs a launch on the stream can use
  int device_sms = 0;      // SMs of the stream's device
  bool partition = false;  // true when the stream belongs to a green context (sms <= device_sms)
};

// `device` is the stream's device (the current one for the legacy / per-thread default streams). The green
// context is looked up through driver entry points (cudaGetDriverEntryPointByVersion, so libmegamoe needs no
// libcuda link); a driver without them, or a stream outside any green context, gives the device's SMs.
// Allowed during stream capture (it only queries the stream).
StreamSms stream_sm_count(cudaStream_t stream, int device);

}  // namespace megamoe::detail
