// Rank-count rules of the multi-GPU EP suites (tests/multigpu), CUDA-free so that tests/cpu checks them
// in CI (test_ep_test_ranks.cpp):
//   * MEGAMOE_TEST_RANKS picks the rank count (default 2, valid 2..8 = kMaxEpRanks);
//   * per-rank token counts for N ranks come from the 2-rank pair of each test by a fixed rule;
//   * expert counts are rounded up to a multiple of N (the library's rule: E % ranks == 0);
//   * which experts a seeded token picks, for every routing the suites use.
// For N = 2 every rule returns exactly the vectors, counts and expert choices the 2-rank suites used
// before they became rank-count-parametric, so 2-GPU results stay comparable across versions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace megamoe::testing {

inline constexpr const char* kTestRanksEnv = "MEGAMOE_TEST_RANKS";
inline constexpr int kDefaultTestRanks = 2;
inline constexpr int kMinTestRanks = 2;
inline constexpr int kMaxTestRanks = 8;  // == kMaxEpRanks (megamoe/ep.h); one NVLink domain

// The rank count `value` asks for (nullptr or "" = the default, 2), or -1 with `error` naming the
// variable, the value and the valid range.
inline int parse_test_ranks(const char* value, std::string* error) {
  if (value == nullptr || *value == '\0') return kDefaultTestRanks;
  char* end = nullptr;
  const long ranks = std::strtol(value, &end, 10);
  const bool digits_only = *value >= '0' && *value <= '9' && end != value && *end == '\0';  // no sign, no spaces
  if (!digits_only || ranks < kMinTestRanks || ranks > kMaxTestRanks) {
    *error = std::string(kTestRanksEnv) + " = '" + value + "' must be an integer in [" + std::to_string(kMinTestRanks) +
             ", " + std::to_string(kMaxTestRanks) + "]";
    return -1;
  }
  return static_cast<int>(ranks);
}

// parse_test_ranks of the environment.
inline int test_ranks(std::string* error) { return parse_test_ranks(std::getenv(kTestRanksEnv), error); }

// Token counts of N ranks from a test's 2-rank pair {first, last}: rank 0 gets `first`, rank N-1 gets
// `last`, rank r in between first + round((last - first) * r / (N - 1)) (half away from zero).
// Properties the suites rely on, for every N:
//   * N = 2 gives {first, last} exactly;
//   * every count lies in [min, max] of the pair, so the pair's capacity still holds;
//   * a 0 at either end stays (an empty rank: rank 0 for {0, x}, the last rank for {x, 0});
//   * |last - first| >= N - 1 makes every count distinct (unequal token counts on every rank).
inline std::vector<int> spread_tokens(int first, int last, int ranks) {
  std::vector<int> tokens(ranks);
  for (int r = 0; r < ranks; ++r)
    tokens[r] = ranks == 1 ? first
                           : first + static_cast<int>(std::lround(static_cast<double>(last - first) * r / (ranks - 1)));
  return tokens;
}

// `experts` rounded up to a multiple of `ranks`: every backend and the dispatcher require
// num_experts % ranks == 0. The suites' counts (4, 8, 16, 32) are unchanged for 2, 4 and 8 ranks.
inline int experts_for_ranks(int experts, int ranks) { return (experts + ranks - 1) / ranks * ranks; }

// MegaMulti.ChangingTokenCountsEveryCall: rank r's T at `call`, from the call's shared draw `tokens`
// (0..128): (tokens * (6r + 1) + r * call) mod 129. Rank 0 takes `tokens`, rank 1 (7 tokens + call)
// mod 129 as the 2-rank test did; all ranks stay within the capacity 128, and 0 occurs.
inline int changing_tokens(int tokens, int call, int rank) { return (tokens * (6 * rank + 1) + rank * call) % 129; }

// MoeWorkspaceMulti: T of rank r in call c (capacity 128). Ranks 0 and 1 keep the 2-rank table;
// rank r >= 2 takes rank (r mod 2)'s row rotated by r / 2 calls, so zeros, the capacity and unequal
// counts occur in the calls on any rank count.
inline int workspace_tokens(int rank, int call) {
  static constexpr int kTable[2][6] = {{50, 0, 128, 7, 90, 33}, {3, 128, 0, 64, 90, 120}};
  return kTable[rank % 2][(call + rank / 2) % 6];
}

// Routings of the suites' seeded inputs.
enum class Routing { kUniform, kSkewed, kAllToRank0, kPadded };
inline const char* routing_name(Routing r) {
  switch (r) {
    case Routing::kUniform: return "uniform";
    case Routing::kSkewed: return "skewed";
    case Routing::kAllToRank0: return "all_to_rank0";
    case Routing::kPadded: return "padded";
  }
  return "?";
}

// The expert ids of one token's top_k slots (-1 = padding) under `routing`, drawn from `rng`; the
// slot weights are drawn by the caller afterwards. kAllToRank0 uses only rank 0's experts
// [0, E / ranks): when it holds fewer than top_k experts (8 experts, top-3 on 4 or 8 ranks) the
// token takes all of them and pads the remaining slots with -1 (a token cannot select one expert
// twice). kPadded draws which slots become -1 after the weights (the caller's job).
inline std::vector<int> choose_experts(std::mt19937_64& rng, Routing routing, int num_experts, int top_k, int ranks) {
  const int per_rank = num_experts / ranks;
  const int distinct = routing == Routing::kAllToRank0 ? std::min(top_k, per_rank) : top_k;
  std::set<int> chosen;
  while (static_cast<int>(chosen.size()) < distinct) {
    int e = 0;
    switch (routing) {
      case Routing::kUniform:
      case Routing::kPadded: e = static_cast<int>(rng() % num_experts); break;
      case Routing::kSkewed: {  // Zipf(1.2)-like: low ids are hot
        const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
        e = std::min(num_experts - 1, static_cast<int>(std::pow(static_cast<double>(num_experts + 1), u)) - 1);
        break;
      }
      case Routing::kAllToRank0: e = static_cast<int>(rng() % per_rank); break;
    }
    chosen.insert(e);
  }
  std::vector<int> list(chosen.begin(), chosen.end());
  list.resize(top_k, -1);
  std::shuffle(list.begin(), list.end(), rng);
  return list;
}

}  // namespace megamoe::testing
