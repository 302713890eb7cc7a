// wgmma issue-pattern probe kernel (issue #3; buffers and patterns: wgmma_probe.h). Persistent, one CTA
// per SM, `kWarpgroups` math warpgroups and no producer: the operands are written to shared memory
// once, then every warpgroup runs `iterations` steps of its pattern on them, timed with clock64.
// The mainloop bodies mirror fp8_tile_mainloop (serial and half-overlap schedules) without TMA and
// mbarriers, and with the per-128-K scales read from a 16-step table in shared memory instead of
// global memory, so that the difference between patterns is the issue pattern alone.
//
// NOTES:
// - The operands are written with generic st.shared and read by wgmma through the async proxy:
//   fence.proxy.async + __syncthreads before the first wgmma.
// - Every step reads the same shared-memory bytes: the tensor pipe sees the real operand traffic
//   (both operands from shared memory, 128-byte swizzle); only global memory is out of the picture.
// - The final fragment of every thread (wgmma_probe.h) is reduced to a checksum (and optionally
//   stored), so that the compiler keeps every FFMA; wgmma itself is asm volatile.
// - ptxas drops a wgmma whose accumulator is overwritten before anything reads it (the empty-asm
//   fence_operand does not survive to ptxas): every pattern reads or accumulates every group's result.
// - Registers: __launch_bounds__(128 * kWarpgroups, 1) gives 255 per thread for 1-2 warpgroups and 168
//   for 3, which is what decides the sub-tile count of the 3-warpgroup C / E configurations.
#pragma once

#include <cstdint>

#include "kernels/sm90_ptx.cuh"
#include "kernels/wgmma_probe.h"

namespace megamoe::kernels::sm90 {

// D[64x256] (+)= A[64x32] * B[256x32]^T, E4M3 x E4M3 -> FP32 (128 registers; the m64n128 register
// layout continued: register 4j+{0,1,2,3} holds columns 8j + 2*(lane%4) + {0,1} of rows r, r + 8).
// Here rather than in sm90_ptx.cuh until a GEMM issues it.
__device__ __forceinline__ void wgmma_m64n256k32_e4m3(float (&d)[128], uint64_t a_descriptor,
                                                      uint64_t b_descriptor, uint32_t accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a_descriptor), "l"(b_descriptor), "r"(accumulate));
}


// (fence_proxy_async_shared: sm90_ptx.cuh.)
// Row-major [rows][128] bytes -> 128-byte swizzled K-major tile (16-byte chunk c of row r at chunk
// c ^ (r % 8)), as TMA's SWIZZLE_128B writes it; `tile` is 1024-byte aligned.
__device__ __forceinline__ void store_sw128_tile(uint8_t* tile, const uint8_t* rows_bytes, int rows) {
  for (int c = threadIdx.x; c < rows * 8; c += blockDim.x) {
    const int row = c / 8, chunk = c % 8;
    *reinterpret_cast<uint4*>(tile + row * kWgmmaProbeKBytes + ((chunk ^ (row % 8)) * 16)) =
        reinterpret_cast<const uint4*>(rows_bytes)[c];
  }
}

template <int kRegisters>
__device__ __forceinline__ void fence_fragment(float (&fragment)[kRegisters]) {
#pragma unroll
  for (int i = 0; i < kRegisters; ++i) fence_operand(fragment[i]);
}

// One group = 4 wgmma k32 steps over the 128-K block, committed; the instruction follows the fragment
// size (32 registers: m64n64k32, 64: m64n128k32, 128: m64n256k32). a_low / b_low: descriptor start
// words of the 64-row A slice and the B slice (kmajor_sw128_descriptor_low); a k-step is +32 bytes.
// `overwrite`: the first k-step ignores the fragment's old value (scale-d = 0), as the GEMM's partial.
template <int kRegisters>
__device__ __forceinline__ void probe_group(float (&d)[kRegisters], uint32_t a_low, uint32_t b_low, bool overwrite) {
  fence_fragment(d);
  wgmma_fence();
#pragma unroll
  for (int k_step = 0; k_step < 4; ++k_step) {
    const uint64_t a_descriptor = sw128_descriptor_from_low(a_low + ((32 * k_step) >> 4));
    const uint64_t b_descriptor = sw128_descriptor_from_low(b_low + ((32 * k_step) >> 4));
    const uint32_t accumulate = (overwrite && k_step == 0) ? 0u : 1u;
    if constexpr (kRegisters == 32) wgmma_m64n64k32_e4m3(d, a_descriptor, b_descriptor, accumulate);
    else if constexpr (kRegisters == 64) wgmma_m64n128k32_e4m3(d, a_descriptor, b_descriptor, accumulate);
    else wgmma_m64n256k32_e4m3(d, a_descriptor, b_descriptor, accumulate);
  }
  wgmma_commit();
}

