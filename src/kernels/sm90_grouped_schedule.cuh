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

// Schedule units of one expert in the cluster-of-2 schedule (locate_cluster_tile): floor(t / 2) pairs of m-tiles
// x n_tiles, then, for an odd m-tile count t, ceil(n_tiles / 2) units of the last m-tile (two n-tiles each).
__device__ __forceinline__ int cluster_units(int m_tiles, int n_tiles) {
  return m_tiles / 2 * n_tiles + m_tiles % 2 * ((n_tiles + 1) / 2);
}

// Fills the table; call from all 32 lanes of ONE warp, then __syncthreads() before reading it.
// kClusterUnits: tile_prefix counts the cluster-of-2 schedule's units (cluster_units, n_tiles needed) instead of
// m-tiles.
template <int kBlockM, bool kClusterUnits = false>
__device__ __forceinline__ void build_expert_tile_table(const ExpertTileTable& table, const int32_t* offsets,
                                                        int num_experts, int m_capacity, int n_tiles = 0) {
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
      if constexpr (kClusterUnits) tiles = cluster_units(tiles, n_tiles);
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

// The cluster-of-2 schedule of the v11 cluster kernels (MEGAMOE_GEMM_CLUSTER=1; docs/grouped_gemm.md "v11 clusters").
// Both CTAs of a cluster take the same unit (cluster index + k x clusters); a unit is, inside an expert of t
// m-tiles (the table built with kClusterUnits: tile_prefix counts units):
// - a PAIR (the first floor(t / 2) x n_tiles units): m-tiles 2p (CTA 0) and 2p + 1 (CTA 1) of one n-tile, which
//   share the B tile (shared_b: each CTA loads half of it and multicasts it to both). Order as locate_tile_ordered,
//   on pairs: n-tile fastest, or (m_fastest) the pair fastest, rotated by the n-tile;
// - a LONE unit (t odd: the last ceil(n_tiles / 2) units): the last m-tile with n-tiles 2j (CTA 0) and 2j + 1
//   (CTA 1), no B shared (each CTA loads its own whole B tile). With n_tiles odd, CTA 1 of the last one has no
//   tile: m0 = m_end (no rows: it loads only B, of the clamped n-tile, stores nothing).
// NOTES: every tile of the expert is in exactly one unit on exactly one CTA, with its own coordinates: the outputs
// do not depend on the schedule. The odd m-tile never leaves a CTA without work (as pairs of 2p, 2p + 1 padded
// with an empty tile would: at multinomial rows per expert about every other expert has an odd count).
struct ClusterTileCoordinates {
  int m0;      // first row of this CTA's tile (m_end <= m0: no tile)
  int m_end;   // one past the expert's last row
  int n_tile;
  bool shared_b;  // a pair: the B tile is shared with the other CTA (multicast halves)
};
__device__ __forceinline__ ClusterTileCoordinates locate_cluster_tile(const ExpertTileTable& table, int unit,
                                                                      int n_tiles, int block_m, int cta_rank,
                                                                      int& expert, bool m_fastest) {
  while (table.tile_prefix[expert + 1] <= unit) ++expert;
  const int local = unit - table.tile_prefix[expert];
  const int begin = table.row_begin[expert], end = table.row_end[expert];
  const int m_tiles = (end - begin + block_m - 1) / block_m;
  const int pairs = m_tiles / 2;
  if (local < pairs * n_tiles) {
    int pair, n_tile;
    if (m_fastest) {
      n_tile = local / pairs;
      pair = (local - n_tile * pairs + n_tile) % pairs;
    } else {
      pair = local / n_tiles;
      n_tile = local - pair * n_tiles;
    }
    return {begin + (2 * pair + cta_rank) * block_m, end, n_tile, true};
  }
  const int n_tile = 2 * (local - pairs * n_tiles) + cta_rank;
  if (n_tile >= n_tiles) return {end, end, n_tiles - 1, false};
  return {begin + (m_tiles - 1) * block_m, end, n_tile, false};
}

// This CTA's tile of schedule unit `unit` in the v11 kernels' two schedules: kCluster, locate_cluster_tile (the table
// counts cluster units); otherwise the tile `unit` of locate_tile_ordered (shared_b false).
template <bool kCluster>
__device__ __forceinline__ ClusterTileCoordinates locate_unit(const ExpertTileTable& table, int unit, int n_tiles,
                                                              int block_m, int cta_rank, int& expert, bool m_fastest) {
  if constexpr (kCluster) {
    return locate_cluster_tile(table, unit, n_tiles, block_m, cta_rank, expert, m_fastest);
  } else {
    const TileCoordinates t = locate_tile_ordered(table, unit, n_tiles, block_m, expert, m_fastest);
    return {t.m0, t.m_end, t.n_tile, false};
  }
}

}  // namespace megamoe::kernels::sm90
