// How many SMs a kernel launched on a stream can use when the stream belongs to a green context (CUDA >= 12.4
// execution partition). A persistent kernel whose CTAs wait on each other sizes its grid with it (the `mega`
// backend): a grid of the whole device on a 16-SM partition could never be resident at once.
#pragma once

#include <cuda_runtime.h>

namespace megamoe::detail {

// The SM count of `stream`'s green context, or 0 when it has none (a default stream, a stream of an ordinary
// context, or a driver without green contexts): then a launch can use every SM of the device. The green context is
// looked up through driver entry points (cudaGetDriverEntryPointByVersion, so libmegamoe needs no libcuda link).
// Allowed during stream capture (it only queries the stream).
int stream_green_context_sms(cudaStream_t stream);

}  // namespace megamoe::detail
