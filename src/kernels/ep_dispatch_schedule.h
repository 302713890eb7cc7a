// Work order of the fused dispatch (ep_dispatch_fused_kernel, MEGAMOE_EP_OVERLAP=1; docs/ep.md "Overlap"):
// the send items (own tokens) and receive items (rows from other ranks) merged by a position, so that a
// row is expanded soon after it can have landed, without any residency assumption. Plain C++ (host and
// device): tests/cpu/test_ep_dispatch_schedule.cpp checks it against an explicit merge.
//
// Positions. Send token t: step p(t) = min over remote destinations d of (tokens before t that go to d),
// non-decreasing in t. Receive row i of sender s: step i + lag. Inside a step the sends come first, then
// one receive item per remote sender (me + 1 + j) % R, j < R - 1. A receive (s, i) waits for s's send of
// the token tau whose slot on this rank is i; p_s(tau) <= (tokens before tau that go to this rank) = i
// <= i + lag, and sends precede receives in a step, so a waiting item only ever waits for an item of
// smaller position: with tickets handed out in position order, the smallest incomplete position is
// always held by a running warp (no deadlock; any lag >= 0).
//
// Counting. sends_through(x) = sends with p(t) <= x = max over remote d of (x < send_count[d] ?
// slot_token[d][x] + 1 : T) (slot x of d holds the last token whose count before it, for d, is x), so
// items_before(v) = sends_through(v - 1) + (R - 1) * max(0, v - lag), non-decreasing in v. Every token
// has p(t) <= min_d send_count[d], so all sends sit in steps <= that; receive rows need steps
// < max_rows + lag.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define MEGAMOE_EP_HD __host__ __device__ __forceinline__
#else
#define MEGAMOE_EP_HD inline
#endif

namespace megamoe::kernels {

struct DispatchSchedule {
  const int32_t* slot_token = nullptr;  // [R, C]: token in (remote destination d, slot x), x < send_count[d]
  const int32_t* send_count = nullptr;  // [R]: slots per destination
  int ranks = 1, me = 0, capacity = 0, tokens = 0, lag = 0;
  int virtual_steps = 0;  // V: items live in steps [0, V)

  MEGAMOE_EP_HD int sends_through(int x) const {
    if (x < 0) return 0;
    if (ranks == 1) return tokens;
    int m = 0;
    for (int d = 0; d < ranks; ++d) {
      if (d == me) continue;
      const int n = x < send_count[d] ? slot_token[static_cast<size_t>(d) * capacity + x] + 1 : tokens;
      m = m > n ? m : n;
    }
    return m;
  }
  MEGAMOE_EP_HD unsigned items_before(int v) const {
    if (v <= 0) return 0;
    const int receive_steps = v - lag > 0 ? v - lag : 0;
    return static_cast<unsigned>(sends_through(v - 1)) + static_cast<unsigned>(ranks - 1) * static_cast<unsigned>(receive_steps);
  }
  MEGAMOE_EP_HD unsigned items() const { return items_before(virtual_steps); }

  // Item w (< items()) in step v (items_before(v) <= w < items_before(v + 1)): a send of token *token
  // (returns true) or a receive of row *row from sender *sender (returns false).
  MEGAMOE_EP_HD bool decode(unsigned w, int v, int* token, int* sender, int* row) const {
    const int first = sends_through(v - 1);
    const unsigned offset = w - items_before(v);
    const unsigned sends = static_cast<unsigned>(sends_through(v) - first);
    if (offset < sends) {
      *token = first + static_cast<int>(offset);
      return true;
    }
    *sender = (me + 1 + static_cast<int>(offset - sends)) % ranks;
    *row = v - lag;
    return false;
  }
};

// V for this call: max_rows = the most rows any other rank sent here.
MEGAMOE_EP_HD int dispatch_virtual_steps(const int32_t* send_count, int ranks, int me, int tokens, int max_rows, int lag) {
  if (ranks == 1) return tokens > 0 ? 1 : 0;
  int min_count = INT_MAX;
  for (int d = 0; d < ranks; ++d)
    if (d != me && send_count[d] < min_count) min_count = send_count[d];
  const int send_steps = tokens > 0 ? min_count + 1 : 0;
  const int receive_steps = max_rows > 0 ? max_rows + lag : 0;
  return send_steps > receive_steps ? send_steps : receive_steps;
}

// Host reference of the step search (the kernel does it warp-cooperatively): the largest v in [0, V)
// with items_before(v) <= w.
inline int find_dispatch_step_host(const DispatchSchedule& s, unsigned w) {
  int lo = 0, hi = s.virtual_steps;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (s.items_before(mid) <= w) lo = mid;
    else hi = mid;
  }
  return lo;
}

}  // namespace megamoe::kernels
