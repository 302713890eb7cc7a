// Max active clusters of 1 / 2 / 3 / 4 CTAs of 384 threads with ~228 KiB of dynamic shared memory (the v11 GEMM 1
// kernel's footprint) on this GPU: how many SMs a cluster-of-N persistent grid can use.
#include <cstdio>
__global__ void __launch_bounds__(384, 1) k(int* p) { extern __shared__ int s[]; if (p) p[threadIdx.x] = s[threadIdx.x]; }
int main() {
  const int smem = 228460 + 1024;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  for (int c : {1, 2, 3, 4, 6, 8}) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(c * 32); config.blockDim = dim3(384); config.dynamicSmemBytes = smem;
    cudaLaunchAttribute a; a.id = cudaLaunchAttributeClusterDimension; a.val.clusterDim.x = c; a.val.clusterDim.y = 1; a.val.clusterDim.z = 1;
    config.attrs = &a; config.numAttrs = 1;
    int clusters = -1; cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, k, &config);
    printf("cluster %d: max active clusters %d -> %d CTAs of %d SMs (%s)\n", c, clusters, clusters * c, sms, cudaGetErrorString(e));
  }
}
