// Phase timing of the fused `mega` kernel (MoeBackend::set_phase_timing / last_phase_times): the stamp
// indices the kernel writes and the host-side reduction of its stamps into per-phase durations.
// Plain C++ (the kernel includes it for the indices; CI tests the reduction).
#pragma once

#include <cstdint>
#include <vector>

#include "megamoe/moe.h"

namespace megamoe {

// Boundaries one CTA stamps (%globaltimer, ns) when timing is on, in this order; phase i (1..7) runs
// from boundary i-1 to boundary i. The buffer is [ctas, kMegaPhaseStamps] u64.
enum MegaPhaseStamp : int {
  kMegaStampStart = 0,     // thread 0, first instruction of the CTA
  kMegaStampStaged,        // thread 0, own tokens staged and counted, ready published by the last CTA  -> "stage"
  kMegaStampOffsets,       // thread 0, every rank's ready seen, expert offsets summed                  -> "offsets"
  kMegaStampPulled,        // thread 0, this CTA's pulls done, pulled published by the last CTA         -> "pull"
  kMegaStampGemm1,         // the thread that bumps gemm1_done, after this CTA's LAST GEMM-1 tile        -> "gemm1"
  kMegaStampGemm2,         // math thread 0 after this CTA's tile loop (its last GEMM-2 tile)            -> "gemm2"
  kMegaStampCombineWait,   // math thread 0, every peer's combine pieces of my tokens arrived           -> "combine_wait"
  kMegaStampReduced,       // math thread 0, top-k reduce done (the last CTA: also pulled seen)          -> "reduce"
  kMegaPhaseStamps
};

// Per-phase durations from the stamps of `ctas` CTAs ([ctas, kMegaPhaseStamps], row-major), in phase
// order: stage, offsets, pull, gemm1, gemm2, combine_wait, reduce. Empty when ctas <= 0.
// NOTES: what the numbers mean.
// - Kernel start = the earliest CTA's start stamp. A stamp older than the CTA's previous boundary
//   means the CTA did nothing in that phase (no GEMM-1 tile: the stamp is left from an earlier
//   forward) or left early (a failed group): it counts as that previous boundary.
// - Boundary i = the LATEST CTA to pass it, relative to the kernel start; PhaseTime::us of phase i =
//   boundary i - boundary i-1. So the phases add up to the latest CTA's end - the earliest CTA's
//   start (~ the kernel's duration), and each is the time the slowest CTA added to the critical path
//   at that boundary; CTAs overlap phases (one runs GEMM-2 tiles while another finishes GEMM 1), so a
//   phase is NOT the time any one CTA spent in it. Launch skew counts into "stage".
// - PhaseTime::cta_mean_us = the mean over CTAs of the time each spent between its own two stamps.
std::vector<MoeBackend::PhaseTime> mega_phase_times(const uint64_t* stamps, int ctas);

}  // namespace megamoe
