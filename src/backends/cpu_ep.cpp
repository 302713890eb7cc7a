#include "megamoe/cpu_ep.h"

#include <algorithm>
#include <chrono>

#include "megamoe/error.h"

namespace megamoe {

CpuEpGroup::CpuEpGroup(int num_ranks, double timeout_seconds)
    : num_ranks_(num_ranks), timeout_seconds_(timeout_seconds) {
  MEGAMOE_CHECK(num_ranks >= 1, "CpuEpGroup: num_ranks = ", num_ranks, " must be >= 1");
  MEGAMOE_CHECK(timeout_seconds > 0, "CpuEpGroup: timeout_seconds = ", timeout_seconds, " must be > 0");
  slots_.assign(num_ranks, nullptr);
  values_.assign(num_ranks, 0);
  rank_generation_.assign(num_ranks, 0);
}

std::pair<int, int> CpuEpGroup::local_experts(int num_experts, int num_ranks, int rank) {
  MEGAMOE_CHECK(num_ranks >= 1 && rank >= 0 && rank < num_ranks, "local_experts: rank = ", rank,
                " must be in [0, num_ranks = ", num_ranks, ")");
  MEGAMOE_CHECK(num_experts >= num_ranks, "num_experts = ", num_experts, " must be >= the expert-parallel ranks = ",
                num_ranks, " (every rank holds at least one expert)");
  const int64_t first = static_cast<int64_t>(rank) * num_experts / num_ranks;
  const int64_t end = static_cast<int64_t>(rank + 1) * num_experts / num_ranks;
  return {static_cast<int>(first), static_cast<int>(end - first)};
}

void CpuEpGroup::check_rank(int rank, const char* call) const {
  MEGAMOE_CHECK(rank >= 0 && rank < num_ranks_, "CpuEpGroup::", call, ": rank = ", rank, " must be in [0, ",
                num_ranks_, ")");
}

void CpuEpGroup::barrier(int rank) {
  check_rank(rank, "barrier");
  std::unique_lock lock(mutex_);
  MEGAMOE_CHECK(abort_reason_.empty(), "CPU EP group aborted: ", abort_reason_);
  ++rank_generation_[rank];
  const uint64_t my_generation = generation_;
  if (++waiting_ == num_ranks_) {
    waiting_ = 0;
    ++generation_;
    arrived_.notify_all();
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds_);
  const bool released = arrived_.wait_until(
      lock, deadline, [&] { return generation_ != my_generation || !abort_reason_.empty(); });
  if (released && generation_ != my_generation) return;
  if (abort_reason_.empty()) {
    std::string missing;
    for (int r = 0; r < num_ranks_; ++r)
      if (rank_generation_[r] <= my_generation) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    abort_reason_ = detail::concat("rank ", rank, " waited ", timeout_seconds_,
                                   " s at a barrier that ranks {", missing, "} never reached (a rank skipped a collective)");
    arrived_.notify_all();
  }
  MEGAMOE_FAIL("CPU EP group aborted: ", abort_reason_);
}

int64_t CpuEpGroup::max_over_ranks(int rank, int64_t value) {
  check_rank(rank, "max_over_ranks");
  {
    std::lock_guard lock(mutex_);
    values_[rank] = value;
  }
  barrier(rank);
  int64_t result;
  {
    std::lock_guard lock(mutex_);
    result = *std::max_element(values_.begin(), values_.end());
  }
  barrier(rank);  // nobody overwrites values_ before everyone has read them
  return result;
}

void CpuEpGroup::post(int rank, const void* data) {
  check_rank(rank, "post");
  std::lock_guard lock(mutex_);
  slots_[rank] = data;
}

const void* CpuEpGroup::peer(int rank) const {
  check_rank(rank, "peer");
  std::lock_guard lock(mutex_);
  return slots_[rank];
}

void CpuEpGroup::abort(const std::string& reason) {
  std::lock_guard lock(mutex_);
  if (abort_reason_.empty()) abort_reason_ = reason;
  arrived_.notify_all();
}

}  // namespace megamoe
