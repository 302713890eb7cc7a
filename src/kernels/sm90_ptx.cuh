// Thin wrappers over the sm_90a PTX the grouped GEMMs need. TMA and mbarrier go through CCCL
// `cuda::ptx`; wgmma (not in CCCL) and setmaxnreg are inline PTX here.
// NOTES: everything here is device-only and header-only; include from .cu files compiled for sm_90a.
#pragma once

#include <cuda/ptx>
#include <cstdint>

namespace megamoe::kernels::sm90 {

__device__ __forceinline__ uint32_t smem_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// ---- mbarrier -------------------------------------------------------------------------------------
__device__ __forceinline__ void barrier_init(uint64_t* barrier, uint32_t arrivals) {
  cuda::ptx::mbarrier_init(barrier, arrivals);
}
__device__ __forceinline__ void barrier_init_fence() {
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}
// Blocks until the phase with parity `parity` of `barrier` has completed.
// NOTES: a waiting producer thread re-polls every ~10 cycles (ncu, session 9) on the scheduler it shares
// with math warps; try_wait with a suspend-time hint (CUTLASS's 10 ms) was measured against this plain
// loop (docs/grouped_gemm.md "W4A8 v4") and gave no gain, so the loop stays.
__device__ __forceinline__ void barrier_wait(uint64_t* barrier, uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(barrier, parity)) {
  }
}
__device__ __forceinline__ void barrier_arrive(uint64_t* barrier) { cuda::ptx::mbarrier_arrive(barrier); }
__device__ __forceinline__ void barrier_arrive_expect_bytes(uint64_t* barrier, uint32_t bytes) {
  cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                       barrier, bytes);
}

// ---- thread-block clusters (v11 cluster kernels, docs/grouped_gemm.md "v11 clusters") ------------------
// This CTA's rank in its cluster, the cluster's index in the grid (x) and the number of clusters (x).
__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}
__device__ __forceinline__ uint32_t cluster_index_x() {
  uint32_t index;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(index));
  return index;
}
__device__ __forceinline__ uint32_t cluster_count_x() {
  uint32_t count;
  asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(count));
  return count;
}
// One arrival on the mbarrier at `barrier`'s offset in the shared memory of CTA `cta_rank` of this cluster
// (this CTA's own when cta_rank is its rank).
// NOTES: the default semantics (release at CTA scope), not .release.cluster: that form costs MEMBAR.ALL.CTA +
// MEMBAR.ALL.GPU + ERRBAR per arrival (SASS, CUDA 13), this one a lone SYNCS.ARRIVE.TRANS64.RED. The v11 cluster
// kernels hand no generic-proxy data across CTAs: the arrival releases a stage the caller READ with wgmma (async
// proxy, completed by wgmma.wait_group before the arrival) for the peer's TMA to overwrite; the waiting producer
// uses the plain barrier_wait (an acquire.cluster wait adds CCTL.IVALL, an L1 invalidation, per completed wait).
// CUTLASS's multicast pipelines release their stages the same way.
__device__ __forceinline__ void barrier_arrive_cluster(uint64_t* barrier, uint32_t cta_rank) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_address(barrier)),
      "r"(cta_rank)
      : "memory");
}
// Every thread of every CTA of the cluster: arrive (release) and wait (acquire). Not the .aligned form, so
// it may be reached from diverged warps (the producer warpgroup's idle lanes).
__device__ __forceinline__ void cluster_sync() {
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);
  cuda::ptx::barrier_cluster_wait(cuda::ptx::sem_acquire);
}

// ---- cp.async, 4 bytes, completion counted on an mbarrier ------------------------------------------
// Copies 4 bytes global -> shared, or zero-fills them when source_bytes = 0 (then nothing is read).
__device__ __forceinline__ void cp_async_4(void* smem_destination, const void* source, uint32_t source_bytes) {
  asm volatile("cp.async.ca.shared::cta.global [%0], [%1], 4, %2;" ::"r"(smem_address(smem_destination)),
               "l"(source), "r"(source_bytes)
               : "memory");
}
// One arrival on `barrier` once all of this thread's earlier cp.async have landed. .noinc: the arrival
// is one of the arrivals the barrier was initialised with (it does not add a pending one).
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* barrier) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_address(barrier)) : "memory");
}

