// The rank-count rules of the multi-GPU EP suites (tests/common/ep_test_ranks.h), checked in CI: the
// MEGAMOE_TEST_RANKS parsing, and for every N in 2..8 the properties each suite relies on (token
// counts within capacity, unequal, an empty rank where the 2-rank pair had one, expert counts the
// library accepts, all-to-rank-0 routing that terminates), and for N = 2 the exact inputs of the
// suites before they became rank-count-parametric.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/ep_test_ranks.h"

namespace megamoe::testing {
namespace {

TEST(EpTestRanks, ParsesTheEnvironmentValue) {
  std::string error;
  EXPECT_EQ(parse_test_ranks(nullptr, &error), 2);
  EXPECT_EQ(parse_test_ranks("", &error), 2);
  for (int n = 2; n <= 8; ++n) EXPECT_EQ(parse_test_ranks(std::to_string(n).c_str(), &error), n);
  EXPECT_TRUE(error.empty()) << error;
  for (const char* bad : {"1", "0", "9", "16", "-4", "four", "4x", " 4"}) {
    error.clear();
    EXPECT_EQ(parse_test_ranks(bad, &error), -1) << bad;
    EXPECT_EQ(error, std::string("MEGAMOE_TEST_RANKS = '") + bad + "' must be an integer in [2, 8]");
  }
}

// Every {first, last} pair the suites use, with the capacity it must respect.
struct Pair {
  int first, last, capacity;
};
const std::vector<Pair> kSuitePairs = {
    {50, 70, 160},     {131, 160, 160}, {90, 0, 160}, {2304, 2100, 2304},  // EpMulti
    {61, 83, 96},      {0, 50, 64},                                         // EpMulti staged, MegaMulti
    {200, 151, 300},                                                        // MegaMulti wide
};

TEST(EpTestRanks, TwoRanksKeepTheSuitesTokenPairs) {
  for (const Pair& p : kSuitePairs) EXPECT_EQ(spread_tokens(p.first, p.last, 2), std::vector<int>({p.first, p.last}));
  EXPECT_EQ(spread_tokens(61, 83, 4), std::vector<int>({61, 68, 76, 83}));
  EXPECT_EQ(spread_tokens(0, 50, 8), std::vector<int>({0, 7, 14, 21, 29, 36, 43, 50}));
  EXPECT_EQ(spread_tokens(90, 0, 4), std::vector<int>({90, 60, 30, 0}));
}

TEST(EpTestRanks, SpreadTokensKeepsEachSuitesPropertiesOnEveryRankCount) {
  for (int n = 2; n <= 8; ++n)
    for (const Pair& p : kSuitePairs) {
      SCOPED_TRACE(::testing::Message() << n << " ranks, pair {" << p.first << ", " << p.last << "}");
      const std::vector<int> t = spread_tokens(p.first, p.last, n);
      ASSERT_EQ(static_cast<int>(t.size()), n);
      EXPECT_EQ(t.front(), p.first);
      EXPECT_EQ(t.back(), p.last);
      for (int v : t) {
        EXPECT_GE(v, std::min(p.first, p.last));
        EXPECT_LE(v, std::max(p.first, p.last));
        EXPECT_LE(v, p.capacity);
      }
      EXPECT_EQ(std::set<int>(t.begin(), t.end()).size(), t.size()) << "token counts must differ on every rank";
      // An empty rank stays empty, and it is the only one (the others have tokens to send to it).
      EXPECT_EQ(std::count(t.begin(), t.end(), 0), (p.first == 0 || p.last == 0) ? 1 : 0);
    }
}

TEST(EpTestRanks, ExpertCountsAreMultiplesOfTheRanks) {
  for (int base : {4, 8, 16, 32}) {
    EXPECT_EQ(experts_for_ranks(base, 2), base);
    EXPECT_EQ(experts_for_ranks(base, 4), base == 4 ? 4 : base);
    EXPECT_EQ(experts_for_ranks(base, 8), base == 4 ? 8 : base);
    for (int n = 2; n <= 8; ++n) {
      const int e = experts_for_ranks(base, n);
      EXPECT_EQ(e % n, 0) << base << " experts, " << n << " ranks";
      EXPECT_GE(e, base);
      EXPECT_LT(e, base + n);
    }
  }
  EXPECT_EQ(experts_for_ranks(8, 3), 9);
  EXPECT_EQ(experts_for_ranks(4, 3), 6);
}

// MegaMulti.ChangingTokenCountsEveryCall's 24 calls, with the test's own shared draws.
TEST(EpTestRanks, ChangingTokenCountsStayInCapacityAndCoverEveryRank) {
  for (int call = 0; call < 24; ++call) {
    std::mt19937 rng(1000 + call);
    const int tokens = (rng() % 4 == 0) ? 0 : static_cast<int>(rng() % 129);
    EXPECT_EQ(changing_tokens(tokens, call, 0), tokens);
    EXPECT_EQ(changing_tokens(tokens, call, 1), (tokens * 7 + call) % 129);  // the 2-rank test's rank 1
  }
  for (int n = 2; n <= 8; ++n) {
    std::vector<int> checked(n, 0);
    int calls_with_an_empty_rank = 0, calls_with_unequal_counts = 0;
    for (int call = 0; call < 24; ++call) {
      std::mt19937 rng(1000 + call);
      const int tokens = (rng() % 4 == 0) ? 0 : static_cast<int>(rng() % 129);
      std::set<int> counts;
      bool empty = false;
      for (int r = 0; r < n; ++r) {
        const int t = changing_tokens(tokens, call, r);
        EXPECT_GE(t, 0);
        EXPECT_LE(t, 128) << "capacity of the test's layer";
        checked[r] += t;
        counts.insert(t);
        empty = empty || t == 0;
      }
      calls_with_an_empty_rank += empty;
      calls_with_unequal_counts += counts.size() > 1;
    }
    for (int r = 0; r < n; ++r) EXPECT_GT(checked[r], 0) << "rank " << r << " of " << n << " never had tokens";
    EXPECT_GT(calls_with_an_empty_rank, 0) << n << " ranks";
    EXPECT_GT(calls_with_unequal_counts, 12) << n << " ranks";
  }
}

TEST(EpTestRanks, WorkspaceTokensKeepTheTwoRankTable) {
  const int table[2][6] = {{50, 0, 128, 7, 90, 33}, {3, 128, 0, 64, 90, 120}};
  for (int r = 0; r < 2; ++r)
    for (int call = 0; call < 6; ++call) EXPECT_EQ(workspace_tokens(r, call), table[r][call]);
  for (int n = 2; n <= 8; ++n) {
    std::vector<int> total(n, 0);
    for (int call = 0; call < 6; ++call)
      for (int r = 0; r < n; ++r) {
        const int t = workspace_tokens(r, call);
        EXPECT_GE(t, 0);
        EXPECT_LE(t, 128);
        total[r] += t;
      }
    for (int r = 0; r < n; ++r) EXPECT_GT(total[r], 0);
  }
  EXPECT_EQ(workspace_tokens(2, 0), 0);    // rank 0's row shifted by one call
  EXPECT_EQ(workspace_tokens(7, 0), 64);   // rank 1's row shifted by three calls
}

// The expert choice of the 2-rank harness before this change, kept here as the oracle for N = 2.
std::vector<int> choose_experts_two_rank_harness(std::mt19937_64& rng, Routing routing, int num_experts, int top_k,
                                                 int ranks) {
  const int per_rank = num_experts / ranks;
  std::set<int> chosen;
  while (static_cast<int>(chosen.size()) < top_k) {
    int e = 0;
    switch (routing) {
      case Routing::kUniform:
      case Routing::kPadded: e = static_cast<int>(rng() % num_experts); break;
      case Routing::kSkewed: {
        const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
        e = std::min(num_experts - 1, static_cast<int>(std::pow(static_cast<double>(num_experts + 1), u)) - 1);
        break;
      }
      case Routing::kAllToRank0: e = static_cast<int>(rng() % per_rank); break;
    }
    chosen.insert(e);
  }
  std::vector<int> list(chosen.begin(), chosen.end());
  std::shuffle(list.begin(), list.end(), rng);
  return list;
}

const Routing kRoutings[] = {Routing::kUniform, Routing::kSkewed, Routing::kAllToRank0, Routing::kPadded};
// (experts, top_k) of the suites' layers and dispatch cases.
const std::vector<std::pair<int, int>> kSuiteShapes = {{8, 3}, {8, 2}, {8, 4}, {16, 4}, {16, 8}, {32, 8}, {4, 2}};

TEST(EpTestRanks, TwoRanksChooseTheSameExpertsAsBefore) {
  for (const auto& [experts, top_k] : kSuiteShapes)
    for (Routing routing : kRoutings) {
      SCOPED_TRACE(::testing::Message() << experts << " experts, top-" << top_k << ", " << routing_name(routing));
      std::mt19937_64 now(77), before(77);
      for (int t = 0; t < 300; ++t)
        ASSERT_EQ(choose_experts(now, routing, experts, top_k, 2),
                  choose_experts_two_rank_harness(before, routing, experts, top_k, 2))
            << "token " << t;
      EXPECT_EQ(now(), before()) << "the random stream must advance identically";
    }
}

TEST(EpTestRanks, EveryRoutingTerminatesAndStaysValidOnEveryRankCount) {
  for (int n = 2; n <= 8; ++n)
    for (const auto& [base, top_k] : kSuiteShapes)
      for (Routing routing : kRoutings) {
        const int experts = experts_for_ranks(base, n), per_rank = experts / n;
        SCOPED_TRACE(::testing::Message() << n << " ranks, " << experts << " experts, top-" << top_k << ", "
                                          << routing_name(routing));
        std::mt19937_64 rng(5 + n);
        std::set<int> owners;
        for (int t = 0; t < 200; ++t) {
          const std::vector<int> ids = choose_experts(rng, routing, experts, top_k, n);
          ASSERT_EQ(static_cast<int>(ids.size()), top_k);
          std::set<int> valid;
          for (int id : ids) {
            if (id < 0) continue;
            ASSERT_LT(id, experts);
            EXPECT_TRUE(valid.insert(id).second) << "expert " << id << " chosen twice";
            owners.insert(id / per_rank);
          }
          if (routing == Routing::kAllToRank0) {
            EXPECT_EQ(static_cast<int>(valid.size()), std::min(top_k, per_rank));
            for (int id : valid) EXPECT_LT(id, per_rank) << "all-to-rank-0 chose an expert of rank " << id / per_rank;
          } else {
            EXPECT_EQ(static_cast<int>(valid.size()), top_k);
          }
        }
        if (routing == Routing::kAllToRank0) {
          EXPECT_EQ(owners, std::set<int>({0}));
        }
        if (routing == Routing::kUniform) {
          EXPECT_EQ(static_cast<int>(owners.size()), n) << "uniform reaches every rank";
        }
      }
}

}  // namespace
}  // namespace megamoe::testing
