// Grouped (per-expert) GEMMs of an MoE layer on Hopper (sm_90a): the typed, validating API.
//
// Three layers per op (DeepGEMM style):
//   __global__ kernel        src/kernels/sm90_fp8_grouped_gemm.cuh
//   launcher                 beside the kernel (raw pointers + sizes + stream)
//   typed validating API     this header (checks every size/pointer, throws megamoe::Error)
//
// ---- rows: one contiguous block of rows per local expert -----------------------------------------
// Activations are [m_capacity, K] row-major; expert e owns rows [expert_offsets[e], expert_offsets[e+1]).
// `expert_offsets` is int32 [num_experts + 1], non-decreasing, in DEVICE memory (the dispatch kernel
// writes it; the host never reads it, so no synchronization per call). Rows outside every expert's
// range are neither read for any output nor written. Offsets beyond m_capacity are clamped to it.
// No padding of an expert's rows to a tile multiple is required.
//
// ---- activations (GEMM inputs), FP8 paths -------------------------------------------------------
//   a        [m_capacity, K] E4M3 bytes, row-major (K contiguous), 16-byte aligned rows (K % 128 == 0)
//   a_scales [m_capacity, K/128] FP32, row-major: value(r, k) = e4m3(a[r, k]) * a_scales[r, k/128]
//   (exactly formats::Fp8Activations, see formats.h)
//
// ---- weights: the kernel's own layout (made once at load time by pack_expert_weights) ----------
// GEMM 1 (role kGateUp, canonical W13 [2I, H] = gate rows then up rows):
//   data   [E, 2I, H] E4M3, K-major, rows INTERLEAVED in blocks of 128:
//          packed row 256*j + i       = gate row 128*j + i   (i < 128)
//          packed row 256*j + 128 + i = up   row 128*j + i
//          so one 256-row N tile holds the gate and the up rows of the same 128 outputs.
//   scales [E, 2I/128, H/128] FP32, packed block 2j = gate block j, 2j+1 = up block j.
// GEMM 1, v9 layout (role kGateUpInterleaved8: FP8 block for the v9 kernel, docs/grouped_gemm.md "v9";
// BF16 for the BF16 v2 GEMM-1 kernel, the same row order of bf16 rows, no scales):
//   data   [E, 2I, H] E4M3 (or BF16), K-major; inside each 256-row N tile j the tile's 128 gate and 128 up rows
//          are interleaved by 8:  packed row 256*j + 16*m + i     = gate row 128*j + 8*m + i   (i < 8)
//                                 packed row 256*j + 16*m + 8 + i = up   row 128*j + 8*m + i   (m < 16)
//          so an m64n128 wgmma fragment holds gate (8-column groups j even) and up (j odd) of the same
//          output column in one thread.
//   scales identical to kGateUp (block 2j = gate block j, 2j+1 = up block j): the FP8 block scales stay
//          per original 128 x 128 block; each 128-row half of the tile multiplies gate rows by block 2j
//          and up rows by block 2j+1.
// GEMM 2 (role kDown, canonical W2 [H, I]):
//   data   [E, H, I] E4M3, K-major (same as canonical), scales [E, H/128, I/128] FP32 (same).
// Per-expert byte sizes: packed_weight_bytes(); expert e starts at e * that size.
//
// ---- GEMM 1 epilogue ------------------------------------------------------------------------------
//   g = acc(gate), u = acc(up) in FP32 (FP32 accumulation with per-128-K promotion:
//       acc += (sum over the 128-K block of e4m3 products) * a_scale[row, kb] * b_scale[nb, kb])
//   kSiluMul:       h = g / (1 + exp(-g)) * u
//   kSwigluClamped: g' = min(g, limit); u' = clamp(u, -limit, limit); h = g' * sigmoid(alpha*g') * (u'+1)
//   h *= topk_weights[row] when topk_weights != nullptr
//   out, out_scales = FP8 per row per 128 of h, exactly the formats::quantize_fp8_activations rule
//   (amax floor kFp8ScaleEps, scale = amax / 448 (IEEE div), q = e4m3_rn_sat(h / scale) (IEEE div)).
// ---- GEMM 2 epilogue: out[row, n] = bf16_rn(acc) ---------------------------------------------------
//
// NOTES: requirements checked by the API: H % 128 == 0, I % 128 == 0, all pointers non-null (except
// topk_weights), 16-byte aligned data pointers, 1 <= num_experts <= 1024, m_capacity < 2^31.
#pragma once

