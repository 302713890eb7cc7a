// The fused dispatch's work order (src/kernels/ep_dispatch_schedule.h) against an explicit merge: every
// send token and every receive row exactly once, in position order, and the deadlock property (a receive
// of row i from sender s comes after s's send of the token with slot i here, in position). Plain C++.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "kernels/ep_dispatch_schedule.h"

namespace megamoe::kernels {
namespace {

struct Routed {
  std::vector<std::vector<int>> token_slot;  // [T][R]: slot of token t on destination d, -1 = not sent
  std::vector<int32_t> slot_token;           // [R * C]
  std::vector<int32_t> send_count;           // [R]
};

Routed route(std::mt19937& rng, int R, int C, int T, double p_send) {
  Routed r;
  r.token_slot.assign(T, std::vector<int>(R, -1));
  r.slot_token.assign(static_cast<size_t>(R) * C, -7);
  r.send_count.assign(R, 0);
  std::bernoulli_distribution send(p_send);
  for (int t = 0; t < T; ++t)
    for (int d = 0; d < R; ++d)
      if (send(rng)) {
        r.token_slot[t][d] = r.send_count[d];
        r.slot_token[static_cast<size_t>(d) * C + r.send_count[d]] = t;
        ++r.send_count[d];
      }
  return r;
}

// p(t) = min over remote d of (tokens before t that go to d), computed by counting.
std::vector<int> positions(const Routed& r, int R, int me, int T) {
  std::vector<int> p(T, 0);
  std::vector<int> before(R, 0);
  for (int t = 0; t < T; ++t) {
    int m = R == 1 ? 0 : 1 << 30;
    for (int d = 0; d < R; ++d)
      if (d != me) m = std::min(m, before[d]);
    p[t] = m;
    for (int d = 0; d < R; ++d) before[d] += r.token_slot[t][d] >= 0;
  }
  return p;
}

void check_case(int R, int me, int C, int T, int lag, double p_send, std::vector<int> recv_rows, unsigned seed) {
  SCOPED_TRACE(::testing::Message() << "R " << R << " me " << me << " T " << T << " lag " << lag << " p " << p_send
                                    << " seed " << seed);
  std::mt19937 rng(seed);
  const Routed r = route(rng, R, C, T, p_send);
  int max_rows = 0;
  for (int s = 0; s < R; ++s)
    if (s != me) max_rows = std::max(max_rows, recv_rows[s]);
  DispatchSchedule sc;
  sc.slot_token = r.slot_token.data();
  sc.send_count = r.send_count.data();
  sc.ranks = R;
  sc.me = me;
  sc.capacity = C;
  sc.tokens = T;
  sc.lag = lag;
  sc.virtual_steps = dispatch_virtual_steps(r.send_count.data(), R, me, T, max_rows, lag);
  // Explicit merge: per step v, the sends with p(t) == v in token order, then R - 1 receive items.
  const std::vector<int> p = positions(r, R, me, T);
  std::vector<std::tuple<int, int, int, int>> expected;  // (step, kind 0 send / 1 receive, token or sender, row)
  for (int v = 0; v < sc.virtual_steps; ++v) {
    for (int t = 0; t < T; ++t)
      if (p[t] == v) expected.emplace_back(v, 0, t, -1);
    if (v >= lag)
      for (int j = 0; j < R - 1; ++j) expected.emplace_back(v, 1, (me + 1 + j) % R, v - lag);
  }
  for (int t = 0; t < T; ++t) ASSERT_LT(p[t], sc.virtual_steps) << "token " << t << " has no step";
  ASSERT_EQ(sc.items(), expected.size());
  std::set<int> sent;
  std::set<std::pair<int, int>> received;
  for (unsigned w = 0; w < sc.items(); ++w) {
    const int v = find_dispatch_step_host(sc, w);
    ASSERT_LE(sc.items_before(v), w);
    ASSERT_GT(sc.items_before(v + 1), w);
    int token = -1, sender = -1, row = -1;
    const bool is_send = sc.decode(w, v, &token, &sender, &row);
    const auto& e = expected[w];
    ASSERT_EQ(std::get<0>(e), v) << "item " << w;
    ASSERT_EQ(std::get<1>(e), is_send ? 0 : 1) << "item " << w;
    if (is_send) {
      ASSERT_EQ(std::get<2>(e), token) << "item " << w;
      sent.insert(token);
      // Deadlock property on the peers' side: this send's step is <= its slot on every destination.
      for (int d = 0; d < R; ++d) {
        if (d != me && r.token_slot[token][d] >= 0) {
          ASSERT_LE(v, r.token_slot[token][d]) << "token " << token;
        }
      }
    } else {
      ASSERT_EQ(std::get<2>(e), sender) << "item " << w;
      ASSERT_EQ(std::get<3>(e), row) << "item " << w;
      if (row < recv_rows[sender]) received.insert({sender, row});
    }
  }
  EXPECT_EQ(static_cast<int>(sent.size()), T);
  size_t rows = 0;
  for (int s = 0; s < R; ++s)
    if (s != me) rows += recv_rows[s];
  EXPECT_EQ(received.size(), rows);
}

TEST(EpDispatchSchedule, MatchesTheExplicitMerge) {
  unsigned seed = 1;
  for (int R : {1, 2, 3, 4, 8})
    for (int T : {0, 1, 37, 300})
      for (int lag : {0, 5, 64})
        for (double p_send : {0.0, 0.3, 0.97, 1.0}) {
          const int me = static_cast<int>(seed % R);
          std::vector<int> recv_rows(R, 0);
          std::mt19937 rng(seed * 7);
          for (int s = 0; s < R; ++s) recv_rows[s] = s == me ? 0 : static_cast<int>(rng() % 320);
          check_case(R, me, 320, T, lag, p_send, recv_rows, seed++);
        }
}

TEST(EpDispatchSchedule, EmptyCalls) {
  const int32_t counts[2] = {0, 0};
  EXPECT_EQ(dispatch_virtual_steps(counts, 2, 0, 0, 0, 16), 0);
  EXPECT_EQ(dispatch_virtual_steps(counts, 1, 0, 0, 0, 16), 0);
  EXPECT_EQ(dispatch_virtual_steps(counts, 1, 0, 5, 0, 16), 1);
  EXPECT_EQ(dispatch_virtual_steps(counts, 2, 0, 0, 3, 16), 19);  // receives only: rows 0..2 at steps 16..18
}

}  // namespace
}  // namespace megamoe::kernels
