// The `mega` backend's per-forward path choice (src/moe/mega_path_heuristics.h): the rows estimate,
// the threshold on both sides, the token count the ranks agree on, MEGAMOE_MEGA_PATH parsing, and when
// the split path's scratch is needed. Plain C++.
#include <gtest/gtest.h>

#include <string>

#include "megamoe/error.h"
#include "moe/mega_path_heuristics.h"

namespace megamoe {
namespace {

TEST(MegaPathHeuristics, RowsPerLocalExpert) {
  // dsv3 on 2 ranks: 128 local experts, top-8.
  EXPECT_EQ(mega_rows_per_local_expert(128, 8, 128), 8);
  EXPECT_EQ(mega_rows_per_local_expert(2048, 8, 128), 128);
  EXPECT_EQ(mega_rows_per_local_expert(8192, 8, 128), 512);
  // qwen3-30b on 2 ranks: 64 local experts.
  EXPECT_EQ(mega_rows_per_local_expert(128, 8, 64), 16);
  EXPECT_EQ(mega_rows_per_local_expert(0, 8, 64), 0);
  EXPECT_EQ(mega_rows_per_local_expert(-5, 8, 64), 0) << "negative counts clamp to 0";
  EXPECT_EQ(mega_rows_per_local_expert(10, 2, 0), 20) << "local experts clamp to 1";
}

TEST(MegaPathHeuristics, AutoPicksFusedUpToTheThresholdAndSplitAbove) {
  // The measured sizes (header table): fused wins at 8-16 rows per local expert, split from 128 up.
  EXPECT_EQ(choose_mega_path(MegaPathMode::kAuto, 128, 8, 128), MegaPath::kFused);   // dsv3, 8 rows
  EXPECT_EQ(choose_mega_path(MegaPathMode::kAuto, 2048, 8, 128), MegaPath::kSplit);  // dsv3, 128 rows
  EXPECT_EQ(choose_mega_path(MegaPathMode::kAuto, 8192, 8, 128), MegaPath::kSplit);
  EXPECT_EQ(choose_mega_path(MegaPathMode::kAuto, 128, 8, 64), MegaPath::kFused);    // qwen3, 16 rows
  EXPECT_EQ(choose_mega_path(MegaPathMode::kAuto, 2048, 8, 64), MegaPath::kSplit);
  // The threshold itself, on both sides: rows = tokens * 8 / 64 = tokens / 8.
  EXPECT_EQ(choose_mega_path(MegaPathMode::kAuto, kMegaFusedMaxRowsPerExpert * 8, 8, 64), MegaPath::kFused);
  EXPECT_EQ(choose_mega_path(MegaPathMode::kAuto, kMegaFusedMaxRowsPerExpert * 8 + 8, 8, 64), MegaPath::kSplit);
  EXPECT_EQ(choose_mega_path(MegaPathMode::kAuto, 0, 8, 64), MegaPath::kFused) << "zero tokens";
  // W4A8: split from one row per local expert (tokens * top_k / local experts, rounded down) up
  // (measured: split faster at 8, 32 and 128 rows); below that, and with no agreed count, fused.
  const int64_t w4a8 = mega_fused_max_rows_per_expert(true);
  EXPECT_EQ(w4a8, kMegaFusedMaxRowsPerExpertW4a8);
  EXPECT_EQ(mega_fused_max_rows_per_expert(false), kMegaFusedMaxRowsPerExpert);
  for (int64_t tokens : {16, 128, 512, 8192})
    EXPECT_EQ(choose_mega_path(MegaPathMode::kAuto, tokens, 8, 128, w4a8), MegaPath::kSplit) << tokens;
  for (int64_t tokens : {1, 8, 15})
    EXPECT_EQ(choose_mega_path(MegaPathMode::kAuto, tokens, 8, 128, w4a8), MegaPath::kFused) << tokens;
  EXPECT_EQ(choose_mega_path(MegaPathMode::kAuto, 0, 8, 128, w4a8), MegaPath::kFused) << "no agreed count";
  EXPECT_EQ(choose_mega_path(MegaPathMode::kFused, 512, 8, 128, w4a8), MegaPath::kFused);
  EXPECT_TRUE(mega_split_reachable(MegaPathMode::kAuto, 128, 8, 128, w4a8));
  EXPECT_FALSE(mega_split_reachable(MegaPathMode::kFused, 8192, 8, 128, w4a8));
  // Forced modes ignore the size.
  for (int64_t tokens : {0, 1, 128, 8192}) {
    EXPECT_EQ(choose_mega_path(MegaPathMode::kFused, tokens, 8, 64), MegaPath::kFused) << tokens;
    EXPECT_EQ(choose_mega_path(MegaPathMode::kSplit, tokens, 8, 64), MegaPath::kSplit) << tokens;
  }
}

TEST(MegaPathHeuristics, AgreedTokensAreTheSameOnEveryRank) {
  // One rank: this forward's T (nobody to agree with).
  EXPECT_EQ(mega_agreed_tokens(1, 77, -1, 4096), 77);
  EXPECT_EQ(mega_agreed_tokens(1, 0, -1, 4096), 0);
  // Several ranks with unequal (and zero) token counts: every rank's value must be the same, so its
  // own T never enters: the caller's max_tokens_any_rank, else 0 (the fused kernel, whatever the
  // capacity: a decode step must not take the split path because the layer could hold 4096 tokens).
  const int64_t counts[] = {0, 3, 700};
  for (int64_t t : counts) {
    EXPECT_EQ(mega_agreed_tokens(2, t, 700, 4096), 700) << "T " << t;
    EXPECT_EQ(mega_agreed_tokens(2, t, -1, 4096), 0) << "T " << t;
    EXPECT_EQ(choose_mega_path(MegaPathMode::kAuto, mega_agreed_tokens(2, t, -1, 8192), 8, 64), MegaPath::kFused);
  }
  // So the path is the same on every rank too.
  for (int64_t t : counts)
    EXPECT_EQ(choose_mega_path(MegaPathMode::kAuto, mega_agreed_tokens(2, t, 700, 8192), 8, 64), MegaPath::kSplit);
  for (int64_t t : counts)
    EXPECT_EQ(choose_mega_path(MegaPathMode::kAuto, mega_agreed_tokens(2, t, 200, 8192), 8, 64), MegaPath::kFused);
}

TEST(MegaPathHeuristics, SplitScratchOnlyWhereAForwardCanTakeIt) {
  // Capacity 128 on dsv3 / 2 ranks: at most 8 rows per expert, auto never splits.
  EXPECT_FALSE(mega_split_reachable(MegaPathMode::kAuto, 128, 8, 128));
  EXPECT_TRUE(mega_split_reachable(MegaPathMode::kAuto, 8192, 8, 128));
  EXPECT_FALSE(mega_split_reachable(MegaPathMode::kFused, 8192, 8, 128));
  EXPECT_TRUE(mega_split_reachable(MegaPathMode::kSplit, 1, 8, 128));
}

TEST(MegaPathHeuristics, EnvironmentValueParsing) {
  EXPECT_EQ(mega_path_mode_from_env_value(nullptr), MegaPathMode::kAuto);
  EXPECT_EQ(mega_path_mode_from_env_value(""), MegaPathMode::kAuto);
  EXPECT_EQ(mega_path_mode_from_env_value("auto"), MegaPathMode::kAuto);
  EXPECT_EQ(mega_path_mode_from_env_value("fused"), MegaPathMode::kFused);
  EXPECT_EQ(mega_path_mode_from_env_value("split"), MegaPathMode::kSplit);
  for (const char* bad : {"Split", "both", "1", "fused "}) {
    try {
      mega_path_mode_from_env_value(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("MEGAMOE_MEGA_PATH = '" + std::string(bad) + "' must be one of auto, fused, split"),
                std::string::npos)
          << what;
    }
  }
  EXPECT_STREQ(mega_path_name(MegaPath::kFused), "fused");
  EXPECT_STREQ(mega_path_name(MegaPath::kSplit), "split");
  for (MegaPathMode m : {MegaPathMode::kAuto, MegaPathMode::kFused, MegaPathMode::kSplit})
    EXPECT_EQ(parse_mega_path_mode(mega_path_mode_name(m), "x"), m);
}

}  // namespace
}  // namespace megamoe