// acc[i] += partial[i] * scale(row half of i): the promotion of fp8_tile_mainloop (registers 4j+{0,1}
// are row r, 4j+{2,3} row r + 8), 4 FFMA per j.
template <int kRegisters>
__device__ __forceinline__ void probe_promote(float* accumulator, const float (&partial)[kRegisters], float scale0,
                                              float scale1) {
#pragma unroll
  for (int j = 0; j < kRegisters / 4; ++j) {
    accumulator[4 * j + 0] += partial[4 * j + 0] * scale0;
    accumulator[4 * j + 1] += partial[4 * j + 1] * scale0;
    accumulator[4 * j + 2] += partial[4 * j + 2] * scale1;
    accumulator[4 * j + 3] += partial[4 * j + 3] * scale1;
  }
}

// Writes the checksum (and optionally the fragment) of this thread.
template <int kRegisters>
__device__ __forceinline__ void probe_finish(const float* fragment, float* checksums, float* fragments, int warpgroups) {
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kRegisters; ++i) sum += fragment[i];
  checksums[static_cast<int64_t>(blockIdx.x) * warpgroups * 128 + threadIdx.x] = sum;
  if (fragments != nullptr) {
    float* out = fragments + (static_cast<int64_t>(blockIdx.x) * warpgroups * 128 + threadIdx.x) * kRegisters;
#pragma unroll
    for (int i = 0; i < kRegisters; ++i) out[i] = fragment[i];
  }
}

