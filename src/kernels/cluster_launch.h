// Host side of the v11 cluster kernels (MEGAMOE_GEMM_CLUSTER=1; docs/grouped_gemm.md "v11 clusters"): the grid
// (2 x the co-resident clusters of 2 CTAs, cached) and the launch with cluster dims (2, 1, 1). Internal: include
// only from src/kernels/*.cu (the v11 launchers).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>

#include "kernels/grouped_gemm_internal.h"
#include "kernels/sm90_gemm_heuristics.h"
#include "megamoe/error.h"
#include "megamoe/error_cuda.h"

namespace megamoe::kernels::detail {

constexpr int kClusterCtas = 2;
constexpr int kClusterGridDevices = 64;  // devices of one process the grid cache holds

inline cudaLaunchAttribute cluster_dims_attribute() {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = kClusterCtas;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  return attribute;
}

// Grid of a cluster kernel: kClusterCtas x the clusters that can be resident at once (cudaOccupancyMaxActiveClusters:
// both CTAs of a cluster sit in one GPC, so a GPC with an odd SM count leaves one SM out; on H200 possibly fewer
// than 66 clusters). Computed on the first launch per device and kernel (`cached`: the caller's, one per
// instantiation), then reused.
// NOTES: the answer does not depend on the launch's shared-memory size (it changes with num_experts): every v11
// layout needs > 114 KiB, so it is one CTA per SM at any size; the first launch's size is the one asked about.
template <class Kernel>
int cluster_grid(Kernel kernel, int shared_bytes, std::array<std::atomic<int>, kClusterGridDevices>& cached) {
  int device = 0;
  MEGAMOE_CUDA_CHECK(cudaGetDevice(&device));
  MEGAMOE_CHECK(device >= 0 && device < kClusterGridDevices, "v11 clusters: device ", device,
                " past the grid cache");
  int grid = cached[device].load(std::memory_order_relaxed);
  if (grid > 0) return grid;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(kClusterCtas * (grouped_gemm_sm_count() / kClusterCtas));
  config.blockDim = dim3(sm90::kThreadsPerCta);
  config.dynamicSmemBytes = shared_bytes;
  cudaLaunchAttribute attribute = cluster_dims_attribute();
  config.attrs = &attribute;
  config.numAttrs = 1;
  int clusters = 0;
  MEGAMOE_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
  MEGAMOE_CHECK(clusters > 0, "v11 clusters: no cluster of ", kClusterCtas, " CTAs fits (", shared_bytes,
                " B of shared memory per CTA)");
  grid = kClusterCtas * clusters;
  cached[device].store(grid, std::memory_order_relaxed);
  return grid;
}

// Launches `kernel` on `grid` CTAs (a multiple of kClusterCtas) in clusters of kClusterCtas along x.
template <class Kernel, class... Args>
void launch_cluster_kernel(Kernel kernel, int grid, int shared_bytes, cudaStream_t stream, const Args&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(sm90::kThreadsPerCta);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute = cluster_dims_attribute();
  config.attrs = &attribute;
  config.numAttrs = 1;
  MEGAMOE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

}  // namespace megamoe::kernels::detail
