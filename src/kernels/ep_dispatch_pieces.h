// Progress arithmetic of the fused dispatch (ep_dispatch_fused_kernel, MEGAMOE_EP_OVERLAP=1; docs/ep.md
// "Overlap", "Fused dispatch with block roles"). Plain C++ (host and device): tests/cpu/test_ep_dispatch_pieces.cpp.
//
// A row of H channels has S = H / 128 scale groups. A sender warp sends a token's row piece by piece, a
// piece = `groups` consecutive scale groups (the last piece may be shorter), and after every piece
// publishes the word (epoch << 16) | (scale groups of the row stored so far) into every remote
// destination's dispatch_ready[me * C + slot]. The receiver's expansion of that row waits for
// progress_word(epoch, piece_end(q)) before it copies piece q. Words of call e are > every word of call
// e - 1 (groups <= S < 2^16), so the words are never reset.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MEGAMOE_EP_HD __host__ __device__ __forceinline__
#else
#define MEGAMOE_EP_HD inline
#endif

namespace megamoe::kernels {

inline constexpr int kEpDispatchProgressShift = 16;
inline constexpr int kEpDispatchMaxGroups = (1 << kEpDispatchProgressShift) - 1;  // S limit (H < 8M channels)

struct DispatchPieces {
  int scale_groups = 0;  // S
  int groups = 1;        // scale groups per piece (>= 1)

  MEGAMOE_EP_HD int count() const { return scale_groups <= 0 ? 0 : (scale_groups + groups - 1) / groups; }
  MEGAMOE_EP_HD int begin(int q) const { return q * groups; }  // first scale group of piece q
  MEGAMOE_EP_HD int end(int q) const {                         // one past its last
    const int e = (q + 1) * groups;
    return e < scale_groups ? e : scale_groups;
  }
};

// The progress word a sender publishes after `groups_done` scale groups of a row in call `epoch`.
MEGAMOE_EP_HD uint64_t dispatch_progress_word(uint64_t epoch, int groups_done) {
  return epoch << kEpDispatchProgressShift | static_cast<uint64_t>(static_cast<uint32_t>(groups_done));
}

}  // namespace megamoe::kernels
