// The fused dispatch's piece arithmetic (src/kernels/ep_dispatch_pieces.h): pieces tile the scale groups
// exactly, in order, every piece boundary is a whole scale group (8 lanes of 16 channels: the quantizer's
// shuffle groups stay whole), and the progress words grow strictly within a call and across calls (no
// reset between calls: a stale word of call e - 1 is below every target of call e). Plain C++.
#include <gtest/gtest.h>

#include <cstdint>

#include "kernels/ep_dispatch_pieces.h"

namespace megamoe::kernels {
namespace {

TEST(EpDispatchPieces, TileTheRowInOrder) {
  for (int S : {1, 2, 7, 16, 20, 56, 57, 64, 200})
    for (int g : {1, 2, 3, 8, 16, 28, 56, 64, 1000}) {
      SCOPED_TRACE(::testing::Message() << "S " << S << " groups " << g);
      const DispatchPieces pieces{S, g};
      ASSERT_GE(pieces.count(), 1);
      int next = 0;
      for (int q = 0; q < pieces.count(); ++q) {
        EXPECT_EQ(pieces.begin(q), next);
        EXPECT_GT(pieces.end(q), pieces.begin(q));
        EXPECT_LE(pieces.end(q) - pieces.begin(q), g);
        if (q + 1 < pieces.count()) {
          EXPECT_EQ(pieces.end(q) - pieces.begin(q), g);
        }
        next = pieces.end(q);
      }
      EXPECT_EQ(next, S);
      EXPECT_EQ(pieces.count(), (S + g - 1) / g);
    }
  EXPECT_EQ((DispatchPieces{0, 16}.count()), 0);
  // dsv3 (H 7168): 56 groups, 16 per piece -> published after 16, 32, 48, 56
  const DispatchPieces dsv3{56, 16};
  ASSERT_EQ(dsv3.count(), 4);
  EXPECT_EQ(dsv3.end(3), 56);
  EXPECT_EQ(dsv3.end(2), 48);
}

TEST(EpDispatchPieces, ProgressWordsGrowWithinAndAcrossCalls) {
  for (int S : {1, 20, 56, kEpDispatchMaxGroups})
    for (uint64_t epoch : {1ull, 2ull, 1000ull, (1ull << 40) + 3}) {
      const DispatchPieces pieces{S, S > 3 ? S / 3 : 1};
      uint64_t previous = dispatch_progress_word(epoch - 1, S);  // the word the last call left (all groups)
      for (int q = 0; q < pieces.count(); ++q) {
        const uint64_t word = dispatch_progress_word(epoch, pieces.end(q));
        EXPECT_GT(word, previous) << "S " << S << " epoch " << epoch << " piece " << q;
        previous = word;
      }
      // the target of the first piece is above any word of the previous call
      EXPECT_GT(dispatch_progress_word(epoch, pieces.end(0)), dispatch_progress_word(epoch - 1, kEpDispatchMaxGroups));
    }
}

}  // namespace
}  // namespace megamoe::kernels
