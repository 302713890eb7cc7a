// Host-side reduction of the `mega` kernel's phase stamps (mega_phase_times.h).
#include "moe/mega_phase_times.h"

#include <algorithm>
#include <limits>

namespace megamoe {

std::vector<MoeBackend::PhaseTime> mega_phase_times(const uint64_t* stamps, int ctas) {
  static constexpr const char* kNames[kMegaPhaseStamps - 1] = {"stage",  "offsets",      "pull",  "gemm1",
                                                               "gemm2", "combine_wait", "reduce"};
  if (ctas <= 0) return {};
  uint64_t start = std::numeric_limits<uint64_t>::max();
  for (int c = 0; c < ctas; ++c) start = std::min(start, stamps[static_cast<size_t>(c) * kMegaPhaseStamps]);
  uint64_t latest[kMegaPhaseStamps] = {};  // boundary i: max over CTAs of (stamp - start)
  double cta_sum[kMegaPhaseStamps] = {};   // phase i: sum over CTAs of (stamp i - stamp i-1)
  for (int c = 0; c < ctas; ++c) {
    const uint64_t* row = stamps + static_cast<size_t>(c) * kMegaPhaseStamps;
    uint64_t previous = row[0];
    for (int b = 1; b < kMegaPhaseStamps; ++b) {
      const uint64_t at = std::max(row[b], previous);  // stale / missing stamps count as the previous one
      latest[b] = std::max(latest[b], at - start);
      cta_sum[b] += static_cast<double>(at - previous);
      previous = at;
    }
  }
  std::vector<MoeBackend::PhaseTime> phases;
  for (int b = 1; b < kMegaPhaseStamps; ++b) {
    // latest[] is non-decreasing in b: every CTA's clamped stamps are.
    MoeBackend::PhaseTime t;
    t.phase = kNames[b - 1];
    t.us = 1e-3 * static_cast<double>(latest[b] - latest[b - 1]);
    t.cta_mean_us = 1e-3 * cta_sum[b] / ctas;
    phases.push_back(t);
  }
  return phases;
}

}  // namespace megamoe
