// Launcher of the wgmma issue-pattern probe (sm90_wgmma_probe.cuh; buffers: wgmma_probe.h).
#include <cuda_runtime_api.h>

#include <iterator>

#include "kernels/sm90_wgmma_probe.cuh"
#include "kernels/wgmma_probe.h"
#include "megamoe/error.h"
#include "megamoe/error_cuda.h"

namespace megamoe::kernels {
namespace {

struct ProbeArguments {
  const uint8_t* a;
  const uint8_t* b;
  const float* scales;
  int iterations, ctas;
  long long* cycles;
  float* checksums;
  float* fragments;
  cudaStream_t stream;
};

template <WgmmaProbePattern kPattern, int kWarpgroups, int kSubTiles>
void launch_typed(const ProbeArguments& args) {
  auto kernel = sm90::sm90_wgmma_probe_kernel<kPattern, kWarpgroups, kSubTiles>;
  MEGAMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kWgmmaProbeSharedBytes));
  kernel<<<args.ctas, kWarpgroups * 128, kWgmmaProbeSharedBytes, args.stream>>>(
      args.a, args.b, args.scales, args.iterations, args.cycles, args.checksums, args.fragments);
  MEGAMOE_LAUNCH_CHECK();
}

// Compile-time walk over kWgmmaProbeConfigs: instantiates every configuration once.
template <int kIndex>
void launch_config(int index, const ProbeArguments& args) {
  if constexpr (kIndex < static_cast<int>(std::size(kWgmmaProbeConfigs))) {
    if (index == kIndex) {
      constexpr WgmmaProbeConfig config = kWgmmaProbeConfigs[kIndex];
      launch_typed<config.pattern, config.warpgroups, config.sub_tiles>(args);
      return;
    }
    launch_config<kIndex + 1>(index, args);
  }
}

}  // namespace

void launch_wgmma_probe(const WgmmaProbeConfig& config, const uint8_t* a, const uint8_t* b, const float* scales,
                        int iterations, int ctas, long long* cycles, float* checksums, float* fragments,
                        cudaStream_t stream) {
  int index = -1;
  for (int i = 0; i < static_cast<int>(std::size(kWgmmaProbeConfigs)); ++i) {
    const WgmmaProbeConfig& known = kWgmmaProbeConfigs[i];
    if (known.pattern == config.pattern && known.warpgroups == config.warpgroups && known.sub_tiles == config.sub_tiles)
      index = i;
  }
  MEGAMOE_CHECK(index >= 0, "wgmma probe configuration ", wgmma_probe_label(config),
                " is not compiled (see kWgmmaProbeConfigs)");
  MEGAMOE_CHECK(iterations >= 1, "iterations must be >= 1, got ", iterations);
  MEGAMOE_CHECK(ctas >= 1, "ctas must be >= 1, got ", ctas);
  MEGAMOE_CHECK(a != nullptr && b != nullptr && scales != nullptr, "a, b and scales must be device pointers");
  MEGAMOE_CHECK(cycles != nullptr && checksums != nullptr, "cycles and checksums must be device pointers");
  launch_config<0>(index, ProbeArguments{a, b, scales, iterations, ctas, cycles, checksums, fragments, stream});
}

}  // namespace megamoe::kernels
