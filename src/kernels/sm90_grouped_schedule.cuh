// Persistent tile schedule of the sm_90a grouped GEMMs over device-side expert offsets.
//
// Tiles are the m-tiles of all experts concatenated (expert 0 first), each split into n-tiles with the
// n-tile fastest; CTA b runs tiles b, b + gridDim.x, ... Every CTA derives the per-expert m-tile prefix
// itself from the offsets (one warp scan into shared memory), so the host never reads the row counts.
// NOTES: offsets are clamped into [0, m_capacity] and made non-decreasing per expert (end >= begin), so
// malformed offsets yield fewer rows, never out-of-range TMA coordinates or stores.
#pragma once

#include <cstdint>

namespace megamoe::kernels::sm90 {

// Shared-memory tables of the schedule: 3 int arrays of num_experts + 1 entries.
struct ExpertTileTable {
  int* tile_prefix;  // [E+1]: m-tiles of the experts before e
  int* row_begin;    // [E]
  int* row_end;      // [E]
  __device__ ExpertTileTable(int* base, int num_experts)
      : tile_prefix(base), row_begin(base + num_experts + 1), row_end(base + 2 * (num_experts + 1)) {}
  static constexpr int bytes(int num_experts) { return 3 * 4 * (num_experts + 1); }
};

// Fills the table; call from all 32 lanes of ONE warp, then __syncthreads() before reading it.
template <int kBlockM>
__device__ __forceinline__ void build_expert_tile_table(const ExpertTileTable& table, const int32_t* offsets,
                                                        int num_experts, int m_capacity) {
  const int lane = threadIdx.x % 32;
  int carry = 0;
  if (lane == 0) table.tile_prefix[0] = 0;
  for (int base = 0; base < num_experts; base += 32) {
    const int e = base + lane;
    int tiles = 0;
    if (e < num_experts) {
      const int begin = min(max(offsets[e], 0), m_capacity);
      const int end = max(min(max(offsets[e + 1], 0), m_capacity), begin);
      table.row_begin[e] = begin;
      table.row_end[e] = end;
      tiles = (end - begin + kBlockM - 1) / kBlockM;
    }
#pragma unroll
    for (int delta = 1; delta < 32; delta *= 2) {  // inclusive scan of the tile counts
      const int other = __shfl_up_sync(0xffffffffu, tiles, delta);
      if (lane >= delta) tiles += other;
    }
    if (e < num_experts) table.tile_prefix[e + 1] = carry + tiles;
    carry += __shfl_sync(0xffffffffu, tiles, 31);
  }
}

// Where a tile lies. `expert` is a cursor: tiles are visited in increasing order, so it only moves up.
struct TileCoordinates {
  int m0;      // first row of the tile
  int m_end;   // one past the expert's last row (rows >= m_end belong to other experts / padding)
  int n_tile;
};
__device__ __forceinline__ TileCoordinates locate_tile(const ExpertTileTable& table, int tile, int n_tiles,
                                                       int block_m, int& expert) {
  const int m_tile = tile / n_tiles;
  while (table.tile_prefix[expert + 1] <= m_tile) ++expert;
  return {table.row_begin[expert] + (m_tile - table.tile_prefix[expert]) * block_m, table.row_end[expert],
          tile % n_tiles};
}

// The same tiles in another order (v11 wide kernels, GroupedGemmParams::m_fastest): experts in order, and inside an
// expert the m-tile fastest, so the CTAs that run one expert's tiles of the same n-tile (the same weight tile) hold
// neighbouring tile indices and run them side by side in one wave.
// NOTES: tile = tile_prefix[e] * n_tiles + n_tile * m_tiles(e) + slot, m_tile = (slot + n_tile) % m_tiles(e); a
// tile's coordinates, and so its outputs, do not depend on the order (only which CTA computes it and when).
// Why the rotation by n_tile: CTA b runs tiles b, b + gridDim.x, ... With slot = m_tile and an even grid (132) and
// even n_tiles, an expert of 2 m-tiles gave the even CTAs every full first m-tile and the odd CTAs every part-filled
// last one (tile parity == m_tile parity): session 15 measured the layer at 2048 tokens 7% slower that way.
__device__ __forceinline__ TileCoordinates locate_tile_ordered(const ExpertTileTable& table, int tile, int n_tiles,
                                                               int block_m, int& expert, bool m_fastest) {
  if (!m_fastest) return locate_tile(table, tile, n_tiles, block_m, expert);
  while (table.tile_prefix[expert + 1] * n_tiles <= tile) ++expert;
  const int local = tile - table.tile_prefix[expert] * n_tiles;
  const int m_tiles = table.tile_prefix[expert + 1] - table.tile_prefix[expert];
  const int n_tile = local / m_tiles;
  const int m_tile = (local - n_tile * m_tiles + n_tile) % m_tiles;
  return {table.row_begin[expert] + m_tile * block_m, table.row_end[expert], n_tile};
}

}  // namespace megamoe::kernels::sm90