template <WgmmaProbePattern kPattern, int kWarpgroups, int kSubTiles>
__global__ void __launch_bounds__(kWarpgroups * 128, 1)
    sm90_wgmma_probe_kernel(const uint8_t* __restrict__ a, const uint8_t* __restrict__ b,
                            const float* __restrict__ scales, int iterations, long long* __restrict__ cycles,
                            float* __restrict__ checksums, float* __restrict__ fragments) {
  extern __shared__ uint8_t probe_shared_raw[];
  uint8_t* a_tile = probe_shared_raw + ((1024 - (smem_address(probe_shared_raw) & 1023)) & 1023);
  uint8_t* b_tile = a_tile + kWgmmaProbeARows * kWgmmaProbeKBytes;
  float* scale_table = reinterpret_cast<float*>(b_tile + kWgmmaProbeBRows * kWgmmaProbeKBytes);
  store_sw128_tile(a_tile, a, kWgmmaProbeARows);
  store_sw128_tile(b_tile, b, kWgmmaProbeBRows);
  for (int i = threadIdx.x; i < kWgmmaProbeScaleFloats; i += blockDim.x) scale_table[i] = scales[i];
  fence_proxy_async_shared();
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  const uint32_t a_low = kmajor_sw128_descriptor_low(smem_address(a_tile + warpgroup * kSubTiles * 64 * kWgmmaProbeKBytes));
  const uint32_t b_low = kmajor_sw128_descriptor_low(smem_address(b_tile));
  constexpr uint32_t kSubTileStep = (64 * kWgmmaProbeKBytes) >> 4;  // descriptor words per 64 rows
  const float* b_scales = scale_table + kWgmmaProbeScaleSteps * 4;

  const long long start = clock64();
  // After the pattern's final wait_group 0 (and the last promotion): the loop's span on this warpgroup.
  const auto record_cycles = [&] {
    const long long stop = clock64();
    if (threadIdx.x % 128 == 0) {
      cycles[(blockIdx.x * kWarpgroups + warpgroup) * 2 + 0] = start;
      cycles[(blockIdx.x * kWarpgroups + warpgroup) * 2 + 1] = stop;
    }
  };
  if constexpr (kPattern == WgmmaProbePattern::kThroughput || kPattern == WgmmaProbePattern::kLatency) {
    constexpr int kGroups = kPattern == WgmmaProbePattern::kLatency ? 1 : kSubTiles;
    float accumulator[kGroups][64];
#pragma unroll
    for (int s = 0; s < kGroups; ++s)
#pragma unroll
      for (int i = 0; i < 64; ++i) accumulator[s][i] = 0.0f;
    for (int step = 0; step < iterations; ++step) {
#pragma unroll
      for (int s = 0; s < kGroups; ++s) {
        probe_group(accumulator[s], a_low + s * kSubTileStep, b_low, false);
        if constexpr (kPattern == WgmmaProbePattern::kLatency) wgmma_wait<0>();
        else wgmma_wait<1>();
      }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int s = 0; s < kGroups; ++s) fence_fragment(accumulator[s]);
    record_cycles();
    probe_finish<kGroups * 64>(&accumulator[0][0], checksums, fragments, kWarpgroups);
  } else if constexpr (kPattern == WgmmaProbePattern::kThroughputN256 || kPattern == WgmmaProbePattern::kLatencyN256) {
    float accumulator[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) accumulator[i] = 0.0f;
    for (int step = 0; step < iterations; ++step) {
      probe_group(accumulator, a_low, b_low, false);
      if constexpr (kPattern == WgmmaProbePattern::kLatencyN256) wgmma_wait<0>();
      else wgmma_wait<1>();
    }
    wgmma_wait<0>();
    fence_fragment(accumulator);
    record_cycles();
    probe_finish<128>(accumulator, checksums, fragments, kWarpgroups);
  } else if constexpr (kPattern == WgmmaProbePattern::kPromote || kPattern == WgmmaProbePattern::kWaitOnly) {
    constexpr bool kPromotes = kPattern == WgmmaProbePattern::kPromote;
    float accumulator[kPromotes ? kSubTiles : 1][64];
    float partial[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) partial[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < (kPromotes ? kSubTiles : 1); ++s)
#pragma unroll
      for (int i = 0; i < 64; ++i) accumulator[s][i] = 0.0f;
    for (int step = 0; step < iterations; ++step) {
      const float* a_scales = scale_table + (step % kWgmmaProbeScaleSteps) * 4;
      const float scale_b = b_scales[step % kWgmmaProbeScaleSteps];
#pragma unroll
      for (int s = 0; s < kSubTiles; ++s) {
        // D accumulates across groups: ptxas removes a wgmma whose result is overwritten unread (the
        // empty-asm fence_operand does not reach it), which would drop D's first sub-tile.
        probe_group(partial, a_low + s * kSubTileStep, b_low, kPromotes);
        wgmma_wait<0>();
        fence_fragment(partial);
        if constexpr (kPromotes)
          probe_promote(accumulator[s], partial, a_scales[2 * s] * scale_b, a_scales[2 * s + 1] * scale_b);
      }
    }
    record_cycles();
    if constexpr (kPromotes) probe_finish<kSubTiles * 64>(&accumulator[0][0], checksums, fragments, kWarpgroups);
    else probe_finish<64>(partial, checksums, fragments, kWarpgroups);  // sum of every group's product
  } else {
    static_assert(kPattern == WgmmaProbePattern::kOverlapHalves);
    constexpr int kGroups = 2 * kSubTiles;
    float accumulator[kSubTiles][64];
    float partial[2][32];
#pragma unroll
    for (int s = 0; s < kSubTiles; ++s)
#pragma unroll
      for (int i = 0; i < 64; ++i) accumulator[s][i] = 0.0f;
    constexpr uint32_t kHalfStep = (64 * kWgmmaProbeKBytes) >> 4;  // B rows [64, 128)
    for (int step = 0; step < iterations; ++step) {
      const float* a_scales = scale_table + (step % kWgmmaProbeScaleSteps) * 4;
      const float scale_b = b_scales[step % kWgmmaProbeScaleSteps];
      const auto promote = [&](int g) {
        const int s = g / 2, half = g % 2;
        fence_fragment(partial[half]);
        probe_promote(&accumulator[s][32 * half], partial[half], a_scales[2 * s] * scale_b,
                      a_scales[2 * s + 1] * scale_b);
      };
      probe_group(partial[0], a_low, b_low, true);
#pragma unroll
      for (int g = 1; g < kGroups; ++g) {
        probe_group(partial[g % 2], a_low + (g / 2) * kSubTileStep, b_low + (g % 2) * kHalfStep, true);
        wgmma_wait<1>();
        promote(g - 1);
      }
      wgmma_wait<0>();
      promote(kGroups - 1);
    }
    record_cycles();
    probe_finish<kSubTiles * 64>(&accumulator[0][0], checksums, fragments, kWarpgroups);
  }
}

}  // namespace megamoe::kernels::sm90
