// The fused kernel's W4A8 instantiations (see mega_w4a8.h; design and shared-memory budget: docs/mega.md
// "W4A8").
#include "moe/mega_w4a8.h"

#include "megamoe/error.h"

namespace megamoe {
namespace {

using kernels::MegaFormat;
using kernels::sm90::Fp4Format;

// Both GEMMs of one launch use the same BLOCK_M (one m-tile table, one gemm1_done counter per m-tile) and
// 4 stages; the GEMM-2 BF16 staging (64 rows per math warpgroup at 64 x 256, 32 at 128 x 256) aliases
// the W4A8 SwiGLU exchange (8 KiB).
// NOTES (shared memory, bytes; the 227 KiB limit is 232,448; E = local experts; tables 16 (E + 1) =
// ExpertTileTable 12 (E + 1) + expert offsets 4 (E + 1); + 1,024 alignment slack + 64 barriers + < 128 static):
//   128 x 256 nvfp4: 65,536 decoded (2 warpgroups x 2 buffers x 16 KiB) + 4 x (16,384 A + 16,384 FP4 +
//                    2,048 group scales) + 17,408 staging = 222,208 -> 231,632 at E = 512 (limit E <= 563)
//   128 x 256 mxfp4: group scales 1,024 per stage -> 227,536 at E = 512 (E <= 819)
//   64 x 256 nvfp4:  65,536 + 4 x (8,192 + 16,384 + 2,048) + 34,816 staging = 206,848 -> 216,272 at E = 512
// A fifth stage (+34,816 / +26,624) does not fit either height with the 512-expert tables.
// kInterleavedW13 (session 19): GEMM-1 tiles on W13 packed kGateUpInterleaved8 (kSwigluInterleavedFp8: the staged
// pipeline's packing by default, MEGAMOE_W4A8_G1_V10 unset or 1; one W13 for both paths, docs/mega.md "One W13").
// Same bytes: no 8 KiB gate exchange, the 1-2 KiB amax exchange at the start of the (larger) staging region.
template <int kSubTiles, Fp4Format kFp4, bool kInterleavedW13 = false>
using MegaW4a8Tiles = kernels::sm90::W4a8GemmLayout<
    kSubTiles, 4, kFp4,
    kInterleavedW13 ? kernels::sm90::W4a8Epilogue::kSwigluInterleavedFp8 : kernels::sm90::W4a8Epilogue::kSwigluQuantFp8,
    kSubTiles == 1 ? 64 : 32>;
static_assert(mega_fits_shared<MegaW4a8Tiles<1, Fp4Format::kNvfp4>>() &&
              mega_fits_shared<MegaW4a8Tiles<2, Fp4Format::kNvfp4>>() &&
              mega_fits_shared<MegaW4a8Tiles<1, Fp4Format::kMxfp4>>() &&
              mega_fits_shared<MegaW4a8Tiles<2, Fp4Format::kMxfp4>>());
static_assert(MegaW4a8Tiles<2, Fp4Format::kNvfp4, true>::shared_bytes(1) ==
                  MegaW4a8Tiles<2, Fp4Format::kNvfp4>::shared_bytes(1) &&
              MegaW4a8Tiles<1, Fp4Format::kNvfp4, true>::shared_bytes(1) ==
                  MegaW4a8Tiles<1, Fp4Format::kNvfp4>::shared_bytes(1),
              "the interleaved layouts take the kGateUp layouts' shared memory (NOTES above)");
static_assert(MegaW4a8Tiles<1, Fp4Format::kNvfp4>::kBlockM == 64 && MegaW4a8Tiles<2, Fp4Format::kNvfp4>::kBlockM == 128,
              "the same tile heights as the FP8 / BF16 layouts (mega_backend.cu: one m-tile table size)");

}  // namespace

void launch_mega_w4a8(MegaFormat format, bool small_tiles, bool interleaved_w13, const CUtensorMap& x_map,
                      const CUtensorMap& w13_map, const CUtensorMap& act_map, const CUtensorMap& w2_map,
                      const kernels::MegaMoeParams& p, int ctas, cudaStream_t stream) {
  using kernels::launch_mega_moe;
  constexpr MegaFormat kNv = MegaFormat::kNvfp4, kMx = MegaFormat::kMxfp4;
  if (interleaved_w13) {
    MEGAMOE_CHECK(format == kNv || format == kMx, "launch_mega_w4a8: format ", static_cast<int>(format),
                  " is not nvfp4 or mxfp4");
    if (format == kNv) {
      if (small_tiles) launch_mega_moe<MegaW4a8Tiles<1, Fp4Format::kNvfp4, true>, kNv>(x_map, w13_map, act_map, w2_map, p, ctas, stream);
      else launch_mega_moe<MegaW4a8Tiles<2, Fp4Format::kNvfp4, true>, kNv>(x_map, w13_map, act_map, w2_map, p, ctas, stream);
    } else {
      if (small_tiles) launch_mega_moe<MegaW4a8Tiles<1, Fp4Format::kMxfp4, true>, kMx>(x_map, w13_map, act_map, w2_map, p, ctas, stream);
      else launch_mega_moe<MegaW4a8Tiles<2, Fp4Format::kMxfp4, true>, kMx>(x_map, w13_map, act_map, w2_map, p, ctas, stream);
    }
    return;
  }
  if (format == kNv) {
    if (small_tiles) launch_mega_moe<MegaW4a8Tiles<1, Fp4Format::kNvfp4>, kNv>(x_map, w13_map, act_map, w2_map, p, ctas, stream);
    else launch_mega_moe<MegaW4a8Tiles<2, Fp4Format::kNvfp4>, kNv>(x_map, w13_map, act_map, w2_map, p, ctas, stream);
  } else {
    MEGAMOE_CHECK(format == kMx, "launch_mega_w4a8: format ", static_cast<int>(format), " is not nvfp4 or mxfp4");
    if (small_tiles) launch_mega_moe<MegaW4a8Tiles<1, Fp4Format::kMxfp4>, kMx>(x_map, w13_map, act_map, w2_map, p, ctas, stream);
    else launch_mega_moe<MegaW4a8Tiles<2, Fp4Format::kMxfp4>, kMx>(x_map, w13_map, act_map, w2_map, p, ctas, stream);
  }
}

}  // namespace megamoe
