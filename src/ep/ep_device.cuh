// Device helpers shared by every EP kernel: system-scope flag loads/stores, the bounded wait and the
// error record.
// NOTES:
// - Peers' writes become visible through a release (fence.sc/acq_rel.sys + store/atomic) on the
//   writer and an acquire load (ld.acquire.sys) on the reader.
// - A bounded wait never spins past ctx.wait_timeout_ns: the first waiter that times out records
//   (rank, phase, peer) with a CAS on the host-mapped record, sets ctx.failed, and every EP kernel
//   that starts afterwards returns immediately (outputs stay untouched; the host raises the error).
#pragma once

#include <cstdint>

#include "megamoe/ep.h"

namespace megamoe::ep_device {

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void add_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Device-scope (one GPU) word exchange between blocks of one kernel: a 64-bit store is single-copy
// atomic, so a word carrying (tag, value) needs no separate flag or fence.
__device__ __forceinline__ uint64_t load_relaxed_gpu(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_relaxed_gpu(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ bool group_failed(const EpDeviceContext& ctx) {
  return *reinterpret_cast<volatile int*>(ctx.failed) != 0;
}

// fail_group = false for input errors that the call survives (bad ids are treated as -1 so that peers
// are not left waiting); the host still raises the error at its next check.
__device__ inline void record_error(const EpDeviceContext& ctx, uint32_t code, EpPhase phase, int peer,
                                    uint64_t waited_ns, bool fail_group = true, const uint64_t* flag = nullptr,
                                    uint64_t observed = 0, uint64_t target = 0) {
  if (fail_group) atomicExch(ctx.failed, 1);
  if (atomicCAS(&ctx.error->code, 0u, 0xFFFFFFFFu) == 0u) {  // first error wins
    ctx.error->rank = ctx.rank;
    ctx.error->phase = static_cast<int32_t>(phase);
    ctx.error->peer = peer;
    ctx.error->waited_ns = waited_ns;
    ctx.error->flag_address = reinterpret_cast<uint64_t>(flag);
    ctx.error->observed = observed;
    ctx.error->target = target;
    __threadfence_system();
    atomicExch(&ctx.error->code, code);
  }
  __threadfence_system();
}

// Waits (one thread) until *flag >= target. Returns false after recording a timeout, or when another
// kernel already failed the group. sleep_ns > 0: __nanosleep between polls (the fused dispatch's expansion
// warps share their SM with sender warps; spinning would take their issue slots).
__device__ inline bool bounded_wait_geq(const EpDeviceContext& ctx, const uint64_t* flag, uint64_t target,
                                        EpPhase phase, int peer, unsigned sleep_ns = 0) {
  if (load_acquire_sys(flag) >= target) return true;
  const uint64_t start = globaltimer_ns();
  uint32_t polls = 0;
  while (load_acquire_sys(flag) < target) {
    if (sleep_ns) __nanosleep(sleep_ns);
    if ((++polls & 63u) == 0) {
      const uint64_t waited = globaltimer_ns() - start;
      if (group_failed(ctx)) return false;
      if (waited > ctx.wait_timeout_ns) {
        record_error(ctx, 1u, phase, peer, waited, true, flag, load_acquire_sys(flag), target);
        return false;
      }
    }
  }
  return true;
}

}  // namespace megamoe::ep_device
