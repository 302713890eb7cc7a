// MegaMoE, sm_90a, FP8-block, W4A8 (NVFP4 / MXFP4) or BF16 weights: ONE persistent kernel per forward does quantize + dispatch
// (pull), GEMM 1 (+ SwiGLU + optional top-k weight + FP8 requant / BF16 rounding), GEMM 2 with its BF16
// rows stored straight into the source rank's combine slots over NVLink, and the fixed-order top-k
// reduction. Launcher at the bottom; the typed API is src/moe/mega_backend.cu; design and buffers:
// docs/mega.md.
//
// One kernel template, four formats (MegaFormat): only what the tokens look like on the wire and which
// GEMM device code runs differs; dispatch, counters, waits, reduce and cleanup are the same code.
//   kFp8Block  tokens travel as e4m3 + per-128 scales; GEMMs from sm90_fp8_grouped_gemm.cuh, GEMM-1
//              output requantized to e4m3 + scales.
//   kNvfp4,    tokens and GEMM-1 output exactly as kFp8Block (same stage / pull / scale code); GEMMs from
//   kMxfp4     sm90_w4a8_grouped_gemm.cuh (FP4 weights + group scales decoded to FP8 in shared memory
//              in the mainloop, its SwiGLU-quant epilogue for GEMM 1; GEMM 2's BF16 rows leave through
//              store_bf16_epilogue_bulk as for FP8). docs/mega.md "W4A8".
//   kBf16      tokens travel as their bf16 rows (no scales); GEMMs from sm90_bf16_grouped_gemm.cuh,
//              GEMM-1 output rounded to bf16 exactly as the staged BF16 path does.
//
// Phases of one CTA (grid = one CTA per SM, all co-resident: cooperative launch):
//   1 stage      all 12 warps: this rank's tokens (FP8: quantized + scales; BF16: copied) + sanitized
//                ids/weights into this rank's OWN symmetric window (src_*), per-global-expert counts
//                (src_expert_counts), per-owner-rank slot counts (expected_from). The last CTA to
//                finish publishes ready[me] = epoch + 1 on every rank (release, system scope).
//   2 offsets    thread 0 waits (bounded) for ready from every rank; every CTA sums the peers' counts
//                of its local experts into expert offsets + the m-tile table (shared memory).
//   3 pull       all warps: warp per (sender, token) reads the sender's ids over NVLink and copies the
//                token once into a grouped row per local expert it selected (row = offset[e] +
//                atomic cursor[e]), bumping arrived[e] per row (release, gpu scope). The last CTA to
//                finish tells every sender pulled[me] = epoch + 1.
//   4 GEMMs      warp-specialized as the grouped GEMMs (sm90_fp8/bf16_grouped_gemm.cuh, same device code):
//                all GEMM-1 tiles, then all GEMM-2 tiles (decode_mega_tile); CTA b takes tiles b,
//                b + grid, ...
//                A GEMM-1 tile of expert e starts when arrived[e] == rows(e); a GEMM-2 tile of m-tile m
//                starts when gemm1_done[m] == I/128 (all GEMM-1 n-tiles of those rows). The GEMM-2
//                epilogue (v8) stages BF16 rows in shared memory and sends each valid row with one
//                256-byte bulk copy straight into combine_rows of the row's source rank (peer pointer),
//                and adds the tile's rows to combine_pieces[me] on that rank one GEMM-2 tile later,
//                once the copies are complete (count_combine_pieces). FP8: the producer warpgroup's
//                warp 1 (scale warp) stages every stage's A and B scales in shared memory (v8), and
//                GEMM 1's FP8 rows leave by 128-byte bulk copies (v8c).
//   5 reduce     math warps: wait (bounded) until combine_pieces[r] == expected_from[r] * H/256 for
//                every rank r, then out[t] = bf16(sum_j fmaf(w_j, y_j)) in slot order (deterministic).
//   6 cleanup    the last CTA to finish waits for pulled[s] from every rank s (my src_* may then be
//                overwritten), zeroes every local counter it used and bumps the epoch.
//
// NOTES:
// - Graph safety: cross-rank flags (ready, pulled) are monotonic epoch values (epoch = forwards so
//   far, in device memory, bumped by the kernel); every other counter is zeroed by the kernel's
//   last CTA after its last reader is done, so the next launch (or graph replay) starts from zero.
// - Deadlock freedom: no CTA waits inside phases 1 and 3; GEMM-1 tiles depend only on phase 3 of all
//   CTAs, GEMM-2 tiles only on GEMM-1 tiles placed earlier in the tile sequence (decode_mega_tile);
//   cross-rank waits (ready, combine pieces, pulled) depend only on the peers' earlier phases.
// - Memory ordering: writers store, then fence (proxy.async for data that TMA reads, then
//   __threadfence / __threadfence_system), then bump a counter with red.release; readers acquire the
//   counter (ld.acquire.sys) and, before TMA, fence.proxy.async. Data written during the kernel by
//   other CTAs (scales, row weights, row sources, combine rows) is read with ld.global.cg, never
//   through the non-coherent read-only path; the scale warp reads the A scales (grouped_scales from
//   phase 3, act_scales from GEMM-1 epilogues) with 4-byte cp.async, which exists only as .ca (through
//   L1): that is still the coherent path, ordered after lane 0's own acquire of the same counter the
//   TMA thread waits for (arrived / gemm1_done) and __syncwarp (the acquire also drops L1 lines loaded
//   before it, e.g. a neighbouring expert's rows sharing a line).
// - Bulk copies (async proxy) publish like stores: GEMM-1 act rows: the issuing lanes wait for their
//   groups (wait_group 0, not .read), fence.proxy.async, __threadfence, barrier, gemm1_done release;
//   GEMM-2 combine rows: the same with __threadfence_system before combine_pieces (count_combine_pieces).
// - Shared memory: the GEMM-2 BF16 staging aliases the SwiGLU exchange buffer (GroupedGemmLayout
//   kStagingOffset): a CTA runs all its GEMM-1 tiles before its first GEMM-2 tile, and each GEMM-1 tile
//   ends with its exchange barriers passed and its bulk copies complete (bulk_wait_all before gemm1_done).
// - Waits on this rank's own CTAs (arrived, gemm1_done) never give up the pipeline: on timeout (or
//   when the group already failed) they record the error and proceed, so producer and math
//   warpgroups stay in lockstep and the kernel ends; the host then raises the (rank, phase) error.
// - Reuse of the windows across forwards: a peer writes my combine_rows / reads my src_* of forward
//   N+1 only after my ready of N+1, which I publish after my forward N finished; I overwrite my src_*
//   only after every peer's pulled of N.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/sm90_bf16_grouped_gemm.cuh"
#include "kernels/sm90_ep_common.cuh"
#include "kernels/sm90_fp8_grouped_gemm.cuh"
#include "kernels/sm90_w4a8_grouped_gemm.cuh"
#include "megamoe/error_cuda.h"
#include "moe/mega_phase_times.h"

