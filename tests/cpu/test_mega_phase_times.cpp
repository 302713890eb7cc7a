// `mega` phase timing, host side (src/moe/mega_phase_times.h): per-CTA %globaltimer stamps reduced to
// per-phase durations (latest CTA per boundary, per-CTA means), with hand-computed expectations, and
// the bench layer's split text for mega's phase names.
#include <gtest/gtest.h>

#include <vector>

#include "bench/layer_bench.h"
#include "moe/mega_phase_times.h"

namespace megamoe {
namespace {

// Two CTAs, stamps in ns. CTA 0 starts 1000 ns before CTA 1 (launch skew); the kernel start is 10000.
//   CTA 0: 10000 11000 12000 15000 | 30000 50000 51000 52000
//   CTA 1: 11000 13000 14000 16000 | 35000 45000 52000 53000
// Boundaries (latest CTA - 10000): 3000 4000 6000 25000 40000 42000 43000.
TEST(MegaPhaseTimes, LatestCtaPerBoundaryAndPerCtaMeans) {
  const std::vector<uint64_t> stamps = {10000, 11000, 12000, 15000, 30000, 50000, 51000, 52000,
                                        11000, 13000, 14000, 16000, 35000, 45000, 52000, 53000};
  const std::vector<MoeBackend::PhaseTime> t = mega_phase_times(stamps.data(), 2);
  ASSERT_EQ(t.size(), 7u);
  const char* names[] = {"stage", "offsets", "pull", "gemm1", "gemm2", "combine_wait", "reduce"};
  const double us[] = {3.0, 1.0, 2.0, 19.0, 15.0, 2.0, 1.0};
  // CTA 0: 1000 1000 3000 15000 20000 1000 1000; CTA 1: 2000 1000 2000 19000 10000 7000 1000.
  const double mean_us[] = {1.5, 1.0, 2.5, 17.0, 15.0, 4.0, 1.0};
  double sum = 0;
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(t[i].phase, names[i]);
    EXPECT_DOUBLE_EQ(t[i].us, us[i]) << names[i];
    EXPECT_DOUBLE_EQ(t[i].cta_mean_us, mean_us[i]) << names[i];
    sum += t[i].us;
  }
  EXPECT_DOUBLE_EQ(sum, 43.0) << "the phases add up to latest end - earliest start";
}

// A CTA with no GEMM-1 tile leaves its GEMM-1 stamp from an earlier forward (older than its pull
// stamp): it counts as the pull stamp, so that CTA spends 0 in gemm1 and nothing goes negative.
TEST(MegaPhaseTimes, StaleStampCountsAsThePreviousBoundary) {
  const std::vector<uint64_t> stamps = {5000, 6000, 7000, 8000, 900 /* stale */, 20000, 21000, 22000,
                                        5000, 6000, 7000, 9000, 15000, 19000, 20000, 21000};
  const std::vector<MoeBackend::PhaseTime> t = mega_phase_times(stamps.data(), 2);
  ASSERT_EQ(t.size(), 7u);
  EXPECT_DOUBLE_EQ(t[3].us, 6.0);            // gemm1: latest is CTA 1 at 15000 - 5000 = 10000; pull 4000
  EXPECT_DOUBLE_EQ(t[3].cta_mean_us, 3.0);   // (0 + 6000) / 2
  EXPECT_DOUBLE_EQ(t[4].cta_mean_us, 8.0);   // (12000 + 4000) / 2
  for (const MoeBackend::PhaseTime& p : t) EXPECT_GE(p.us, 0.0) << p.phase;
  EXPECT_TRUE(mega_phase_times(stamps.data(), 0).empty());
}

TEST(MegaPhaseTimes, BenchSplitTextShortensMegaPhases) {
  const std::vector<MoeBackend::PhaseTime> t = {{"stage", 301}, {"offsets", 20.4}, {"pull", 900},     {"gemm1", 5000},
                                                {"gemm2", 3500}, {"combine_wait", 99.6}, {"reduce", 200}};
  EXPECT_EQ(bench::phase_split_text(t), "stg 301 / ofs 20 / pull 900 / g1 5000 / g2 3500 / cw 100 / red 200");
}

}  // namespace
}  // namespace megamoe