// Blocks until all of this thread's cp.async have completed (before a thread with copies in flight exits).
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// ---- TMA: 2D tile global -> shared, completion counted in bytes on `barrier` ---------------------
__device__ __forceinline__ void tma_load_2d(void* smem_destination, const void* tensor_map, int32_t inner,
                                            int32_t outer, uint64_t* barrier) {
  const int32_t coordinates[2] = {inner, outer};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem_destination,
                                  tensor_map, coordinates, barrier);
}
// tma_load_2d into the same shared-memory offset of every CTA of the cluster in cta_mask (bit r = rank r),
// completion counted in bytes on the mbarrier at `barrier`'s offset in each of those CTAs.
__device__ __forceinline__ void tma_load_2d_multicast(void* smem_destination, const void* tensor_map, int32_t inner,
                                                      int32_t outer, uint64_t* barrier, uint16_t cta_mask) {
  const int32_t coordinates[2] = {inner, outer};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem_destination, tensor_map,
                                  coordinates, barrier, cta_mask);
}
__device__ __forceinline__ void prefetch_tensor_map(const void* tensor_map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(tensor_map)) : "memory");
}

// ---- 1-D bulk copy shared -> global (TMA engine, no tensor map) and its per-thread bulk groups ------
// NOTES: addresses 16-byte aligned, size a multiple of 16. The groups belong to the issuing thread:
// only it can wait for them. Shared-memory writes a bulk copy reads must be made visible to the async
// proxy first (fence_proxy_async_shared by the writers, then a barrier with the issuing thread).
__device__ __forceinline__ void st_shared_b32(uint32_t smem_byte_address, uint32_t value) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(smem_byte_address), "r"(value) : "memory");
}
__device__ __forceinline__ void st_shared_b16(uint32_t smem_byte_address, uint16_t value) {
  asm volatile("st.shared.b16 [%0], %1;" ::"r"(smem_byte_address), "h"(value) : "memory");
}
__device__ __forceinline__ void fence_proxy_async_shared() { cuda::ptx::fence_proxy_async(cuda::ptx::space_shared); }
__device__ __forceinline__ void bulk_copy_shared_to_global(void* global_destination, const void* smem_source,
                                                           uint32_t bytes) {
  cuda::ptx::cp_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, global_destination, smem_source, bytes);
}
// 2-D TMA store shared -> global of one box of tensor_map at (inner, outer), committed into this thread's bulk
// groups (bulk_commit_group / bulk_wait_*). NOTES: the box's shared image must be visible to the async proxy first
// (fence_proxy_async_shared by its writers, then a barrier with the issuing thread); elements past the tensor's
// bounds are not written (TMA clips the box).
__device__ __forceinline__ void tma_store_2d(const void* tensor_map, const void* smem_source, int32_t inner,
                                             int32_t outer) {
  const int32_t coordinates[2] = {inner, outer};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, tensor_map, coordinates,
                                  smem_source);
}
__device__ __forceinline__ void bulk_commit_group() { cuda::ptx::cp_async_bulk_commit_group(); }
// All of this thread's bulk groups have finished READING their shared-memory source (it may be reused).
__device__ __forceinline__ void bulk_wait_all_read() { cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{}); }
// All of this thread's bulk groups are complete (their global writes performed).
__device__ __forceinline__ void bulk_wait_all() { cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{}); }
// All of this thread's bulk groups but the kPending most recently committed are complete.
template <int kPending>
__device__ __forceinline__ void bulk_wait_all_but() {
  cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<kPending>{});
}

// ---- register reallocation between warpgroups ------------------------------------------------------
template <uint32_t kRegisters>
__device__ __forceinline__ void registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}
template <uint32_t kRegisters>
__device__ __forceinline__ void registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

// Named barrier over `threads` threads (a multiple of 32); id 0 is __syncthreads'.
// NOTES: bar.sync is barrier.sync.aligned: every thread of a warp must execute it together. The
// compiler does not know that about inline asm, so after a lane-divergent branch (e.g. `if (lane < 8)
// bulk_wait_all_read();`) it may issue the barrier from a still-diverged warp: undefined behaviour, seen
// as a hang of the 64-row FP8 SwiGLU bulk-store epilogue (compute-sanitizer synccheck: "Divergent
// thread(s) in block" at this line). __syncwarp() reconverges the warp first; every caller passes whole
// warps.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  __syncwarp();
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// Execution-order-only variants (no "memory" clobber): for hand-offs that order instructions (e.g.
// wgmma issue, itself asm volatile and therefore never moved across these) but publish no memory, so
// the compiler may still schedule ordinary loads across them. bar.arrive does not wait: it is the
// producer half of a hand-off whose consumer half is the sync on the same id.
template <uint32_t kId, uint32_t kThreads>
__device__ __forceinline__ void named_barrier_sync_order_only() {
  asm volatile("bar.sync %0, %1;" ::"n"(kId), "n"(kThreads));
}
template <uint32_t kId, uint32_t kThreads>
__device__ __forceinline__ void named_barrier_arrive_order_only() {
  asm volatile("bar.arrive %0, %1;" ::"n"(kId), "n"(kThreads));
}