namespace megamoe::kernels {

// Weight (and token) format of one mega launch; see the header comment.
enum class MegaFormat : int { kFp8Block = 0, kBf16 = 1, kNvfp4 = 2, kMxfp4 = 3 };
// Bytes per element of the tokens and activations the GEMMs read (their TMA rows are P * K bytes).
constexpr int mega_element_bytes(MegaFormat format) { return format == MegaFormat::kBf16 ? 2 : 1; }
// FP8 activations with per-128 scales (every format but BF16).
constexpr bool mega_has_scales(MegaFormat format) { return format != MegaFormat::kBf16; }
constexpr bool mega_is_w4a8(MegaFormat format) { return format == MegaFormat::kNvfp4 || format == MegaFormat::kMxfp4; }

// Byte offsets of the regions of one rank's mega window (identical on every rank), each 256-aligned.
// C = max tokens per rank, H = hidden, S = H / 128, k = top_k, E = global experts, P = bytes per token
// element (1 for FP8-block / W4A8, 2 for BF16), F = 1 for FP8-block / W4A8 (scales), 0 for BF16 (none):
//   ready              u64 [kMaxEpRanks]  ready[s] = epoch + 1 once rank s's src_* of this forward are complete
//   pulled             u64 [kMaxEpRanks]  pulled[s] = epoch + 1 once rank s finished reading my src_*
//   combine_pieces     u64 [kMaxEpRanks]  (row, 256-column tile) pieces rank s wrote into my combine_rows
//   src_count          i32                my T of this forward
//   src_expert_counts  i32 [E]            my valid (token, slot) pairs per global expert
//   src_x              [C, H] * P bytes   my tokens: e4m3 quantized per 128 channels | bf16 as given
//   src_scales         f32 [C, S] * F     FP8 only (0 bytes for BF16)
//   src_ids            i32 [C, k]         sanitized ids (invalid -> -1)
//   src_weights        f32 [C, k]
//   combine_rows       bf16 [C * k, H]    row t*k + j = expert output of my token t, slot j
// Total ~ C*(P*H + 4*F*S + 8k + 2kH) + 4E + 1.3 KiB.
struct MegaMoeLayout {
  size_t ready, pulled, combine_pieces, src_count, src_expert_counts, src_x, src_scales, src_ids, src_weights,
      combine_rows, total;
};

inline MegaMoeLayout make_mega_moe_layout(int capacity, int hidden, int top_k, int num_experts, MegaFormat format) {
  auto align = [](size_t v) { return (v + 255) / 256 * 256; };
  const size_t C = static_cast<size_t>(capacity), H = hidden, k = top_k;
  const size_t P = mega_element_bytes(format), F = mega_has_scales(format) ? 1 : 0;
  MegaMoeLayout l{};
  size_t at = 0;
  l.ready = at; at = align(at + 8 * kMaxEpRanks);
  l.pulled = at; at = align(at + 8 * kMaxEpRanks);
  l.combine_pieces = at; at = align(at + 8 * kMaxEpRanks);
  l.src_count = at; at = align(at + 4);
  l.src_expert_counts = at; at = align(at + 4 * static_cast<size_t>(num_experts));
  l.src_x = at; at = align(at + C * H * P);
  l.src_scales = at; at = align(at + C * (H / kEpScaleGroup) * 4 * F);
  l.src_ids = at; at = align(at + C * k * 4);
  l.src_weights = at; at = align(at + C * k * 4);
  l.combine_rows = at; at = align(at + C * k * H * 2);
  l.total = at;
  return l;
}

struct MegaMoeParams {
  EpDeviceContext ctx;
  std::array<char*, kMaxEpRanks> window;  // every rank's mega window, mapped here
  MegaMoeLayout layout;
  int hidden, intermediate, top_k, num_experts, experts_per_rank, capacity, num_tokens;
  int activation;  // 0 = SiLU * up, 1 = clamped SwiGLU
  float limit, alpha;
  bool apply_topk_in_fc1;
  bool swiglu_spread = true;  // FP8 GEMM-1 tiles of <= 32 rows: the spread epilogue (MEGAMOE_SWIGLU_SPREAD)
  int w4a8_decoder = 3;  // W4A8: the FP4 decoder, sm90::Fp4Decoder (MEGAMOE_W4A8_DECODE, kernels::w4a8_decode)
  // this rank's inputs and output
  const __nv_bfloat16* hidden_in;
  const int32_t* topk_ids;
  const float* topk_weights;
  __nv_bfloat16* out;
  // packed weight scales, FP8 only (the data goes through the tensor maps)
  const float* w13_scales;  // [E_local, 2I/128, H/128]
  const float* w2_scales;   // [E_local, H/128, I/128]
  // W4A8 only: the packed group scales and block records (grouped_gemm.h "W4A8", per local expert)
  const uint8_t* w13_group_scales;  // [E_local, H/128, 2I, 128/group]
  const uint8_t* w2_group_scales;   // [E_local, I/128, H, 128/group]
  const sm90::W4a8BlockScaleDevice* w13_blocks;  // [E_local, 2I/128, H/128]
  const sm90::W4a8BlockScaleDevice* w2_blocks;   // [E_local, H/128, I/128]
  // local state (device memory), zero between forwards
  uint64_t* epoch;             // forwards so far
  uint32_t* ctas_quantized;    // CTAs past phase 1
  uint32_t* ctas_gathered;     // CTAs past phase 3
  uint32_t* ctas_finished;     // CTAs past phase 5
  uint32_t* expected_from;     // [kMaxEpRanks] my valid slots whose expert lives on rank r
  int32_t* cursors;            // [E_local] grouped rows handed out per local expert
  uint64_t* arrived;           // [E_local] grouped rows complete per local expert
  uint64_t* gemm1_done;        // [max_m_tiles] GEMM-1 n-tiles complete per m-tile
  int max_m_tiles;
  // grouped rows (local); P = mega_element_bytes(format)
  uint8_t* grouped_x;          // [max_rows, H] * P bytes: e4m3 | bf16
  float* grouped_scales;       // [max_rows, S] (FP8 / W4A8)
  RowSource* sources;          // [max_rows]
  float* row_weights;          // [max_rows]
  uint8_t* act;                // [max_rows, I] * P bytes: e4m3 | bf16
  float* act_scales;           // [max_rows, I/128] (FP8 / W4A8)
  int64_t max_rows;
  // Phase timing (MegaBackend::set_phase_timing): null when off (the kernel then reads no timer and
  // writes nothing extra); else [gridDim.x, kMegaPhaseStamps] globaltimer stamps, see mega_phase_times.h.
  uint64_t* phase_stamps;
  // Diagnostic (MEGAMOE_MEGA_DIAG_LOCAL_COMBINE=1, timing only, OUTPUT WRONG BY DESIGN): GEMM 2 writes
  // every combine row into this rank's own window instead of the source rank's, so no row crosses
  // NVLink; piece counts still go to the source. Tells NVLink volume from TMA-store contention
  // (docs/mega.md "Where mega loses to staged").
  int diag_local_combine;