#include <cstddef>
#include <cstdint>

#include "megamoe/formats.h"
#include "megamoe/types.h"

#ifdef MEGAMOE_WITH_CUDA
#include <cuda_runtime_api.h>
#else
using cudaStream_t = struct CUstream_st*;
#endif

namespace megamoe::kernels {

enum class GemmRole : uint8_t {
  kGateUp,  // GEMM 1: canonical W13 [2I, H] -> packed [2I, H] (gate/up interleaved by 128 rows)
  kDown,    // GEMM 2: canonical W2 [H, I] -> packed [H, I]
  kGateUpInterleaved8,  // GEMM 1 for the v9 kernel: gate/up interleaved by 8 rows inside each 256-row tile
};

// Byte size of one expert's packed weight data and the number of FP32 scales that go with it.
struct PackedWeightSize {
  size_t data_bytes = 0;
  size_t scale_count = 0;
};
PackedWeightSize packed_weight_bytes(WeightFormat format, int64_t rows, int64_t cols);

// Host-side layout transform, once per expert at load time. `canonical` is the canonical matrix of
// one expert (formats.h); writes packed_weight_bytes(...).data_bytes bytes to `data_out` and
// .scale_count floats to `scales_out` (host memory; the caller copies them into the device slab at
// expert e's offset). Supported now: kFp8Block, kBf16 (no scales: scale_count 0, scales_out may be
// null). Throws megamoe::Error naming the field otherwise.
void pack_expert_weights(const formats::QuantizedMatrix& canonical, GemmRole role, uint8_t* data_out,
                         float* scales_out);

// How the FP8-block kernels' two math warpgroups share the tensor cores (docs/grouped_gemm.md, v5).
// kAuto: the heuristic (sm90_gemm_heuristics.h), unless the environment variable
// MEGAMOE_FP8_GEMM_SCHEDULE is "serial", "pingpong" or "overlap". kSerial: v4 (both warpgroups issue
// at once). kPingPong: v5, the warpgroups take turns issuing so one promotes while the other
// multiplies; bit-identical to kSerial. kOverlap: v5, each warpgroup issues its next (64 x 64) wgmma
// group before promoting the previous one; same numerics contract (per-128-K promotion, same order).
enum class Fp8GemmSchedule : uint8_t { kAuto, kSerial, kPingPong, kOverlap };

// GEMM 1 (gate+up, activation, optional top-k weight, requant) on FP8-block weights.
// Epilogue of 64 x 256 split-N tiles holding <= 32 rows of their expert (and of the W4A8 2-warpgroup kernel's):
// the spread variant, where every math warp finishes whole rows (docs/grouped_gemm.md "Spread SwiGLU
// epilogue"; bit-identical); the environment variable MEGAMOE_SWIGLU_SPREAD=0 turns it off for A/B runs
// (read per call; anything but unset / empty / 0 / 1 is a megamoe::Error).
struct GroupedGemm1Fp8Args {
  const uint8_t* a = nullptr;           // [m_capacity, hidden] E4M3
  const float* a_scales = nullptr;      // [m_capacity, hidden/128]
  const uint8_t* weights = nullptr;     // packed [E, 2*intermediate, hidden] E4M3
  const float* weight_scales = nullptr; // packed [E, 2*intermediate/128, hidden/128]
  const int32_t* expert_offsets = nullptr;  // device [E+1]
  const float* topk_weights = nullptr;  // optional, [m_capacity], one weight per row
  uint8_t* out = nullptr;               // [m_capacity, intermediate] E4M3
  float* out_scales = nullptr;          // [m_capacity, intermediate/128]
  int64_t m_capacity = 0;
  int num_experts = 0, hidden = 0, intermediate = 0;
  Activation activation{};
  int rows_per_expert_hint = 0;         // expected rows per expert (tile choice only; 0 = unknown)
  Fp8GemmSchedule schedule = Fp8GemmSchedule::kAuto;
  // How `weights` were packed (pack_expert_weights' role), which picks the kernel: kGateUp = the split-N
  // tiles (v8c); kGateUpInterleaved8 = v9 (split-M 128 x 256, every rows hint; schedules kSerial /
  // kPingPong only). Outputs are bit-identical between the two. Anything else: megamoe::Error.
  GemmRole packing = GemmRole::kGateUp;
  // v9 only, experiment (docs/grouped_gemm.md "v9"): math warpgroup 1 runs this many k-blocks (0..4)
  // behind warpgroup 0, so one's epilogue can overlap the other's MMAs; needs the serial schedule.
  // -1: the environment variable MEGAMOE_FP8_GEMM1_V9_SKEW, else 0. Outputs do not depend on it.
  int v9_skew_kblocks = -1;
  // v11 GEMM 1 (docs/grouped_gemm.md "v11 GEMM 1", sm90_fp8_wide_gemm1.cuh), used only when packing ==
  // kGateUpInterleaved8: v9's tile, arithmetic and epilogue with v11's uniform mainloop and TMA A scales
  // (MEGAMOE_FP8_V11_TMA_SCALES, K % 512 == 0); bit-identical outputs to v9. 1 = v11, 0 = v9, -1 = the
  // environment variable MEGAMOE_FP8_GEMM1_V11 ("0" / "1"), else sm90::prefer_fp8_gemm1_v11 (v11 since
  // session 13). One schedule (serial-like); `schedule`
  // is validated as for v9 and v9_skew_kblocks is not used.
  int v11 = -1;
  // v11 GEMM 1 small (docs/grouped_gemm.md "v11 GEMM 1 small"), used only with v11 on kGateUpInterleaved8
  // weights: the 64 x 256 tile whose two math warpgroups split the 256 packed columns (each 64 outputs, gate and
  // up interleaved) instead of the 128 x 256 split-M tile; bit-identical outputs. 1 = small, 0 = 128 x 256, -1 =
  // the environment variable MEGAMOE_FP8_GEMM1_V11_SMALL ("0" / "1"), else
  // sm90::prefer_fp8_gemm1_v11_small(rows_per_expert_hint).
  int v11_small = -1;
};
void grouped_gemm1_fp8(const GroupedGemm1Fp8Args& args, cudaStream_t stream);

// GEMM 2 (down projection) on FP8-block weights: BF16 out.
struct GroupedGemm2Fp8Args {
  const uint8_t* a = nullptr;           // [m_capacity, intermediate] E4M3
  const float* a_scales = nullptr;      // [m_capacity, intermediate/128]
  const uint8_t* weights = nullptr;     // packed [E, hidden, intermediate] E4M3
  const float* weight_scales = nullptr; // packed [E, hidden/128, intermediate/128]
  const int32_t* expert_offsets = nullptr;  // device [E+1]
  uint16_t* out = nullptr;              // [m_capacity, hidden] BF16 bit patterns
  int64_t m_capacity = 0;
  int num_experts = 0, hidden = 0, intermediate = 0;
  int rows_per_expert_hint = 0;         // expected rows per expert (tile choice only; 0 = unknown)
  Fp8GemmSchedule schedule = Fp8GemmSchedule::kAuto;
  // v11 (docs/grouped_gemm.md "v11", sm90_fp8_wide_grouped_gemm.cuh): 128 x v11_block_n tiles, one wgmma
  // group per warpgroup and k-block, uniform descriptors; bit-identical outputs. Opt-in while measured:
  // 1 = v11, 0 = the v8-v10 kernels, -1 = the environment variable MEGAMOE_FP8_GEMM_V11 ("0" / "1"), else the
  // heuristic sm90::prefer_fp8_v11 (v11 above a mean of 32 rows per expert or for an unknown hint).
  // v11_block_n: 128 or 192; 0 = MEGAMOE_FP8_GEMM_V11_BN ("128" / "192"), else 192.
  int v11 = -1;
  int v11_block_n = 0;
};
void grouped_gemm2_fp8(const GroupedGemm2Fp8Args& args, cudaStream_t stream);

// Plain grouped GEMM with BF16 output, any (n, k) multiples of 128: out[r, n] = sum_k A[r,k] B_e[n,k]
// with the FP8 operands above (role kDown packing, i.e. canonical layout). GEMM 2 is this with
// n = hidden, k = intermediate; exposed for benchmarks and tests of arbitrary shapes.
struct GroupedGemmFp8Args {
  const uint8_t* a = nullptr;           // [m_capacity, k]
  const float* a_scales = nullptr;      // [m_capacity, k/128]
  const uint8_t* weights = nullptr;     // [E, n, k]
  const float* weight_scales = nullptr; // [E, n/128, k/128]
  const int32_t* expert_offsets = nullptr;
  uint16_t* out = nullptr;              // [m_capacity, n] BF16
  int64_t m_capacity = 0;
  int num_experts = 0, n = 0, k = 0;
  int rows_per_expert_hint = 0;         // expected rows per expert (tile choice only; 0 = unknown)
  Fp8GemmSchedule schedule = Fp8GemmSchedule::kAuto;
  int v11 = -1;                         // as GroupedGemm2Fp8Args::v11
  int v11_block_n = 0;                  // as GroupedGemm2Fp8Args::v11_block_n
};
void grouped_gemm_fp8_bf16out(const GroupedGemmFp8Args& args, cudaStream_t stream);

// ---- BF16 x BF16 (src/kernels/sm90_bf16_grouped_gemm.cuh, API in grouped_gemm_bf16.cu) ----------
// Activations bf16 [m_capacity, K] row-major; weights bf16 [E, N, K] K-major in the same packed layout
// as FP8 (pack_expert_weights with kBf16: W13 gate/up interleaved by 128 rows (kGateUp) or by 8 rows
// (kGateUpInterleaved8, the BF16 v2 GEMM-1 kernel), W2 canonical), no scales.
// BF16 v2 (docs/grouped_gemm.md "BF16 v2"): wide 128 x 256 tiles (wgmma m64n256k16) and bulk-store
// epilogues. GEMM 2 / plain: `v2` picks it (-1: MEGAMOE_BF16_GEMM_V2=0/1, else bf16_gemm_v2_default());
// GEMM 1: the weights' `packing` picks it (kGateUpInterleaved8 = v2); bit-identical outputs either way.
// FP32 tensor-core accumulation, no promotion step. Epilogues (docs/reference.md steps 4-6):
//   GEMM 1: out[r, j] = bf16_rn(act(g, u) [* topk_weights[r]]), act in fp32 exactly as the reference
//           orders it: silu (g / (1 + expf(-g))) * u; clamped (gc * (1 / (1 + expf(-(alpha gc))))) * (uc + 1).
//   GEMM 2 / plain: out[r, n] = bf16_rn(acc).
// Same requirements as the FP8 API (H, I, n, k multiples of 128, 16-byte aligned pointers).
struct GroupedGemm1Bf16Args {
  const uint16_t* a = nullptr;          // [m_capacity, hidden] BF16
  const uint16_t* weights = nullptr;    // packed [E, 2*intermediate, hidden] BF16
  const int32_t* expert_offsets = nullptr;  // device [E+1]
  const float* topk_weights = nullptr;  // optional, [m_capacity], one weight per row
  uint16_t* out = nullptr;              // [m_capacity, intermediate] BF16
  int64_t m_capacity = 0;
  int num_experts = 0, hidden = 0, intermediate = 0;
  Activation activation{};
  int rows_per_expert_hint = 0;         // expected rows per expert (tile choice only; 0 = unknown)
  // How `weights` were packed, which picks the kernel: kGateUp = the split-N tiles (v1),
  // kGateUpInterleaved8 = BF16 v2 (split-M 128 x 256, every rows hint). Anything else: megamoe::Error.
  GemmRole packing = GemmRole::kGateUp;
};
void grouped_gemm1_bf16(const GroupedGemm1Bf16Args& args, cudaStream_t stream);

// GEMM 2 (down projection), BF16 out.
struct GroupedGemm2Bf16Args {
  const uint16_t* a = nullptr;          // [m_capacity, intermediate] BF16
  const uint16_t* weights = nullptr;    // [E, hidden, intermediate] BF16
  const int32_t* expert_offsets = nullptr;  // device [E+1]
  uint16_t* out = nullptr;              // [m_capacity, hidden] BF16
  int64_t m_capacity = 0;
  int num_experts = 0, hidden = 0, intermediate = 0;
  int rows_per_expert_hint = 0;
  int v2 = -1;                          // 0: v1 tiles, 1: BF16 v2, -1: MEGAMOE_BF16_GEMM_V2 / the default
};
void grouped_gemm2_bf16(const GroupedGemm2Bf16Args& args, cudaStream_t stream);

// Plain BF16 grouped GEMM, any (n, k) multiples of 128 (GEMM 2 is this with n = hidden, k = intermediate).
struct GroupedGemmBf16Args {
  const uint16_t* a = nullptr;          // [m_capacity, k]
  const uint16_t* weights = nullptr;    // [E, n, k]
  const int32_t* expert_offsets = nullptr;
  uint16_t* out = nullptr;              // [m_capacity, n] BF16
  int64_t m_capacity = 0;
  int num_experts = 0, n = 0, k = 0;
  int rows_per_expert_hint = 0;
  int v2 = -1;                          // as GroupedGemm2Bf16Args::v2
};
void grouped_gemm_bf16(const GroupedGemmBf16Args& args, cudaStream_t stream);

// Whether BF16 v2 is on when not requested per call: the environment variable MEGAMOE_BF16_GEMM_V2
// ("0" / "1"; anything else: megamoe::Error), else the heuristic (sm90_gemm_heuristics.h,
// prefer_bf16_v2). The staged backend packs BF16 W13 with kGateUpInterleaved8 when this is true.
bool bf16_gemm_v2_default();

// ---- W4A8: NVFP4 / MXFP4 weights x FP8 activations (src/kernels/sm90_w4a8_grouped_gemm.cuh, API in
// grouped_gemm_w4a8.cu, layout transform in grouped_gemm_w4a8_layout.cpp, docs/grouped_gemm.md "W4A8") --
// The kernel decodes the FP4 weights to FP8 E4M3 in shared memory inside the mainloop and runs the FP8
// wgmma on them, FP32 accumulation with per-128-K promotion, exactly like the FP8-block path with a
// per-(128 rows x 128 K) weight block factor. The decode is defined per 128x128 weight block B:
//   p(B)      = the largest integer with 6 * max_{scales s in B} |s| * 2^p <= 448 (p = 0 if all are 0)
//               (s = e4m3(group scale) for NVFP4, 2^(e8m0 - 127) for MXFP4)
//   w8[n, k]  = e4m3_rn(e2m1(code[n, k]) * s[n, k / group] * 2^p(B))   (one RNE rounding, never saturates)
//   factor(B) = global(n) * 2^-p(B)   (NVFP4 global of the row's half; MXFP4: 2^-p(B))   (FP32, exact)
//   out[r, n] = sum_kb (sum_{k in kb} e4m3(a[r,k]) * w8[n,k]) * (a_scale[r,kb] * factor(n/128, kb))
// MXFP4: w8 equals e2m1 * scale * 2^p exactly (no rounding) whenever that value is >= 2^-9 (E4M3's
// smallest subnormal), i.e. whenever every scale of a 128x128 block is >= 2^-14 x the block's largest.
// NVFP4: e2m1 x E4M3 scale has up to 6 significant bits, E4M3 keeps 4: w8 is that product rounded to
// nearest even (relative error <= 2^-4; exact when the scale's mantissa is 0, .25 or .5, e.g. power-of-
// two scales). The power of two 2^p keeps the largest |e2m1 * s| of a block in (224, 448], so scales up
// to 448 (6 * 448 = 2688 > 448) never saturate.
//
// Packed layout per expert (made once at load time by pack_w4a8_expert_weights), N = rows in the
// kernel's row order (W13 kGateUp: gate/up interleaved by 128 rows as for FP8; W13 kGateUpInterleaved8: by 8 rows
// inside each 256-row tile, as for FP8 v9 / v11 GEMM 1; W2: canonical), K = cols:
//   data         [N, K/2] bytes: each little-endian 32-bit word holds 8 K-consecutive values v0..v7 with
//                magnitude bits (e2m1 code & 7) of v_i at bits 4i..4i+2 (i < 4) / 16+4(i-4).. (i >= 4) and
//                the sign of v_i at bit 8i+7 (i < 4) / 8(i-4)+3 (i >= 4): one prmt + one lop3 per 4 values.
//   group_scales [K/128, N, 128/group] bytes (NVFP4: 8 E4M3 per row per 128 K; MXFP4: 4 UE8M0), the
//                canonical scale bytes regrouped so that one 128-K slice of a 256-row tile is contiguous.
//   blocks       [N/128, K/128] W4a8BlockScale {factor(B), p(B)}, B the canonical 128-row blocks (W13, both
//                packings: record 2 j = gate block j, 2 j + 1 = up block j).
// Requirements (checked): N % 256 == 0 (the kernel's tiles are 256 columns: GEMM 1 2I, GEMM 2 H),
// K % 128 == 0; NaN group scales (E4M3 0x7F/0xFF, UE8M0 255) are rejected at pack time.
struct W4a8BlockScale {
  float factor = 0.0f;         // FP32 promotion factor of the 128x128 block
  int32_t decode_exponent = 0;  // p: the decoded FP8 value is e2m1 * scale * 2^p
};
struct PackedW4a8Size {
  size_t data_bytes = 0;         // N * K / 2
  size_t group_scale_bytes = 0;  // N * K / group
  size_t block_count = 0;        // (N / 128) * (K / 128)
};
PackedW4a8Size packed_w4a8_size(WeightFormat format, int64_t rows, int64_t cols);
// `canonical`: one expert's kNvfp4 / kMxfp4 matrix (formats.h); outputs are host buffers of the sizes above.
void pack_w4a8_expert_weights(const formats::QuantizedMatrix& canonical, GemmRole role, uint8_t* data_out,
                              uint8_t* group_scales_out, W4a8BlockScale* blocks_out);

// Device pointers to the packed weights of all experts (expert e at e * the per-expert sizes).
struct W4a8Weights {
  WeightFormat format = WeightFormat::kNvfp4;  // kNvfp4 or kMxfp4
  const uint8_t* data = nullptr;               // [E, N, K/2]
  const uint8_t* group_scales = nullptr;       // [E, K/128, N, 128/group]
  const W4a8BlockScale* blocks = nullptr;      // [E, N/128, K/128]
  // GEMM 1 only (the BF16-out GEMMs read kDown packing and ignore it): the role W13 was packed with, kGateUp (the
  // old GEMM-1 kernels) or kGateUpInterleaved8 (W4A8 v10 GEMM 1 at unknown / > 64 rows hints, the small-M kernel's
  // kInterleaved8 mode at hints 1..64; docs/grouped_gemm.md "W4A8 v10 GEMM 1", "W4A8 small-M GEMM 1 on interleaved
  // W13").
  GemmRole packing = GemmRole::kGateUp;
};

// GEMM 1 (gate+up, activation, optional top-k weight, FP8 requant): the FP8 GEMM 1 epilogue, bit for bit
// the same rules (see above), on W4A8 weights.
struct GroupedGemm1W4a8Args {
  const uint8_t* a = nullptr;           // [m_capacity, hidden] E4M3
  const float* a_scales = nullptr;      // [m_capacity, hidden/128]
  W4a8Weights weights;                  // packed W13, N = 2*intermediate, K = hidden
  const int32_t* expert_offsets = nullptr;  // device [E+1]
  const float* topk_weights = nullptr;  // optional, [m_capacity]
  uint8_t* out = nullptr;               // [m_capacity, intermediate] E4M3
  float* out_scales = nullptr;          // [m_capacity, intermediate/128]
  int64_t m_capacity = 0;
  int num_experts = 0, hidden = 0, intermediate = 0;
  Activation activation{};
  int rows_per_expert_hint = 0;
};
void grouped_gemm1_w4a8(const GroupedGemm1W4a8Args& args, cudaStream_t stream);

// GEMM 2 (down projection) on W4A8 weights: BF16 out.
struct GroupedGemm2W4a8Args {
  const uint8_t* a = nullptr;           // [m_capacity, intermediate] E4M3
  const float* a_scales = nullptr;      // [m_capacity, intermediate/128]
  W4a8Weights weights;                  // packed W2, N = hidden, K = intermediate
  const int32_t* expert_offsets = nullptr;
  uint16_t* out = nullptr;              // [m_capacity, hidden] BF16
  int64_t m_capacity = 0;
  int num_experts = 0, hidden = 0, intermediate = 0;
  int rows_per_expert_hint = 0;
};
void grouped_gemm2_w4a8(const GroupedGemm2W4a8Args& args, cudaStream_t stream);

// Plain W4A8 grouped GEMM with BF16 out, n % 256 == 0, k % 128 == 0 (role kDown packing).
struct GroupedGemmW4a8Args {
  const uint8_t* a = nullptr;           // [m_capacity, k]
  const float* a_scales = nullptr;      // [m_capacity, k/128]
  W4a8Weights weights;                  // N = n, K = k
  const int32_t* expert_offsets = nullptr;
  uint16_t* out = nullptr;              // [m_capacity, n] BF16
  int64_t m_capacity = 0;
  int num_experts = 0, n = 0, k = 0;
  int rows_per_expert_hint = 0;
};
void grouped_gemm_w4a8_bf16out(const GroupedGemmW4a8Args& args, cudaStream_t stream);

// The FP4 -> E4M3 decoder of the W4A8 kernels (standalone and fused): 0 = old, 1 = v7, 2 = v8, 3 = auto (the
// default: v8 for MXFP4, old for NVFP4) (sm90::Fp4Decoder), the same bytes (docs/grouped_gemm.md "W4A8 v7 decode",
// "W4A8 v8 decode"). MEGAMOE_W4A8_DECODE = "auto" | "old" | "v7" | "v8" (anything else: megamoe::Error), read once
// per process;
// set_w4a8_decode overrides it (same-process A/B, tests).
int w4a8_decode();
void set_w4a8_decode(int decoder);

// W4A8 v10: the BF16-out W4A8 GEMMs (grouped_gemm2_w4a8, grouped_gemm_w4a8_bf16out) at rows hints > 64 or unknown
// run the 128 x 128 kernel on v11's skeleton (sm90_w4a8_v10_grouped_gemm.cuh; one wgmma group per math warpgroup
// and k-block; the same BF16 bytes as the old 128 x 256 / 64-row kernels). MEGAMOE_W4A8_V10 = "1" (the default,
// also unset or empty) | "0" (the old kernels for every BF16-out launch) (anything else: megamoe::Error), read once
// per process; set_w4a8_v10(0 | 1) overrides it (same-process A/B, tests).
int w4a8_v10();
void set_w4a8_v10(int enabled);

// W4A8 v10 GEMM 1 (docs/grouped_gemm.md "W4A8 v10 GEMM 1"): grouped_gemm1_w4a8 runs the 128 x 256 split-M kernel
// (sm90_w4a8_v10_gemm1.cuh) on W13 packed with kGateUpInterleaved8 (rows hints 1..64: the small-M kernel's
// kInterleaved8 mode instead, unless MEGAMOE_W4A8_SMALL_M=0), the old kernels on kGateUp (W4a8Weights::
// packing picks). w4a8_gemm1_packing() is the W13 packing a loader should use: kGateUpInterleaved8 (the default since
// session 19: "1", unset or empty), kGateUp with MEGAMOE_W4A8_G1_V10 = "0" (anything else: megamoe::Error), read once
// per process; set_w4a8_g1_v10(0 | 1) overrides it. `megamoe bench gemm` follows it, and so does
// staged_gate_up_packing (moe/staged_pipeline.h): the staged backend's W13 and mega's one W13 (its fused W4A8 GEMM 1
// reads either packing); a layer reads it when it is made (docs/grouped_gemm.md "W4A8 2-warpgroup GEMM 1 on
// interleaved W13 and the v10 GEMM 1 TMA store: outcome").
int w4a8_g1_v10();
void set_w4a8_g1_v10(int enabled);
GemmRole w4a8_gemm1_packing();

}  // namespace megamoe::kernels