// ---- wgmma -----------------------------------------------------------------------------------------
// Shared-memory matrix descriptor for a K-major tile written by TMA with 128-byte swizzle: rows of
// 128 bytes, 8-row (1024-byte) swizzle atoms. The tile base must be 1024-byte aligned; stepping K by
// 32 bytes inside the atom is a +32-byte start address (the swizzle acts on absolute address bits).
__device__ __forceinline__ uint64_t make_kmajor_sw128_descriptor(uint32_t smem_byte_address) {
  uint64_t descriptor = 0;
  descriptor |= static_cast<uint64_t>((smem_byte_address & 0x3FFFF) >> 4);  // start address
  descriptor |= static_cast<uint64_t>(1) << 16;                            // leading byte offset (unused)
  descriptor |= static_cast<uint64_t>(1024 >> 4) << 32;                    // stride byte offset: 8 rows
  descriptor |= static_cast<uint64_t>(1) << 62;                            // 128-byte swizzle
  return descriptor;
}

// The same descriptor as two 32-bit words, for mainloops that step it by constant adds (v7).
// NOTES: shared-window addresses are < 2^18 (at most 228 KiB per CTA), so the start-address field
// (bits 0-13) is address >> 4 without the mask, and adding d >> 4 for an address step of d bytes
// (a multiple of 16 that stays in the window) never carries into the leading-byte-offset field at
// bit 16: kmajor_sw128_descriptor_low(x) + (d >> 4) == kmajor_sw128_descriptor_low(x + d). The upper
// word (stride byte offset, swizzle mode) is a constant.
constexpr uint32_t kSw128DescriptorHigh = (1024 >> 4) | (1u << 30);
__device__ __forceinline__ uint32_t kmajor_sw128_descriptor_low(uint32_t smem_byte_address) {
  return (smem_byte_address >> 4) | (1u << 16);
}
__device__ __forceinline__ uint64_t sw128_descriptor_from_low(uint32_t low) {
  return (static_cast<uint64_t>(kSw128DescriptorHigh) << 32) | low;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accumulator accesses across wgmma fences/waits.
__device__ __forceinline__ void fence_operand(float& value) { asm volatile("" : "+f"(value)::"memory"); }

// D[64x128] (+)= A[64x32] * B[128x32]^T, E4M3 x E4M3 -> FP32, both operands K-major in shared memory.
// `accumulate` = 0 overwrites D (zero-initialised product), 1 adds.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t a_descriptor,
                                                      uint64_t b_descriptor, uint32_t accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a_descriptor), "l"(b_descriptor), "r"(accumulate));
}

// D[64x192] (+)= A[64x32] * B[192x32]^T, E4M3 x E4M3 -> FP32, both operands K-major in shared memory (v11,
// src/kernels/sm90_fp8_wide_grouped_gemm.cuh). `accumulate` = 0 overwrites D, 1 adds.
// NOTES: register fragment as every m64nNk32 (PTX ISA, "Matrix fragments for wgmma.mma_async .m64nNk32",
// accumulator D): register d_i of thread t holds row 16 (t / 32) + (t % 32) / 4 + 8 ((i / 2) % 2) and column
// 8 (i / 4) + 2 (t % 4) + i % 2, so registers 0..63 are exactly the m64n128 fragment of columns [0, 128).
__device__ __forceinline__ void wgmma_m64n192k32_e4m3(float (&d)[96], uint64_t a_descriptor,
                                                      uint64_t b_descriptor, uint32_t accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %98, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, %96, %97, p, 1, 1;\n"
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
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
      : "l"(a_descriptor), "l"(b_descriptor), "r"(accumulate));
}

// D[64x64] (+)= A[64x32] * B[64x32]^T, E4M3 x E4M3 -> FP32 (32 registers: the first or second half of
// the m64n128 fragment's columns, register i here = register i + 32 * half there).
__device__ __forceinline__ void wgmma_m64n64k32_e4m3(float (&d)[32], uint64_t a_descriptor, uint64_t b_descriptor,
                                                     uint32_t accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a_descriptor), "l"(b_descriptor), "r"(accumulate));
}

// D[64x128] (+)= A[64x16] * B[128x16]^T, BF16 x BF16 -> FP32, both operands K-major in shared memory
// (imm-trans-a = imm-trans-b = 0). `accumulate` = 0 overwrites D, 1 adds.
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t a_descriptor,
                                                      uint64_t b_descriptor, uint32_t accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a_descriptor), "l"(b_descriptor), "r"(accumulate));
}

