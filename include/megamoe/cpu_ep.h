// CpuEpGroup: an in-process expert-parallel group for CPU backends and tests. N ranks are threads of
// one process; they meet at a barrier and exchange pointers through one slot per rank. It is the CPU
// stand-in for EpGroup (ep.h: NCCL + symmetric GPU memory) so that the data-parallel + expert-parallel
// lockstep logic of the engine and the server runs in CI; it moves no data between processes.
//
// NOTES: every collective (barrier, max_over_ranks, a backend's forward) must be entered by every
// rank, in the same order. A barrier that waits longer than `timeout_seconds` aborts the group: every
// waiting and later call then throws megamoe::Error naming the ranks that never arrived, instead of
// hanging (a rank that skipped a collective is a bug, never a slow path).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace megamoe {

class CpuEpGroup {
 public:
  explicit CpuEpGroup(int num_ranks, double timeout_seconds = 300.0);
  CpuEpGroup(const CpuEpGroup&) = delete;
  CpuEpGroup& operator=(const CpuEpGroup&) = delete;

  int num_ranks() const { return num_ranks_; }

  // Experts [first, first + count) of `rank` when `num_experts` are split over `num_ranks`: rank r
  // holds [r*E/N, (r+1)*E/N), so the counts differ by at most one (8 over 3 ranks: 2, 3, 3).
  static std::pair<int, int> local_experts(int num_experts, int num_ranks, int rank);

  // Blocks until all ranks arrived. Throws megamoe::Error when the group is (or gets) aborted.
  void barrier(int rank);
  // Collective: the maximum of `value` over all ranks.
  int64_t max_over_ranks(int rank, int64_t value);

  // Exchange slots: rank r writes slot r between collectives; the others read it after the next barrier.
  void post(int rank, const void* data);
  const void* peer(int rank) const;

  // Wakes every waiting rank with an error; all later collectives throw.
  void abort(const std::string& reason);

 private:
  void check_rank(int rank, const char* call) const;

  int num_ranks_;
  double timeout_seconds_;
  std::vector<const void*> slots_;
  std::vector<int64_t> values_;
  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  int waiting_ = 0;
  uint64_t generation_ = 0;
  std::vector<uint64_t> rank_generation_;  // barriers each rank has entered (names the missing ranks)
  std::string abort_reason_;
};

}  // namespace megamoe
