// Swap-AB small-N wgmma probe: cycles per 128-K block for the v11 GEMM 1 tile patterns, operands in shared memory.
#include <cstdio>
#include <cstdint>
#include <vector>
#include "kernels/sm90_ptx.cuh"
#include "sm90_wgmma_small_n.cuh"
using namespace megamoe::kernels::sm90;
constexpr int kStages = 4, kA = 16384, kB = 32768;

template <int kMode, int kN>  // 0: 128 x 256 two WGs; 1: one WG 64 rows; 2: swap, N tokens, 2 WGs x 2 subtiles
__global__ void __launch_bounds__(256, 1) probe(int kblocks, long long* cycles, float* sink) {
  extern __shared__ uint8_t raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  for (int i = threadIdx.x; i < kStages * (kA + kB) / 4; i += blockDim.x) {
    uint32_t h = i * 2654435761u + blockIdx.x;
    reinterpret_cast<uint32_t*>(base)[i] = (h ^ (h >> 13)) & 0xB3B3B3B3u;
  }
  fence_proxy_async_shared();
  __syncthreads();
  const int wg = threadIdx.x / 128;
  const long long t0 = clock64();
  float total = 0.f;
  if constexpr (kMode <= 1) {
    if (kMode == 0 || wg == 0) {
      float acc[2][64], partial[64];
      for (int h = 0; h < 2; ++h) for (int i = 0; i < 64; ++i) acc[h][i] = 0.f;
#pragma unroll 1
      for (int kb = 0; kb < kblocks; ++kb) {
        const int stage = kb % kStages;
        const uint32_t a_low = kmajor_sw128_descriptor_low(smem_address(base + stage * kA + wg * 64 * 128));
        const uint32_t b_low = kmajor_sw128_descriptor_low(smem_address(base + kStages * kA + stage * kB));
        const float s = 1.0f + kb * 1e-7f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int i = 0; i < 64; ++i) fence_operand(partial[i]);
          wgmma_fence();
#pragma unroll
          for (int ks = 0; ks < 4; ++ks)
            wgmma_m64n128k32_e4m3(partial, sw128_descriptor_from_low(a_low + ((32 * ks) >> 4)),
                                  sw128_descriptor_from_low(b_low + ((128 * h * 128 + 32 * ks) >> 4)), ks > 0);
          wgmma_commit();
          wgmma_wait<0>();
#pragma unroll
          for (int i = 0; i < 64; ++i) fence_operand(partial[i]);
#pragma unroll
          for (int i = 0; i < 64; ++i) acc[h][i] += partial[i] * s;
        }
      }
      for (int h = 0; h < 2; ++h) for (int i = 0; i < 64; ++i) total += acc[h][i];
    }
  } else {
    float acc[2][kN / 2], partial[2][kN / 2];
    for (int h = 0; h < 2; ++h) for (int i = 0; i < kN / 2; ++i) acc[h][i] = 0.f;
#pragma unroll 1
    for (int kb = 0; kb < kblocks; ++kb) {
      const int stage = kb % kStages;
      const uint32_t tok_low = kmajor_sw128_descriptor_low(smem_address(base + stage * kA));
      const uint32_t w_low = kmajor_sw128_descriptor_low(smem_address(base + kStages * kA + stage * kB + 128 * wg * 128));
      const float s = 1.0f + kb * 1e-7f;
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < kN / 2; ++i) fence_operand(partial[h][i]);
      wgmma_fence();
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
          wgmma_m64nNk32_e4m3<kN>(partial[h], sw128_descriptor_from_low(w_low + ((64 * h * 128 + 32 * ks) >> 4)),
                                  sw128_descriptor_from_low(tok_low + ((32 * ks) >> 4)), ks > 0);
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < kN / 2; ++i) fence_operand(partial[h][i]);
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < kN / 2; ++i) acc[h][i] += partial[h][i] * s;
    }
    for (int h = 0; h < 2; ++h) for (int i = 0; i < kN / 2; ++i) total += acc[h][i];
  }
  const long long t1 = clock64();
  sink[blockIdx.x * blockDim.x + threadIdx.x] = total;
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 2 + wg] = t1 - t0;
}

template <int kMode, int kN>
void run(const char* name, int rows) {
  const int ctas = 132, kblocks = 56 * 64;
  const int smem = kStages * (kA + kB) + 1024;
  cudaFuncSetAttribute(probe<kMode, kN>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  long long* cycles; float* sink;
  cudaMalloc(&cycles, ctas * 2 * 8); cudaMalloc(&sink, ctas * 256 * 4);
  cudaMemset(cycles, 0, ctas * 2 * 8);
  probe<kMode, kN><<<ctas, 256, smem>>>(kblocks, cycles, sink);  // warm-up
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  float best = 1e30f;
  for (int r = 0; r < 5; ++r) {
    cudaEventRecord(e0);
    probe<kMode, kN><<<ctas, 256, smem>>>(kblocks, cycles, sink);
    cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1); if (ms < best) best = ms;
  }
  std::vector<long long> c(ctas * 2);
  cudaMemcpy(c.data(), cycles, ctas * 2 * 8, cudaMemcpyDeviceToHost);
  double avg = 0; for (int i = 0; i < ctas; ++i) avg += c[2 * i]; avg /= ctas;
  cudaError_t err = cudaGetLastError();
  const double ns_per_kb = best * 1e6 / kblocks;
  const double flop = 2.0 * rows * 256 * 128 * ctas * kblocks;
  printf("%-10s rows %3d | %8.1f cyc/kb | %7.1f ns/kb | %7.1f TFLOP/s useful | ns per row-kb %6.2f %s\n", name, rows,
         avg / kblocks, ns_per_kb, flop / (best * 1e-3) * 1e-12, ns_per_kb / rows, err ? cudaGetErrorString(err) : "");
  cudaFree(cycles); cudaFree(sink);
}
int main() {
  run<0, 8>("normal2", 128);
  run<1, 8>("normal1", 64);
  run<2, 8>("swap8", 8);
  run<2, 16>("swap16", 16);
  run<2, 24>("swap24", 24);
  run<2, 32>("swap32", 32);
  run<2, 40>("swap40", 40);
  run<2, 48>("swap48", 48);
  run<2, 56>("swap56", 56);
  run<2, 64>("swap64", 64);
  run<0, 8>("normal2", 128);
  return 0;
}