// D[64x256] (+)= A[64x16] * B[256x16]^T, BF16 x BF16 -> FP32, both operands K-major in shared memory
// (imm-trans-a = imm-trans-b = 0). `accumulate` = 0 overwrites D, 1 adds. BF16 v2 (docs/grouped_gemm.md
// "BF16 v2"): one math warpgroup holds a 64 x 256 tile in 128 FP32 registers.
// NOTES: the register fragment of D is two m64n128 fragments back to back: d[h][i] (register 64 h + i)
// = the m64n128 fragment's register i of columns [128 h, 128 h + 128). PTX ISA, "Asynchronous Warpgroup
// Level Matrix Operations" > "Register Fragments and Shared Memory Matrix Layouts" > "Matrix fragments
// for wgmma.mma_async .m64nNk16", figure "WGMMA .m64nNk16 register fragment layout for accumulator
// matrix D": register d_i of thread t holds row 16 (t / 32) + (t % 32) / 4 + 8 ((i / 2) % 2) and column
// 8 (i / 4) + 2 (t % 4) + i % 2, for every N, so i -> i + 64 is column + 128 with the same row; the
// m64n128 epilogues (fragment register 4j + 2h + c) apply to each half unchanged.
__device__ __forceinline__ void wgmma_m64n256k16_bf16(float (&d)[2][64], uint64_t a_descriptor,
                                                      uint64_t b_descriptor, uint32_t accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[0][4]), "+f"(d[0][5]), "+f"(d[0][6]), "+f"(d[0][7]),
        "+f"(d[0][8]), "+f"(d[0][9]), "+f"(d[0][10]), "+f"(d[0][11]), "+f"(d[0][12]), "+f"(d[0][13]), "+f"(d[0][14]), "+f"(d[0][15]),
        "+f"(d[0][16]), "+f"(d[0][17]), "+f"(d[0][18]), "+f"(d[0][19]), "+f"(d[0][20]), "+f"(d[0][21]), "+f"(d[0][22]), "+f"(d[0][23]),
        "+f"(d[0][24]), "+f"(d[0][25]), "+f"(d[0][26]), "+f"(d[0][27]), "+f"(d[0][28]), "+f"(d[0][29]), "+f"(d[0][30]), "+f"(d[0][31]),
        "+f"(d[0][32]), "+f"(d[0][33]), "+f"(d[0][34]), "+f"(d[0][35]), "+f"(d[0][36]), "+f"(d[0][37]), "+f"(d[0][38]), "+f"(d[0][39]),
        "+f"(d[0][40]), "+f"(d[0][41]), "+f"(d[0][42]), "+f"(d[0][43]), "+f"(d[0][44]), "+f"(d[0][45]), "+f"(d[0][46]), "+f"(d[0][47]),
        "+f"(d[0][48]), "+f"(d[0][49]), "+f"(d[0][50]), "+f"(d[0][51]), "+f"(d[0][52]), "+f"(d[0][53]), "+f"(d[0][54]), "+f"(d[0][55]),
        "+f"(d[0][56]), "+f"(d[0][57]), "+f"(d[0][58]), "+f"(d[0][59]), "+f"(d[0][60]), "+f"(d[0][61]), "+f"(d[0][62]), "+f"(d[0][63]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[1][4]), "+f"(d[1][5]), "+f"(d[1][6]), "+f"(d[1][7]),
        "+f"(d[1][8]), "+f"(d[1][9]), "+f"(d[1][10]), "+f"(d[1][11]), "+f"(d[1][12]), "+f"(d[1][13]), "+f"(d[1][14]), "+f"(d[1][15]),
        "+f"(d[1][16]), "+f"(d[1][17]), "+f"(d[1][18]), "+f"(d[1][19]), "+f"(d[1][20]), "+f"(d[1][21]), "+f"(d[1][22]), "+f"(d[1][23]),
        "+f"(d[1][24]), "+f"(d[1][25]), "+f"(d[1][26]), "+f"(d[1][27]), "+f"(d[1][28]), "+f"(d[1][29]), "+f"(d[1][30]), "+f"(d[1][31]),
        "+f"(d[1][32]), "+f"(d[1][33]), "+f"(d[1][34]), "+f"(d[1][35]), "+f"(d[1][36]), "+f"(d[1][37]), "+f"(d[1][38]), "+f"(d[1][39]),
        "+f"(d[1][40]), "+f"(d[1][41]), "+f"(d[1][42]), "+f"(d[1][43]), "+f"(d[1][44]), "+f"(d[1][45]), "+f"(d[1][46]), "+f"(d[1][47]),
        "+f"(d[1][48]), "+f"(d[1][49]), "+f"(d[1][50]), "+f"(d[1][51]), "+f"(d[1][52]), "+f"(d[1][53]), "+f"(d[1][54]), "+f"(d[1][55]),
        "+f"(d[1][56]), "+f"(d[1][57]), "+f"(d[1][58]), "+f"(d[1][59]), "+f"(d[1][60]), "+f"(d[1][61]), "+f"(d[1][62]), "+f"(d[1][63])
      : "l"(a_descriptor), "l"(b_descriptor), "r"(accumulate));
}

}  // namespace megamoe::kernels::sm90