  template <typename T>
  __device__ __forceinline__ T* region(int rank, size_t offset) const {
    return reinterpret_cast<T*>(window[rank] + offset);
  }
};

namespace mega_detail {

// Phase timing: CTA `blockIdx.x` writes boundary `index` (MegaPhaseStamp) when timing is on. One
// thread per boundary and CTA; which thread is noted where it is called.
__device__ __forceinline__ void stamp_phase(const MegaMoeParams& p, int index) {
  if (p.phase_stamps != nullptr)
    p.phase_stamps[static_cast<size_t>(blockIdx.x) * kMegaPhaseStamps + index] = ep_device::globaltimer_ns();
}

// Tile sequence of step 4: all GEMM-1 tiles (m-tile major, n-tile fastest), then all GEMM-2 tiles.
// NOTES:
// - Every GEMM-2 tile comes after all GEMM-1 tiles it depends on, and every CTA runs its tiles in
//   increasing order: the lowest unfinished tile can always run, so the waits cannot deadlock. Any
//   reordering must keep that property.
// - Measured (docs/mega.md): interleaving GEMM-2 tiles of group g-1 after the GEMM-1 tiles of group g
//   (groups of 8 m-tiles) was 5-14% slower on dsv3 than this order (GEMM-2 tiles then wait on GEMM-1
//   tiles issued one wave earlier).
struct MegaTile {
  bool gemm2;
  int m_tile, n_tile;
};
__device__ __forceinline__ MegaTile decode_mega_tile(int index, int m_tiles, int n1_tiles, int n2_tiles) {
  const int gemm1_tiles = m_tiles * n1_tiles;
  if (index < gemm1_tiles) return {false, index / n1_tiles, index % n1_tiles};
  index -= gemm1_tiles;
  return {true, index / n2_tiles, index % n2_tiles};
}

__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

// Wait on this rank's own CTAs: see NOTES (proceeds after recording a timeout).
__device__ __forceinline__ void wait_local_geq(const EpDeviceContext& ctx, const uint64_t* flag, uint64_t target) {
  if (ep_device::load_acquire_sys(flag) >= target) return;
  const uint64_t start = ep_device::globaltimer_ns();
  uint32_t polls = 0;
  while (ep_device::load_acquire_sys(flag) < target) {
    if ((++polls & 63u) == 0) {
      if (ep_device::group_failed(ctx)) return;
      const uint64_t waited = ep_device::globaltimer_ns() - start;
      if (waited > ctx.wait_timeout_ns) {
        ep_device::record_error(ctx, 1u, EpPhase::kExpertCompute, ctx.rank, waited);
        return;
      }
    }
  }
}

// "Last CTA" pattern: every CTA's thread 0 calls it once after a __syncthreads(); returns true in the
// last one, after resetting the counter. Its own and (through the fences) every other CTA's earlier
// writes are visible at system scope to whatever the last CTA publishes next.
__device__ __forceinline__ bool last_cta_arrives(uint32_t* counter) {
  __threadfence_system();
  if (atomicAdd(counter, 1u) != gridDim.x - 1) return false;
  *counter = 0;
  __threadfence_system();
  return true;
}

// Phase 1, one warp per token: ids, weights and counts, then the token itself in the launch's format
// (FP8: quantized per 128 channels + scales, the `formats` rule; BF16: the row as given).
template <MegaFormat kFormat>
__device__ inline void stage_own_tokens(const MegaMoeParams& p, uint32_t* expected_counts_lane) {
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x / 32;
  const int warp_global = blockIdx.x * warps + static_cast<int>(threadIdx.x) / 32;
  const int me = p.ctx.rank, R = p.ctx.ranks, H = p.hidden, k = p.top_k, S = H / kEpScaleGroup;
  uint8_t* src_x = p.region<uint8_t>(me, p.layout.src_x);
  float* src_scales = p.region<float>(me, p.layout.src_scales);
  int32_t* src_ids = p.region<int32_t>(me, p.layout.src_ids);
  float* src_weights = p.region<float>(me, p.layout.src_weights);
  int32_t* expert_counts = p.region<int32_t>(me, p.layout.src_expert_counts);
  for (int t = warp_global; t < p.num_tokens; t += gridDim.x * warps) {
    int owner = -1;  // k <= 32: lane j handles slot j
    if (lane < k) {
      const size_t slot = static_cast<size_t>(t) * k + lane;
      int id = p.topk_ids[slot];
      if (id < -1 || id >= p.num_experts) {
        ep_device::record_error(p.ctx, 2u, EpPhase::kInvalidInput, id, 0, /*fail_group=*/false);
        id = -1;
      }
      src_ids[slot] = id;
      src_weights[slot] = p.topk_weights[slot];
      if (id >= 0) {
        atomicAdd(expert_counts + id, 1);
        owner = id / p.experts_per_rank;
      }
    }
    for (int r = 0; r < R; ++r) {
      const int n = __popc(__ballot_sync(0xffffffffu, owner == r));
      if (lane == r) *expected_counts_lane += n;  // lane r accumulates rank r's count
    }
    const uint4* src = reinterpret_cast<const uint4*>(p.hidden_in + static_cast<size_t>(t) * H);
    if constexpr (kFormat == MegaFormat::kBf16) {
      warp_copy16(reinterpret_cast<uint4*>(src_x + static_cast<size_t>(t) * H * 2), src, H / 8, lane);
    } else {
      const int chunks = H / 16;
      for (int c0 = 0; c0 < chunks; c0 += 32) {
        const int c = c0 + lane;
        const bool active = c < chunks;
        uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
        if (active) {
          lo = __ldg(src + 2 * c);
          hi = __ldg(src + 2 * c + 1);
        }
        float scale = 0.0f;
        const uint4 q = quantize16_fp8(lo, hi, &scale);
        if (active) {
          reinterpret_cast<uint4*>(src_x + static_cast<size_t>(t) * H)[c] = q;
          if ((lane & 7) == 0) src_scales[static_cast<size_t>(t) * S + c / 8] = scale;
        }
      }
    }
  }
}

// Phase 3, one warp per (sender, token). `offsets` = expert offsets in shared memory, `tokens_of` = T per sender.
// A row is P * H bytes (P = mega_element_bytes), plus S scales for FP8.
template <MegaFormat kFormat>
__device__ inline void pull_tokens(const MegaMoeParams& p, const int* offsets, const int* tokens_of) {
  constexpr bool kScales = mega_has_scales(kFormat);
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x / 32;
  const int warp_global = blockIdx.x * warps + static_cast<int>(threadIdx.x) / 32;
  const int R = p.ctx.ranks, H = p.hidden, k = p.top_k, S = H / kEpScaleGroup;
  const size_t row_bytes = static_cast<size_t>(H) * mega_element_bytes(kFormat);
  const int first = p.ctx.rank * p.experts_per_rank;
  int total = 0;
  for (int s = 0; s < R; ++s) total += tokens_of[s];
  for (int g = warp_global; g < total; g += gridDim.x * warps) {
    int s = 0, t = g;
    while (t >= tokens_of[s]) t -= tokens_of[s++];
    const int32_t* ids = p.region<int32_t>(s, p.layout.src_ids) + static_cast<size_t>(t) * k;
    const float* weights = p.region<float>(s, p.layout.src_weights) + static_cast<size_t>(t) * k;
    // k <= 32: lane j holds slot j.
    const int local = lane < k ? __ldcg(ids + lane) - first : -1;
    const float weight = lane < k ? __ldcg(weights + lane) : 0.0f;
    unsigned mask = __ballot_sync(0xffffffffu, local >= 0 && local < p.experts_per_rank);
    const uint4* x_src = reinterpret_cast<const uint4*>(p.region<uint8_t>(s, p.layout.src_x) + t * row_bytes);
    const float* scale_src = p.region<float>(s, p.layout.src_scales) + static_cast<size_t>(t) * S;
    while (mask) {
      const int j = __ffs(mask) - 1;
      mask &= mask - 1;
      const int e = __shfl_sync(0xffffffffu, local, j);
      const float w = __shfl_sync(0xffffffffu, weight, j);
      int row = 0;
      if (lane == 0) row = offsets[e] + atomicAdd(p.cursors + e, 1);
      row = __shfl_sync(0xffffffffu, row, 0);
      if (row >= offsets[e + 1] || row >= p.max_rows) continue;  // only when a peer sent corrupt counts
      uint4* x_dst = reinterpret_cast<uint4*>(p.grouped_x + row * row_bytes);
      float* scale_dst = kScales ? p.grouped_scales + static_cast<size_t>(row) * S : nullptr;
      // The first copy comes over NVLink; later copies of the same token read the first local copy.
      warp_copy16(x_dst, x_src, static_cast<int>(row_bytes / 16), lane);
      if constexpr (kScales)
        for (int i = lane; i < S; i += 32) scale_dst[i] = __ldcg(scale_src + i);
      if (lane == 0) {
        p.sources[row] = RowSource{s, t, j, w};
        p.row_weights[row] = w;
      }
      x_src = x_dst;
      scale_src = scale_dst;
      fence_proxy_async_global();  // grouped_x is read by TMA (async proxy)
      __threadfence();
      __syncwarp();
      if (lane == 0) ep_device::add_release_sys(p.arrived + e, 1ull);
    }
  }
}

// GEMM-2 pieces of the tile with rows [m0, m_end): once its bulk copies are complete (every math
// thread waits for all its bulk groups but the kPending most recent ones, i.e. the next tile's),
// one thread per tile row of math warpgroup 0 adds the tile's rows per source rank to that rank's
// combine_pieces[me] (release, system scope). All 256 math threads take part (named barrier 3).
// NOTES (async-proxy writes before a generic release, system scope):
// - cp.async.bulk.wait_group (not .read) returns once the copies' writes are performed and visible
//   to the issuing thread; fence.proxy.async.global then orders those async-proxy writes before the
//   thread's later generic-proxy operations; __threadfence_system() (fence.sc.sys) makes them visible
//   at system scope before the barrier; the releasing thread's red.release.sys comes after the barrier
//   (bar.sync orders the CTA's threads), so a peer that acquires combine_pieces sees the rows. DeepEP's
//   intranode kernels publish TMA stores into NVLink buffers the same way (wait_group, bar.sync,
//   st.release.sys); the proxy fence is the conservative extra step the PTX proxy rules ask for.
template <int kPending, int kBlockM>
__device__ __forceinline__ void count_combine_pieces(const MegaMoeParams& p, int m0, int m_end, int math_wg,
                                                     int thread_in_wg, int lane) {
  sm90::bulk_wait_all_but<kPending>();
  fence_proxy_async_global();
  __threadfence_system();
  sm90::named_barrier_sync(3, 256);
  if (math_wg == 0 && thread_in_wg < kBlockM) {  // one thread per tile row counts the pieces per rank
    const int row = m0 + thread_in_wg;
    const int rank = row < m_end ? __ldcg(&p.sources[row].rank) : -1;
    for (int r = 0; r < p.ctx.ranks; ++r) {
      const unsigned n = __popc(__ballot_sync(0xffffffffu, rank == r));
      if (lane == 0 && n) ep_device::add_release_sys(p.region<uint64_t>(r, p.layout.combine_pieces) + p.ctx.rank, n);
    }
  }
}

}  // namespace mega_detail

// W4A8: named barriers kMegaDecodeBarrier + math warpgroup (128 threads each) order each math warpgroup's
// FP4 decode and its wgmma (w4a8_tile_mainloop). NOTES: the fused kernel's CTA-wide ids 1-4 (SwiGLU
// exchange, gemm1_done, combine pieces, reduce) have other thread counts, so the decode gets its own ids
// (5, 6): a math warpgroup may run ahead of the other by up to the ring's stages and reach a 128-thread
// decode barrier while the other is still at a 256-thread barrier of the previous tile.
constexpr uint32_t kMegaDecodeBarrier = 5;

// W4A8: the group scales of k-block 0 of n-tile `n_tile` of local expert `expert` in the packed layout
// [E_local, k_blocks, n, scale bytes per row] (the producer adds n * bytes per row per k-block).
template <int kScaleBytesPerRow>
__device__ __forceinline__ const uint8_t* mega_w4a8_group_scales(const uint8_t* base, int expert, int k_blocks, int n,
                                                                 int n_tile) {
  return base + (static_cast<int64_t>(expert) * k_blocks * n + static_cast<int64_t>(n_tile) * sm90::kW4a8BlockN) *
                    kScaleBytesPerRow;
}

// Whether the launch's GEMM 1 reads W13 packed kGateUpInterleaved8: FP8, GroupedGemmLayout kSplitNInterleaved; W4A8
// (session 19), W4a8GemmLayout with the kSwigluInterleavedFp8 epilogue (kGateUpInterleaved8); BF16: never.
template <class Layout>
constexpr bool mega_interleaved_w13() {
  if constexpr (requires { Layout::kGateUpSplitNInterleaved8; }) return Layout::kGateUpSplitNInterleaved8;
  else if constexpr (requires { Layout::kW4a8SharedScales; }) return Layout::kGateUpInterleaved8;
  else return false;
}

// W4A8 GEMM-1 epilogue of a tile on W13 packed kGateUpInterleaved8 (W4a8GemmLayout kSwigluInterleavedFp8; the
// standalone 2-warpgroup kernel's pieces, sm90_w4a8_grouped_gemm.cuh): math warpgroup w holds, per 64-row sub-tile,
// gate AND up of outputs [64 w, 64 w + 64) of FP8 block n_tile. A 64-row tile of <= kW4a8SpreadRows rows (with
// p.swiglu_spread) takes the spread epilogue (kInterleaved), its FP32 staging in the decoded tiles as the standalone
// kernel; otherwise w4a8_interleaved_swiglu_epilogue (in-thread SwiGLU, the row amax exchanged between the two
// warpgroups through smem.row_amax: the start of the exchange region, W4a8GemmLayout::kAmaxOffset).
// NOTES:
// - Bit-identical to the kGateUp W4A8 GEMM 1 (w4a8_tile_mainloop / w4a8_interleaved_swiglu_epilogue NOTES).
// - Barriers: named barrier 1 (256 math threads: the amax exchange, or the spread epilogue's three); the choice
//   depends on (m0, m_end) only: CTA-uniform. Both warpgroups store codes of every row, so the caller publishes the
//   tile after a 256-thread barrier (id 2), which also orders this tile's amax reads before the next tile's amax
//   writes and any GEMM-2 staging write (both alias the region), and the spread staging's reads before the next
//   decode into the decoded tiles (the standalone kernel's argument: the spread's first barrier comes after both
//   warpgroups' last wgmma of the tile).
// - Top-k weights and no other operand are read coherently (written by other CTAs in this launch).
template <class Layout>
__device__ __forceinline__ void mega_w4a8_gemm1_interleaved_epilogue(float (&accumulator)[Layout::kSubTiles][64],
                                                                     const sm90::W4a8GemmShared<Layout>& smem,
                                                                     int math_wg, const sm90::MathRows<Layout::kSubTiles>& where,
                                                                     int m0, int m_end, int n_tile, int I,
                                                                     const float* topk_weights, const MegaMoeParams& p) {
  using namespace sm90;
  static_assert(Layout::kGateUpInterleaved8 && Layout::kStagingRowsValue > 0, "the fused kernel's interleaved layout");
  constexpr uint32_t kBarrier = 1;
  if constexpr (Layout::kSubTiles == 1) {
    static_assert(2 * kW4a8SpreadRows * 128 * 4 <= 2 * kMathWarpgroups * Layout::kDecodedBytes,
                  "the spread staging lives in the decoded tiles");
    if (p.swiglu_spread && m_end - m0 <= kW4a8SpreadRows) {
      swiglu_quant_fp8_spread_epilogue<kW4a8SpreadRows, true, false, true>(
          accumulator[0], reinterpret_cast<float*>(smem.decoded), math_wg, m0, m_end - m0, n_tile, I, topk_weights,
          p.act, p.act_scales, p.activation, p.limit, p.alpha, kBarrier);
      return;
    }
  }
  w4a8_interleaved_swiglu_epilogue<Layout::kSubTiles, 64, kMathWarpgroups, true>(
      accumulator, smem.row_amax, math_wg, where, kBarrier, n_tile, I, topk_weights, p.act, p.act_scales, p.activation,
      p.limit, p.alpha);
}

// FP8 GEMM-1 epilogue of a tile on W13 packed kGateUpInterleaved8 (Layout::kGateUpSplitNInterleaved8; v11 GEMM 1
// small's pieces, sm90_fp8_wide_gemm1.cuh): math warpgroup w holds, for each of its kSubTiles 64-row sub-tiles,
// gate AND up of outputs [64 w, 64 w + 64) of FP8 block n_tile. A 64-row tile of <= kSpreadRows rows (with
// p.swiglu_spread) takes the spread epilogue (kInterleaved: every math warp finishes whole rows); otherwise each
// sub-tile holding rows of the expert runs swiglu_quant_fp8_rows_epilogue (kHalves 1) with the per-row amax
// exchanged between the warpgroups (RowsAmaxExchange, buffer [s] of Layout::kAmaxOffset for sub-tile s).
// NOTES:
// - Bit-identical to the kGateUp path and to staged's v11 GEMM 1 (small): every output's 128-K partials come from
//   the same 4 wgmma k32 steps on the same A and W13 rows (the interleave only moves rows of the B tile), promoted
//   with the same FFMA (partial * (a_scale * gate / up block scale)) in the same k order; the epilogues' per-element
//   operations and the exact amax over the row's 128 outputs are those of swiglu_quant_fp8_finish_rows.
// - Barriers: named barrier 1 (256 math threads), as the kGateUp epilogue. The spread / rows choice and the
//   sub-tile skip depend on (m0, m_end) only: CTA-uniform, so both warpgroups run the same barrier sequence.
// - Shared memory: the spread epilogue's FP32 staging (32 KiB) and the rows epilogue's FP8 row staging (18,432 B)
//   are the exchange / GEMM-2 staging region (Layout::kExchangeRegionBytes covers both); the fused kernel ends
//   every GEMM-1 tile with bulk_wait_all, so no earlier copy still reads it; within a tile a warp's rows-epilogue
//   calls order their own staging reuse (bulk_wait_all_read + __syncwarp inside). The amax exchange has its own
//   1 KiB (Layout::kAmaxOffset), one [2 warpgroups][64 rows] buffer per sub-tile instead of v11's tile parity (a
//   parity carried across tiles cost the 128-row kernel a spilled register): within a tile the sub-tiles use
//   different buffers; across tiles the caller's 256-thread barrier before gemm1_done (named barrier 2, after
//   every read of this tile's buffers) orders the next tile's writes.
template <class Layout>
__device__ __forceinline__ void mega_gemm1_interleaved_epilogue(float (&accumulator)[Layout::kSubTiles][64],
                                                                const sm90::Fp8GemmShared<Layout>& smem, int math_wg,
                                                                int row_in_tile, int m0, int m_end, int n_tile, int I,
                                                                const float* topk_weights, const MegaMoeParams& p) {
  using namespace sm90;
  static_assert(Layout::kGateUpSplitNInterleaved8 && Layout::kAmaxBytes >= Layout::kSubTiles * kMathWarpgroups * 64 * 4);
  static_assert(Layout::kExchangeRegionBytes >= Layout::kFp8RowStagingBytes, "FP8 row staging in the region");
  constexpr uint32_t kBarrier = 1;
  constexpr int kSpreadRows = swiglu_spread_rows<Layout>();
  const int tile_rows = m_end - m0;
  if constexpr (kSpreadRows > 0) {
    static_assert(Layout::kExchangeRegionBytes >= 2 * kSpreadRows * 128 * 4, "the spread staging in the region");
    if (p.swiglu_spread && tile_rows <= kSpreadRows) {
      swiglu_quant_fp8_spread_epilogue<kSpreadRows, true, false, true>(
          accumulator[0], smem.exchange, math_wg, m0, tile_rows, n_tile, I, topk_weights, p.act, p.act_scales,
          p.activation, p.limit, p.alpha, kBarrier);
      return;
    }
  }
  float* const amax_buffer = reinterpret_cast<float*>(smem.a_tiles + Layout::kAmaxOffset);
#pragma unroll
  for (int s = 0; s < Layout::kSubTiles; ++s) {
    if (s > 0 && tile_rows <= 64 * s) break;  // CTA-uniform: no row of the expert in sub-tile s
    float* const exchange = amax_buffer + s * (kMathWarpgroups * 64);
    const RowsAmaxExchange combine{exchange + math_wg * 64, exchange + (1 - math_wg) * 64, row_in_tile, kBarrier};
    swiglu_quant_fp8_rows_epilogue<true, 1>(reinterpret_cast<float(&)[1][64]>(accumulator[s]), smem.fp8_row_staging,
                                            m0 + 64 * s, m_end, n_tile, I, topk_weights, p.act, p.act_scales,
                                            p.activation, p.limit, p.alpha, 64 * math_wg, combine);
  }
}

// Register split of the fused kernel's warpgroups (producer: TMA thread + scale warp; two math
// warpgroups). NOTES: 168 x 384 registers per CTA (__launch_bounds__(384, 1)), so producer + 2 x math
// <= 504 (sm90_fp8_grouped_gemm.cuh: a larger producer share hangs setmaxnreg.inc).
constexpr uint32_t kMegaProducerRegisters = 40, kMegaMathRegisters = 232;
static_assert(kMegaProducerRegisters + 2 * kMegaMathRegisters <= 504, "the launch's 168 x 384 registers");
// W4A8: the producer is the TMA thread alone (no scale warp), and the math warpgroups hold the decode
// state beside 128 accumulators + 64 partials at 128-row tiles, so they get the standalone FP8 kernel's
// 24 / 240 split (ptxas, 128 x 256 nvfp4: 232 B of spill stores at 40 / 232, 108 B at 24 / 240; 64 x 256:
// none either way).
constexpr uint32_t kMegaW4a8ProducerRegisters = 24, kMegaW4a8MathRegisters = 240;
static_assert(kMegaW4a8ProducerRegisters + 2 * kMegaW4a8MathRegisters <= 504, "the launch's 168 x 384 registers");

// Dynamic shared memory: the grouped GEMM's (stages, SwiGLU exchange, barriers, tile table) plus the
// expert offsets [E_local + 1].
template <class Layout>
constexpr int mega_moe_shared_bytes(int local_experts) {
  return Layout::shared_bytes(local_experts) + 4 * (local_experts + 1);
}

// Tensor maps (byte matrices, 128-byte swizzle, as the grouped GEMMs): x_map over grouped_x
// [max_rows, P * H], w13_map over the packed W13 [E_local * 2I, P * H], act_map over act
// [max_rows, P * I], w2_map over W2 [E_local * H, P * I]; P = mega_element_bytes(kFormat).
template <class Layout, MegaFormat kFormat>
__global__ void __launch_bounds__(sm90::kThreadsPerCta, 1)
    sm90_mega_moe_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w13_map,
                         const __grid_constant__ CUtensorMap act_map, const __grid_constant__ CUtensorMap w2_map,
                         const MegaMoeParams p) {
  using namespace sm90;
  using namespace mega_detail;
  constexpr bool kFp8 = kFormat == MegaFormat::kFp8Block;
  constexpr bool kW4a8 = mega_is_w4a8(kFormat);
  constexpr int kW4a8ScaleBytesPerRow =
      Fp4Traits<kFormat == MegaFormat::kMxfp4 ? Fp4Format::kMxfp4 : Fp4Format::kNvfp4>::kScaleBytesPerRow;
  constexpr int kBlockM = Layout::kBlockM, kBlockN = Layout::kBlockN;
  static_assert(kBlockN == 256 && Layout::kWarpgroupsMValue == 1, "both GEMMs run split-N 256-column tiles");
  static_assert(Layout::kStagingRowsValue > 0, "the GEMM-2 epilogue stages its BF16 rows (store_bf16_epilogue_bulk)");
  static_assert(!Layout::kScalesInShared || kFp8, "shared scales are FP8 only (the BF16 mainloop has none)");
  if constexpr (kW4a8)
    static_assert(Layout::kFp4Format == (kFormat == MegaFormat::kNvfp4 ? Fp4Format::kNvfp4 : Fp4Format::kMxfp4),
                  "the W4A8 layout's FP4 format is the launch's");
  // FP8 GEMM 1 on W13 packed kGateUpInterleaved8 (mega_gemm1_interleaved_epilogue); else kGateUp.
  constexpr bool kInterleavedW13 = mega_interleaved_w13<Layout>();
  static_assert(!kInterleavedW13 || kFp8 || kW4a8, "the interleaved split-N GEMM 1: FP8-block and W4A8");
  // v8c in the fused kernel: GEMM-1's FP8 rows leave through the exchange buffer by 128-byte bulk copies.
  constexpr bool kBulkActRows = true;
  constexpr int kBulkGroupsPerTile = bulk_groups_per_tile<Layout::kSubTiles, Layout::kStagingRowsValue>();

  extern __shared__ uint8_t shared_raw[];
  // The GEMMs' own shared-memory carve-up (stages, exchange / staging, barriers, then the tile table).
  using Shared = std::conditional_t<kW4a8, W4a8GemmShared<Layout>, Fp8GemmShared<Layout>>;
  const Shared smem(shared_raw);
  const int E = p.experts_per_rank;
  const ExpertTileTable table(reinterpret_cast<int*>(smem.table_base), E);
  int* offsets = reinterpret_cast<int*>(smem.table_base) + 3 * (E + 1);  // [E + 1]
  __shared__ int tokens_of[kMaxEpRanks];
  __shared__ int cta_flag;
  __shared__ uint32_t expected_counts[kMaxEpRanks];

  const int me = p.ctx.rank, R = p.ctx.ranks;
  const uint64_t target = *p.epoch + 1;  // this forward's epoch value
  if (threadIdx.x == 0) {
    stamp_phase(p, kMegaStampStart);
    cta_flag = ep_device::group_failed(p.ctx) ? 0 : 1;
    smem.init_barriers();
    prefetch_tensor_map(&x_map);
    prefetch_tensor_map(&w13_map);
    prefetch_tensor_map(&act_map);
    prefetch_tensor_map(&w2_map);
  }
  if (threadIdx.x < kMaxEpRanks) expected_counts[threadIdx.x] = 0;
  __syncthreads();
  if (!cta_flag) return;

  // ---- 1: stage this rank's tokens in its own window, publish ---------------------------------------
  {
    uint32_t mine = 0;
    stage_own_tokens<kFormat>(p, &mine);
    if ((threadIdx.x & 31) < R && mine) atomicAdd(&expected_counts[threadIdx.x & 31], mine);
  }
  __syncthreads();
  if (threadIdx.x < R && expected_counts[threadIdx.x]) atomicAdd(p.expected_from + threadIdx.x, expected_counts[threadIdx.x]);
  if (blockIdx.x == 0 && threadIdx.x == 0) *p.region<int32_t>(me, p.layout.src_count) = p.num_tokens;
  __syncthreads();
  if (threadIdx.x == 0) {
    if (last_cta_arrives(p.ctas_quantized))
      for (int r = 0; r < R; ++r) ep_device::store_release_sys(p.region<uint64_t>(r, p.layout.ready) + me, target);
    stamp_phase(p, kMegaStampStaged);
  }

  // ---- 2: every rank's tokens are ready: expert offsets and the tile table --------------------------
  if (threadIdx.x == 0) {
    int ok = 1;
    const uint64_t* ready = p.region<uint64_t>(me, p.layout.ready);
    for (int s = 0; s < R && ok; ++s)
      if (!ep_device::bounded_wait_geq(p.ctx, ready + s, target, EpPhase::kDispatch, s)) ok = 0;
    cta_flag = ok;
  }
  __syncthreads();
  if (!cta_flag) return;
  if (threadIdx.x < R) tokens_of[threadIdx.x] = __ldcg(p.region<int32_t>(threadIdx.x, p.layout.src_count));
  if (threadIdx.x / 32 == 0) {  // warp 0: offsets[e] = rows of local experts < e (exclusive scan)
    const int lane = threadIdx.x;
    const int first = me * E;
    int carry = 0;
    for (int base = 0; base < E; base += 32) {
      const int e = base + lane;
      int rows = 0;
      if (e < E)
        for (int s = 0; s < R; ++s) rows += __ldcg(p.region<int32_t>(s, p.layout.src_expert_counts) + first + e);
      int inclusive = rows;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int other = __shfl_up_sync(0xffffffffu, inclusive, d);
        if (lane >= d) inclusive += other;
      }
      if (e < E) offsets[e] = carry + inclusive - rows;
      carry += __shfl_sync(0xffffffffu, inclusive, 31);
    }
    if (lane == 0) offsets[E] = carry;
  }
  __syncthreads();
  if (threadIdx.x == 0) stamp_phase(p, kMegaStampOffsets);
  if (threadIdx.x / 32 == 1) build_expert_tile_table<kBlockM>(table, offsets, E, static_cast<int>(p.max_rows));

  // ---- 3: pull the tokens of my experts from every rank ---------------------------------------------
  pull_tokens<kFormat>(p, offsets, tokens_of);
  __syncthreads();  // also publishes the tile table
  if (threadIdx.x == 0) {
    if (last_cta_arrives(p.ctas_gathered))
      for (int s = 0; s < R; ++s) ep_device::store_release_sys(p.region<uint64_t>(s, p.layout.pulled) + me, target);
    stamp_phase(p, kMegaStampPulled);
  }

  // ---- 4: GEMM 1 then GEMM 2 tiles -------------------------------------------------------------------
  const int H = p.hidden, I = p.intermediate, k = p.top_k;
  const int m_tiles = table.tile_prefix[E];
  const int n1_tiles = 2 * I / kBlockN, n2_tiles = H / kBlockN;
  // Pipeline stages of 128 bytes of K: 128 FP8 elements or 64 BF16 ones.
  const int k1_blocks = H * mega_element_bytes(kFormat) / kBlockK, k2_blocks = I * mega_element_bytes(kFormat) / kBlockK;
  const int total_tiles = m_tiles * (n1_tiles + n2_tiles);
  const int warpgroup = threadIdx.x / 128;
  const int lane = threadIdx.x % 32;

  if (warpgroup == 0) {
    registers_decrease<kW4a8 ? kMegaW4a8ProducerRegisters : kMegaProducerRegisters>();
    // Thread 0 issues the operands' TMA; with Layout::kScalesInShared (FP8) warp 1 is the scale warp
    // (produce_fp8_scales): same tile walk, same waits, the stage's A and B scales by cp.async.
    const bool tma_thread = threadIdx.x == 0;
    const bool scale_warp = Layout::kScalesInShared && threadIdx.x / 32 == 1;
    if (!tma_thread && !scale_warp) return;
    PipelineCursor<Layout::kStageCount> cursor;
    int expert1 = 0, expert2 = 0, waited_expert = -1;
    for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
      const MegaTile task = decode_mega_tile(tile, m_tiles, n1_tiles, n2_tiles);
      if (!task.gemm2) {
        const TileCoordinates t = locate_tile(table, task.m_tile * n1_tiles + task.n_tile, n1_tiles, kBlockM, expert1);
        if (waited_expert != expert1) {
          if (lane == 0)
            wait_local_geq(p.ctx, p.arrived + expert1, static_cast<uint64_t>(offsets[expert1 + 1] - offsets[expert1]));
          waited_expert = expert1;
          if (tma_thread) fence_proxy_async_global();
          else __syncwarp();
        }
        if constexpr (kW4a8) {  // tma_thread: the scale warp exists for FP8 only
          produce_w4a8_tile(smem, &x_map, &w13_map, t.m0, expert1 * 2 * I + t.n_tile * kBlockN,
                            mega_w4a8_group_scales<kW4a8ScaleBytesPerRow>(p.w13_group_scales, expert1, k1_blocks, 2 * I, t.n_tile),
                            static_cast<int64_t>(2 * I) * kW4a8ScaleBytesPerRow, k1_blocks, cursor);
        } else if (tma_thread) {
          produce_fp8_tile(smem, &x_map, &w13_map, t.m0, expert1 * 2 * I + t.n_tile * kBlockN, k1_blocks, cursor);
        } else if constexpr (Layout::kScalesInShared) {
          const float* b_scales = p.w13_scales + (static_cast<int64_t>(expert1) * (2 * I / 128) + 2 * t.n_tile) * k1_blocks;
          produce_fp8_scales(smem, p.grouped_scales, b_scales, b_scales + k1_blocks, t.m0, t.m_end, k1_blocks, cursor);
        }
      } else {
        const TileCoordinates t = locate_tile(table, task.m_tile * n2_tiles + task.n_tile, n2_tiles, kBlockM, expert2);
        if (lane == 0) wait_local_geq(p.ctx, p.gemm1_done + task.m_tile, static_cast<uint64_t>(n1_tiles));
        if constexpr (kW4a8) {
          fence_proxy_async_global();
          produce_w4a8_tile(smem, &act_map, &w2_map, t.m0, expert2 * H + t.n_tile * kBlockN,
                            mega_w4a8_group_scales<kW4a8ScaleBytesPerRow>(p.w2_group_scales, expert2, k2_blocks, H, t.n_tile),
                            static_cast<int64_t>(H) * kW4a8ScaleBytesPerRow, k2_blocks, cursor);
        } else if (tma_thread) {
          fence_proxy_async_global();
          produce_fp8_tile(smem, &act_map, &w2_map, t.m0, expert2 * H + t.n_tile * kBlockN, k2_blocks, cursor);
        } else if constexpr (Layout::kScalesInShared) {
          __syncwarp();
          const float* b_scales = p.w2_scales + (static_cast<int64_t>(expert2) * (H / 128) + 2 * t.n_tile) * k2_blocks;
          produce_fp8_scales(smem, p.act_scales, b_scales, b_scales + k2_blocks, t.m0, t.m_end, k2_blocks, cursor);
        }
      }
    }
    if (scale_warp) cp_async_wait_all();
    return;
  }

  registers_increase<kW4a8 ? kMegaW4a8MathRegisters : kMegaMathRegisters>();
  const int math_wg = warpgroup - 1;
  const int thread_in_wg = threadIdx.x % 128;
  const int math_thread = threadIdx.x - 128;  // 0..255
  const int row_in_tile = (thread_in_wg / 32) * 16 + lane / 4;
  {
    PipelineCursor<Layout::kStageCount> cursor;
    int expert1 = 0, expert2 = 0;
    int counted_m0 = -1, counted_m_end = 0;  // the GEMM-2 tile whose pieces are not counted yet (m0 < 0: none)
    float accumulator[Layout::kSubTiles][64];
    float partial[64];
    for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
      const MegaTile task = decode_mega_tile(tile, m_tiles, n1_tiles, n2_tiles);
      if (!task.gemm2) {
        const TileCoordinates t = locate_tile(table, task.m_tile * n1_tiles + task.n_tile, n1_tiles, kBlockM, expert1);
        // The scales and row weights of these rows come from other CTAs' phase 3.
        if (lane == 0)
          wait_local_geq(p.ctx, p.arrived + expert1, static_cast<uint64_t>(offsets[expert1 + 1] - offsets[expert1]));
        __syncwarp();
        const MathRows<Layout::kSubTiles> where(t.m0, t.m_end, row_in_tile);
        const float* topk_weights = p.apply_topk_in_fc1 ? p.row_weights : nullptr;
        if constexpr (kFp8 && kInterleavedW13) {
          // W13 kGateUpInterleaved8 (the staged pipeline's packing, docs/mega.md "One W13"): v11 GEMM 1 small's
          // split-N arithmetic on this kernel's ring (gate / up scale pairs from the scale warp's slot).
          fp8_tile_mainloop<Layout, true, MathSchedule::kSerial, true>(
              accumulator, partial, smem, where, p.grouped_scales, nullptr, k1_blocks, 0, math_wg, cursor,
              active_sub_tiles(t.m_end - t.m0, 0, Layout::kSubTiles));
          mega_gemm1_interleaved_epilogue<Layout>(accumulator, smem, math_wg, row_in_tile, t.m0, t.m_end, t.n_tile, I,
                                                  topk_weights, p);
        } else if constexpr (kFp8) {
          const int n_block = t.n_tile * 2 + math_wg;
          const float* b_scales = p.w13_scales + (static_cast<int64_t>(expert1) * (2 * I / 128) + n_block) * k1_blocks;
          fp8_tile_mainloop<Layout, true>(accumulator, partial, smem, where, p.grouped_scales, b_scales, k1_blocks, 0,
                                          math_wg, cursor, active_sub_tiles(t.m_end - t.m0, 0, Layout::kSubTiles));
          // Spread epilogue (swiglu_quant_fp8_spread_epilogue) for 64-row tiles holding <= kSpreadRows rows of their
          // expert: the staging is the exchange / GEMM-2 staging region (34,816 B at 64 x 256: 32 rows), free
          // between GEMM-1 tiles as for the balanced epilogue; its stores are plain, published below like the
          // balanced epilogue's non-bulk ones. CTA-uniform branch.
          constexpr int kSpreadRows = swiglu_spread_rows<Layout>();
          bool spread = false;
          if constexpr (kSpreadRows > 0) spread = p.swiglu_spread && t.m_end - t.m0 <= kSpreadRows;
          if (spread) {
            if constexpr (kSpreadRows > 0)
              swiglu_quant_fp8_spread_epilogue<kSpreadRows, true, kBulkActRows>(
                  accumulator[0], smem.exchange, math_wg, t.m0, t.m_end - t.m0, t.n_tile, I, topk_weights, p.act,
                  p.act_scales, p.activation, p.limit, p.alpha, 1);
          } else {
            swiglu_quant_fp8_epilogue<Layout, true, kBulkActRows>(accumulator, smem.exchange, math_wg, where, t.n_tile, I,
                                                                  topk_weights, p.act, p.act_scales, p.activation,
                                                                  p.limit, p.alpha);
          }
        } else if constexpr (kW4a8 && kInterleavedW13) {
          // W13 kGateUpInterleaved8 (the staged pipeline's W4A8 packing by default, docs/mega.md "One
          // W13"): both warpgroups read the tile's gate block records (block 2 n_tile) and up block records (at
          // + k1_blocks), each thread decodes its packed row with its own block's (w4a8_tile_mainloop kInterleaved).
          const W4a8BlockScaleDevice* blocks =
              p.w13_blocks + (static_cast<int64_t>(expert1) * (2 * I / 128) + 2 * t.n_tile) * k1_blocks;
          w4a8_tile_mainloop<Layout, true, kMegaDecodeBarrier>(accumulator, partial, smem, where, p.grouped_scales,
                                                               blocks, k1_blocks, math_wg, cursor, p.w4a8_decoder);
          mega_w4a8_gemm1_interleaved_epilogue<Layout>(accumulator, smem, math_wg, where, t.m0, t.m_end, t.n_tile, I,
                                                       topk_weights, p);
        } else if constexpr (kW4a8) {
          const int n_block = t.n_tile * 2 + math_wg;
          const W4a8BlockScaleDevice* blocks =
              p.w13_blocks + (static_cast<int64_t>(expert1) * (2 * I / 128) + n_block) * k1_blocks;
          w4a8_tile_mainloop<Layout, true, kMegaDecodeBarrier>(accumulator, partial, smem, where, p.grouped_scales,
                                                               blocks, k1_blocks, math_wg, cursor, p.w4a8_decoder);
          // The up warpgroup quantizes and stores all the tile's rows (published below like BF16's).
          w4a8_swiglu_quant_fp8_epilogue<Layout, true>(accumulator, smem.exchange, math_wg, where, t.n_tile, I,
                                                       topk_weights, p.act, p.act_scales, p.activation, p.limit,
                                                       p.alpha);
        } else {
          bf16_tile_mainloop<Layout>(accumulator, smem, k1_blocks, 0, math_wg, cursor);
          swiglu_bf16_epilogue<Layout, true>(accumulator, smem.exchange, math_wg, where, t.n_tile, I, topk_weights,
                                             reinterpret_cast<__nv_bfloat16*>(p.act), p.activation, p.limit, p.alpha);
        }
        if constexpr (kFp8 || (kW4a8 && kInterleavedW13)) {
          // FP8: each math warpgroup stored half of the tile's rows (v7 epilogue); W4A8 on interleaved W13: each
          // stored its 64 columns of every row.
          if constexpr (kFp8 && kBulkActRows) bulk_wait_all();  // the act rows' bulk copies are complete (NOTES)
          fence_proxy_async_global();  // act is read by TMA
          __threadfence();
          named_barrier_sync(2, 256);
          if (math_thread == 0) {
            ep_device::add_release_sys(p.gemm1_done + task.m_tile, 1ull);
            stamp_phase(p, kMegaStampGemm1);  // overwritten by each later GEMM-1 tile of this CTA
          }
        } else if (math_wg == 1) {  // BF16, W4A8: the up warpgroup stored the tile
          fence_proxy_async_global();  // act is read by TMA
          __threadfence();
          named_barrier_sync(2, 128);
          if (thread_in_wg == 0) {
            ep_device::add_release_sys(p.gemm1_done + task.m_tile, 1ull);
            stamp_phase(p, kMegaStampGemm1);  // overwritten by each later GEMM-1 tile of this CTA
          }
        }
      } else {
        const TileCoordinates t = locate_tile(table, task.m_tile * n2_tiles + task.n_tile, n2_tiles, kBlockM, expert2);
        if (lane == 0) wait_local_geq(p.ctx, p.gemm1_done + task.m_tile, static_cast<uint64_t>(n1_tiles));
        __syncwarp();
        const MathRows<Layout::kSubTiles> where(t.m0, t.m_end, row_in_tile);
        if constexpr (kFp8) {
          const int n_block = t.n_tile * 2 + math_wg;
          const float* b_scales = p.w2_scales + (static_cast<int64_t>(expert2) * (H / 128) + n_block) * k2_blocks;
          fp8_tile_mainloop<Layout, true>(accumulator, partial, smem, where, p.act_scales, b_scales, k2_blocks, 0,
                                          math_wg, cursor, active_sub_tiles(t.m_end - t.m0, 0, Layout::kSubTiles));
        } else if constexpr (kW4a8) {
          const int n_block = t.n_tile * 2 + math_wg;
          const W4a8BlockScaleDevice* blocks =
              p.w2_blocks + (static_cast<int64_t>(expert2) * (H / 128) + n_block) * k2_blocks;
          w4a8_tile_mainloop<Layout, true, kMegaDecodeBarrier, false>(accumulator, partial, smem, where, p.act_scales,
                                                                      blocks, k2_blocks, math_wg, cursor,
                                                                      p.w4a8_decoder);  // W2: kDown, never interleaved
        } else {
          bf16_tile_mainloop<Layout>(accumulator, smem, k2_blocks, 0, math_wg, cursor);
        }
        // v8: BF16 rows through shared staging (aliasing the exchange buffer) and 256-byte bulk copies
        // straight into the combine row of the row's source rank (a peer's, over NVLink, or mine).
        store_bf16_epilogue_bulk<Layout::kSubTiles, Layout::kStagingRowsValue>(
            accumulator, smem.bf16_staging + math_wg * Layout::kStagingRowsValue * kBf16StagingPitch, t.m0, t.m_end,
            t.n_tile * kBlockN + math_wg * 128, [&](int row) {
              const int4 raw = __ldcg(reinterpret_cast<const int4*>(p.sources + row));  // RowSource {rank, token, slot, w}
              const int rank = p.diag_local_combine ? me : raw.x;
              return p.region<__nv_bfloat16>(rank, p.layout.combine_rows) + (static_cast<size_t>(raw.y) * k + raw.z) * H;
            });
        // The previous GEMM-2 tile's copies have had this tile's mainloop to drain: count its pieces now,
        // leaving this tile's copies in flight (NOTES: deferred piece counts).
        if (counted_m0 >= 0)
          count_combine_pieces<kBulkGroupsPerTile, kBlockM>(p, counted_m0, counted_m_end, math_wg, thread_in_wg, lane);
        counted_m0 = t.m0;
        counted_m_end = t.m_end;
      }
    }
    if (counted_m0 >= 0) count_combine_pieces<0, kBlockM>(p, counted_m0, counted_m_end, math_wg, thread_in_wg, lane);
  }

  // ---- 5: every peer wrote its rows of my tokens: reduce --------------------------------------------
  if (math_thread == 0) {
    stamp_phase(p, kMegaStampGemm2);  // after this CTA's tile loop (its last GEMM-2 tile)
    int ok = 1;
    const uint64_t* pieces = p.region<uint64_t>(me, p.layout.combine_pieces);
    for (int r = 0; r < R && ok; ++r) {
      const uint64_t want = static_cast<uint64_t>(__ldcg(p.expected_from + r)) * n2_tiles;
      if (!ep_device::bounded_wait_geq(p.ctx, pieces + r, want, EpPhase::kCombine, r)) ok = 0;
    }
    cta_flag = ok;
    stamp_phase(p, kMegaStampCombineWait);
  }
  named_barrier_sync(4, 256);
  if (cta_flag) {
    const int math_warps = 8;
    const int warp_global = blockIdx.x * math_warps + math_thread / 32;
    const __nv_bfloat16* rows = p.region<__nv_bfloat16>(me, p.layout.combine_rows);
    const int32_t* ids = p.region<int32_t>(me, p.layout.src_ids);
    const float* weights = p.region<float>(me, p.layout.src_weights);
    // Work items (token, column segment): at least ~2 per math warp of the grid when tokens are few
    // (128 tokens x 7168 on 1056 warps: one warp per token took ~100 us of memory round trips), whole
    // rows when they are many; a segment is a multiple of 32 chunks of 8 channels.
    const int chunks = H / 8, warps = gridDim.x * math_warps;
    const int max_segments = max(1, chunks / 32);
    const int segments = p.num_tokens > 0 ? min(max_segments, max(1, (2 * warps + p.num_tokens - 1) / p.num_tokens)) : 1;
    const int segment_chunks = ((chunks + segments - 1) / segments + 31) / 32 * 32;
    const int64_t items = static_cast<int64_t>(p.num_tokens) * segments;
    for (int64_t item = warp_global; item < items; item += warps) {
      const int t = static_cast<int>(item / segments), segment = static_cast<int>(item % segments);
      const int c_begin = segment * segment_chunks, c_end = min(chunks, c_begin + segment_chunks);
      if (c_begin >= c_end) continue;
      int id_lane = -1;
      float weight_lane = 1.0f;
      if (lane < k) {
        id_lane = __ldcg(ids + static_cast<size_t>(t) * k + lane);
        if (!p.apply_topk_in_fc1) weight_lane = __ldcg(weights + static_cast<size_t>(t) * k + lane);
      }
      reduce_topk_segment(rows + static_cast<size_t>(t) * k * H, id_lane, weight_lane, k, H, c_begin, c_end,
                          p.out + static_cast<size_t>(t) * H, lane);
    }
  }

  // ---- 6: the last CTA resets every counter of this forward ------------------------------------------
  named_barrier_sync(4, 256);
  if (math_thread == 0) {
    cta_flag = last_cta_arrives(p.ctas_finished) ? 1 : 0;
    if (cta_flag) {
      // My src_* (and src_expert_counts) are free once every rank pulled; the group may have failed.
      const uint64_t* pulled = p.region<uint64_t>(me, p.layout.pulled);
      for (int s = 0; s < R; ++s)
        if (!ep_device::bounded_wait_geq(p.ctx, pulled + s, target, EpPhase::kDispatch, s)) cta_flag = 0;
    }
    stamp_phase(p, kMegaStampReduced);
  }
  named_barrier_sync(4, 256);
  if (!cta_flag) return;
  int32_t* expert_counts = p.region<int32_t>(me, p.layout.src_expert_counts);
  for (int e = math_thread; e < p.num_experts; e += 256) expert_counts[e] = 0;
  for (int e = math_thread; e < E; e += 256) {
    p.cursors[e] = 0;
    p.arrived[e] = 0;
  }
  for (int m = math_thread; m < m_tiles; m += 256) p.gemm1_done[m] = 0;
  if (math_thread < kMaxEpRanks) {
    p.expected_from[math_thread] = 0;
    p.region<uint64_t>(me, p.layout.combine_pieces)[math_thread] = 0;
  }
  __threadfence();
  named_barrier_sync(4, 256);
  if (math_thread == 0) *p.epoch = target;
}

// grid = SM count (one CTA per SM; the shared memory keeps it at one), cooperative so that all CTAs
// are co-resident (they wait on each other). NOTES: while the stream is being captured into a graph
// the launch is a plain one (a graph node then runs alone on the GPU with the same one-CTA-per-SM
// grid, so co-residency holds as long as nothing else runs concurrently on other streams).
template <class Layout, MegaFormat kFormat>
inline void launch_mega_moe(const CUtensorMap& x_map, const CUtensorMap& w13_map, const CUtensorMap& act_map,
                            const CUtensorMap& w2_map, const MegaMoeParams& p, int ctas, cudaStream_t stream) {
  auto* kernel = &sm90_mega_moe_kernel<Layout, kFormat>;
  const int shared_bytes = mega_moe_shared_bytes<Layout>(p.experts_per_rank);
  MEGAMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(ctas);
  config.blockDim = dim3(sm90::kThreadsPerCta);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MEGAMOE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeCooperative;
  attribute.val.cooperative = 1;
  config.attrs = &attribute;
  config.numAttrs = capture == cudaStreamCaptureStatusNone ? 1 : 0;
  MEGAMOE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, x_map, w13_map, act_map, w2_map, p));
}

}  // namespace megamoe::kernels
