// Launcher and typed validating API of the W4A8 grouped GEMMs (grouped_gemm.h, "W4A8"; kernel in
// sm90_w4a8_grouped_gemm.cuh): checks, TMA descriptors, tile and stage choice, launch.
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <string>

#include "kernels/grouped_gemm.h"
#include "kernels/grouped_gemm_internal.h"
#include "kernels/sm90_w4a8_grouped_gemm.cuh"
#include "kernels/sm90_w4a8_small_m_grouped_gemm.cuh"
#include "kernels/sm90_w4a8_v10_gemm1.cuh"
#include "kernels/sm90_w4a8_v10_grouped_gemm.cuh"
#include "megamoe/error_cuda.h"

namespace megamoe::kernels {
namespace {

using sm90::Fp4Format;
using sm90::W4a8Epilogue;
using sm90::W4a8GemmParams;

static_assert(sizeof(W4a8BlockScale) == sizeof(sm90::W4a8BlockScaleDevice) &&
                  offsetof(W4a8BlockScale, decode_exponent) == offsetof(sm90::W4a8BlockScaleDevice, decode_exponent),
              "host and device block scale records must match");

constexpr int kSharedMemoryLimit = 227 * 1024;

// The most stages (<= 6) whose shared memory, with the tile table of kMaxExperts experts, fits; One = the
// kernel's layout at one stage (per stage: operands + 2 mbarriers + the scale slot rounded up to 16 bytes,
// an over-estimate).
template <class One>
constexpr int max_stages() {
  constexpr int kPerStage = One::kABytes + One::kFp4Bytes + One::kScaleBytes + 16 + One::kScaleRingBytes;
  int stages = 1;
  while (stages < 6 && One::shared_bytes(sm90::kMaxExperts) + stages * kPerStage <= kSharedMemoryLimit) ++stages;
  return stages;
}

// Tensor maps, shared memory and the launch of a standalone W4A8 kernel with layout Layout; extra_maps (v10's out
// map) go between the B map and the parameters.
template <class Layout, class Kernel, class... ExtraMaps>
void launch_kernel(Kernel* kernel, int threads, const uint8_t* a, const uint8_t* weight_data,
                   const W4a8GemmParams& params, cudaStream_t stream, const ExtraMaps&... extra_maps) {
  static_assert(Layout::shared_bytes(sm90::kMaxExperts) <= kSharedMemoryLimit, "W4A8 config overflows shared memory");
  const CUtensorMap a_map = detail::make_grouped_gemm_tensor_map(a, params.k, params.m_capacity, Layout::kBlockM);
  const CUtensorMap b_map = detail::make_byte_tensor_map(
      weight_data, params.k / 2, static_cast<uint64_t>(params.num_experts) * params.n, sm90::kW4a8Fp4RowBytes,
      Layout::kBlockN, CU_TENSOR_MAP_SWIZZLE_64B);
  const int shared_bytes = Layout::shared_bytes(params.num_experts);
  MEGAMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
  kernel<<<detail::grouped_gemm_sm_count(), threads, shared_bytes, stream>>>(a_map, b_map, extra_maps..., params);
  MEGAMOE_LAUNCH_CHECK();
}

template <int kSubTilesM, Fp4Format kFormat, W4a8Epilogue kEpilogue>
void launch(const uint8_t* a, const uint8_t* weight_data, const W4a8GemmParams& params, cudaStream_t stream) {
  constexpr int kStages = max_stages<sm90::W4a8StandaloneLayout<kSubTilesM, 1, kFormat, kEpilogue>>();
  launch_kernel<sm90::W4a8StandaloneLayout<kSubTilesM, kStages, kFormat, kEpilogue>>(
      &sm90::sm90_w4a8_grouped_gemm_kernel<kSubTilesM, kStages, kFormat, kEpilogue>, sm90::kThreadsPerCta, a,
      weight_data, params, stream);
}

// The small-M kernel (64-row tiles, four math warpgroups); kInterleaved8: GEMM 1 on W13 packed
// kGateUpInterleaved8 (in-thread SwiGLU).
template <Fp4Format kFormat, W4a8Epilogue kEpilogue, bool kInterleaved8 = false>
void launch_small_m(const uint8_t* a, const uint8_t* weight_data, const W4a8GemmParams& params, cudaStream_t stream) {
  constexpr int kStages = max_stages<sm90::W4a8SmallMLayout<1, kFormat, kEpilogue, kInterleaved8>>();
  launch_kernel<sm90::W4a8SmallMLayout<kStages, kFormat, kEpilogue, kInterleaved8>>(
      &sm90::sm90_w4a8_small_m_grouped_gemm_kernel<kStages, kFormat, kEpilogue, kInterleaved8>,
      sm90::kW4a8SmallThreadsPerCta, a, weight_data, params, stream);
}

// W4A8 v10: the 128 x 128 v11-skeleton kernel (BF16 out only; docs/grouped_gemm.md "W4A8 v10").
template <Fp4Format kFormat>
void launch_v10(const uint8_t* a, const uint8_t* weight_data, const W4a8GemmParams& params, cudaStream_t stream) {
  constexpr int kStages = max_stages<sm90::W4a8V10Layout<1, kFormat>>();
  static_assert(kStages == sm90::kW4a8V10Stages, "the shared-memory budget in sm90_w4a8_v10_grouped_gemm.cuh's NOTES");
  using Layout = sm90::W4a8V10Layout<kStages, kFormat>;
  // store_bf16_epilogue_tma's out map: out [m_capacity, n] BF16 as bytes, boxes of 128 bytes x kOutMapRows rows.
  const CUtensorMap out_map = detail::make_byte_tensor_map(params.out, static_cast<uint64_t>(params.n) * 2,
                                                           params.m_capacity, 128, Layout::kOutMapRows,
                                                           CU_TENSOR_MAP_SWIZZLE_128B);
  launch_kernel<Layout>(&sm90::sm90_w4a8_v10_grouped_gemm_kernel<kStages, kFormat>, sm90::kThreadsPerCta, a,
                        weight_data, params, stream, out_map);
}

// W4A8 v10 GEMM 1: the 128 x 256 split-M kernel on W13 packed kGateUpInterleaved8 (docs/grouped_gemm.md "W4A8 v10
// GEMM 1").
template <Fp4Format kFormat>
void launch_v10_gemm1(const uint8_t* a, const uint8_t* weight_data, const W4a8GemmParams& params, cudaStream_t stream) {
  constexpr int kStages = max_stages<sm90::W4a8V10Gemm1Layout<1, kFormat>>();
  static_assert(kStages == sm90::kW4a8V10Gemm1Stages, "the shared-memory budget in sm90_w4a8_v10_gemm1.cuh's NOTES");
  using Layout = sm90::W4a8V10Gemm1Layout<kStages, kFormat>;
  // The rows epilogue's TMA-store out map: out E4M3 [m_capacity, n / 2] as bytes, boxes of 128 bytes x kOutMapRows.
  const CUtensorMap out_map = detail::make_byte_tensor_map(params.out, static_cast<uint64_t>(params.n) / 2,
                                                           params.m_capacity, 128, Layout::kOutMapRows,
                                                           CU_TENSOR_MAP_SWIZZLE_128B);
  launch_kernel<Layout>(&sm90::sm90_w4a8_v10_gemm1_kernel<kStages, kFormat>, sm90::kThreadsPerCta, a, weight_data,
                        params, stream, out_map);
}

// -1: not read yet; else 0 or 1 (MEGAMOE_W4A8_V10; unset or empty = 1).
std::atomic<int> g_w4a8_v10{-1};
// -1: not read yet; else 0 or 1 (MEGAMOE_W4A8_G1_V10; unset or empty = 1 since session 19).
std::atomic<int> g_w4a8_g1_v10{-1};

// A switch read from the environment once per process into `cell` (-1: not read yet), unless an override (set_w4a8_*)
// stored a value first. parse maps the variable's text (empty when unset) to the value, raising megamoe::Error on a
// text it does not accept.
template <class Parse>
int read_switch_once(std::atomic<int>& cell, const char* name, Parse parse) {
  int value = cell.load(std::memory_order_relaxed);
  if (value < 0) {
    const char* env = std::getenv(name);
    value = parse(std::string(env ? env : ""));
    int expected = -1;
    if (!cell.compare_exchange_strong(expected, value)) value = expected;  // an override won
  }
  return value;
}

// The v10 kernel takes a BF16-out launch (GEMM 2 / plain) when enabled (w4a8_v10() == 1, the default), the rows
// hint is unknown (<= 0) or above one 64-row tile (hints <= 64 keep the old kernels' 64-row tiles, whose choice
// choose_w4a8_sub_tiles makes), and n splits into 128-row tiles. V10=0 keeps the old 128 x 256 / 64-row kernels
// for every BF16-out launch.
// Why the default (H200, docs/grouped_gemm.md "W4A8 v10"): against the old kernels v10 is bit-identical and
// 1.00-1.13x as fast at 512-4096 rows per expert (dsv3 / ms4 1.00-1.06x, qwen3-30b 1.07-1.13x, GEMM 2 nvfp4 and
// mxfp4), and 0.996-1.25x at 128 / 256 rows (exact and multinomial means; dsv3 0.996-1.10x, qwen3-30b 1.07-1.25x;
// session 17 call 7). Hints <= 64 were not compared (the old kernels' 64-row tiles keep them).
bool use_v10_kernel(int rows_hint, int n) {
  return w4a8_v10() == 1 && (rows_hint <= 0 || rows_hint > 64) && n % sm90::kW4a8V10BlockN == 0;
}

// Which 64-row W4A8 tiles run the small-M kernel (four math warpgroups, v4). Measured against the
// 2-warpgroup kernel in one call (docs/grouped_gemm.md "W4A8 v4"): GEMM 1 (SwiGLU epilogue) +2..+16% at
// 8-128 rows, GEMM 2 / plain (BF16 out) -1..-8%. So by default GEMM 1 only; MEGAMOE_W4A8_SMALL_M=1 takes
// it for both, =0 for neither (A/B runs; read per call, as MEGAMOE_FP8_GEMM_SCHEDULE).
// Session 11: with the spread SwiGLU epilogue (tiles of <= kW4a8SpreadRows rows) the 2-warpgroup kernel
// beats the small-M one on GEMM 1 up to 32 rows per expert (dsv3 nvfp4 8 / 16 / 32 rows: 230 / 234 / 252 vs
// 255 / 250 / 252 µs; qwen3-30b 45 / 47 / 51 vs 54 / 51 / 52; docs/perf.md "Session 11"), so auto keeps GEMM 1
// on the 2-warpgroup kernel for rows hints 1..32 while the spread epilogue is on.
bool use_small_m_kernel(W4a8Epilogue epilogue, int rows_hint, bool swiglu_spread) {
  const char* value = std::getenv("MEGAMOE_W4A8_SMALL_M");
  const std::string text = value ? value : "";
  if (text.empty() || text == "auto")
    return epilogue == W4a8Epilogue::kSwigluQuantFp8 &&
           !(rows_hint >= 1 && rows_hint <= sm90::kW4a8SpreadRows && swiglu_spread);
  MEGAMOE_CHECK(text == "0" || text == "1", "MEGAMOE_W4A8_SMALL_M = '", text, "' must be auto, 0 or 1");
  return text == "1";
}

// GEMM 1 on W13 packed kGateUpInterleaved8 at rows hints 1..32 with the spread epilogue on and
// MEGAMOE_W4A8_SMALL_M unset / auto: the 2-warpgroup kernel's kSwigluInterleavedFp8 mode, exactly where
// use_small_m_kernel sends the kGateUp GEMM 1 to the 2-warpgroup kernel (session 19: at 8-16 rows the small-M
// kInterleaved8 mode measured 0.91-0.96x of the 2-warpgroup kGateUp kernel; docs/grouped_gemm.md "W4A8 2-warpgroup
// GEMM 1 on interleaved W13 (session 19)").
bool use_two_warpgroup_interleaved(int rows_hint, bool swiglu_spread) {
  if (rows_hint < 1 || rows_hint > sm90::kW4a8SpreadRows || !swiglu_spread) return false;
  const char* value = std::getenv("MEGAMOE_W4A8_SMALL_M");
  const std::string text = value ? value : "";
  return text.empty() || text == "auto";
}

// GEMM 1 on W13 packed kGateUpInterleaved8: the small-M kernel's kInterleaved8 mode for rows hints 1..64 (one
// 64-row tile per expert at most: 8-64 rows per expert are decode-bound, where the small-M kernel's 512 decode
// threads per 64 x 256 tile beat v10 GEMM 1's 256 per 128 x 256 tile; docs/grouped_gemm.md "W4A8 small-M GEMM 1 on
// interleaved W13"), v10 GEMM 1 for unknown (<= 0) or larger hints. MEGAMOE_W4A8_SMALL_M=0 keeps v10 GEMM 1 at
// every hint (A/B runs; read per call as use_small_m_kernel; auto and 1 take the small-M mode). Since session 19 auto
// first gives hints 1..32 with the spread epilogue on to the 2-warpgroup kernel (use_two_warpgroup_interleaved); 1
// keeps the small-M mode at 1..64.
bool use_small_m_interleaved(int rows_hint) {
  if (rows_hint < 1 || rows_hint > 64) return false;
  const char* value = std::getenv("MEGAMOE_W4A8_SMALL_M");
  const std::string text = value ? value : "";
  if (text.empty() || text == "auto") return true;
  MEGAMOE_CHECK(text == "0" || text == "1", "MEGAMOE_W4A8_SMALL_M = '", text, "' must be auto, 0 or 1");
  return text == "1";
}

template <W4a8Epilogue kEpilogue>
void dispatch(WeightFormat format, int sub_tiles, int rows_hint, const uint8_t* a, const uint8_t* data,
              const W4a8GemmParams& params, cudaStream_t stream) {
  const bool nvfp4 = format == WeightFormat::kNvfp4;
  if (sub_tiles == 1 && use_small_m_kernel(kEpilogue, rows_hint, params.swiglu_spread)) {
    if (nvfp4) launch_small_m<Fp4Format::kNvfp4, kEpilogue>(a, data, params, stream);
    else launch_small_m<Fp4Format::kMxfp4, kEpilogue>(a, data, params, stream);
  } else if (sub_tiles == 1) {
    if (nvfp4) launch<1, Fp4Format::kNvfp4, kEpilogue>(a, data, params, stream);
    else launch<1, Fp4Format::kMxfp4, kEpilogue>(a, data, params, stream);
  } else {
    if (nvfp4) launch<2, Fp4Format::kNvfp4, kEpilogue>(a, data, params, stream);
    else launch<2, Fp4Format::kMxfp4, kEpilogue>(a, data, params, stream);
  }
}

// gemm1: W13, packed kGateUp or kGateUpInterleaved8. The BF16-out GEMMs read kDown-packed weights and ignore
// `packing` (W4a8Weights' default is W13's kGateUp: callers of GEMM 2 never set it).
void check_weights(const W4a8Weights& w, bool gemm1) {
  MEGAMOE_CHECK(w.format == WeightFormat::kNvfp4 || w.format == WeightFormat::kMxfp4, "weights.format = ",
                weight_format_name(w.format), " must be nvfp4 or mxfp4");
  if (gemm1)
    MEGAMOE_CHECK(w.packing == GemmRole::kGateUp || w.packing == GemmRole::kGateUpInterleaved8, "weights.packing = ",
                  static_cast<int>(w.packing), " must be kGateUp or kGateUpInterleaved8 for W4A8 GEMM 1");
  detail::check_grouped_gemm_pointer(w.data, "weights.data");
  detail::check_grouped_gemm_pointer(w.group_scales, "weights.group_scales");
  detail::check_grouped_gemm_pointer(w.blocks, "weights.blocks");
}

void check_n(int n, const char* n_name) {
  MEGAMOE_CHECK(n % sm90::kW4a8BlockN == 0, n_name, " = ", n, " must be a multiple of ", sm90::kW4a8BlockN,
                " for W4A8 weights");
}

W4a8GemmParams base_params(const float* a_scales, const W4a8Weights& w, const int32_t* offsets, void* out,
                           int64_t m_capacity, int num_experts, int n, int k) {
  W4a8GemmParams params;
  params.a_scales = a_scales;
  params.group_scales = w.group_scales;
  params.blocks = reinterpret_cast<const sm90::W4a8BlockScaleDevice*>(w.blocks);
  params.expert_offsets = offsets;
  params.out = out;
  params.m_capacity = static_cast<int>(m_capacity);
  params.num_experts = num_experts;
  params.n = n;
  params.k = k;
  params.decoder = w4a8_decode();
  return params;
}

// -1: not read yet; else sm90::Fp4Decoder (0 old, 1 v7, 2 v8, 3 auto).
std::atomic<int> g_w4a8_decode{-1};

void launch_plain(const uint8_t* a, const float* a_scales, const W4a8Weights& w, const int32_t* offsets, uint16_t* out,
                  int64_t m_capacity, int num_experts, int n, int k, int rows_hint, const char* n_name,
                  const char* k_name, cudaStream_t stream) {
  detail::check_grouped_gemm_shape(m_capacity, num_experts, n, k, n_name, k_name);
  check_n(n, n_name);
  check_weights(w, false);
  detail::check_grouped_gemm_pointer(a, "a");
  detail::check_grouped_gemm_pointer(a_scales, "a_scales");
  detail::check_grouped_gemm_pointer(offsets, "expert_offsets");
  detail::check_grouped_gemm_pointer(out, "out");
  const W4a8GemmParams params = base_params(a_scales, w, offsets, out, m_capacity, num_experts, n, k);
  if (use_v10_kernel(rows_hint, n)) {
    if (w.format == WeightFormat::kNvfp4) launch_v10<Fp4Format::kNvfp4>(a, w.data, params, stream);
    else launch_v10<Fp4Format::kMxfp4>(a, w.data, params, stream);
    return;
  }
  const int sub_tiles = sm90::choose_w4a8_sub_tiles(rows_hint, num_experts, n, detail::grouped_gemm_sm_count());
  dispatch<W4a8Epilogue::kStoreBf16>(w.format, sub_tiles, rows_hint, a, w.data, params, stream);
}

}  // namespace

int w4a8_decode() {
  return read_switch_once(g_w4a8_decode, "MEGAMOE_W4A8_DECODE", [](const std::string& text) {
    MEGAMOE_CHECK(text.empty() || text == "auto" || text == "old" || text == "v7" || text == "v8",
                  "MEGAMOE_W4A8_DECODE = '", text, "' must be auto, old, v7 or v8");
    return text == "old" ? 0 : text == "v7" ? 1 : text == "v8" ? 2 : 3;
  });
}

void set_w4a8_decode(int decoder) {
  MEGAMOE_CHECK(decoder >= 0 && decoder <= 3, "W4A8 decoder ", decoder, " must be 0 (old), 1 (v7), 2 (v8) or 3 (auto)");
  g_w4a8_decode.store(decoder);
}

int w4a8_v10() {
  return read_switch_once(g_w4a8_v10, "MEGAMOE_W4A8_V10", [](const std::string& text) {
    MEGAMOE_CHECK(text.empty() || text == "0" || text == "1", "MEGAMOE_W4A8_V10 = '", text, "' must be 0 or 1");
    return text == "0" ? 0 : 1;
  });
}

void set_w4a8_v10(int enabled) {
  MEGAMOE_CHECK(enabled == 0 || enabled == 1, "W4A8 v10 switch ", enabled, " must be 0 or 1");
  g_w4a8_v10.store(enabled);
}

int w4a8_g1_v10() {
  return read_switch_once(g_w4a8_g1_v10, "MEGAMOE_W4A8_G1_V10", [](const std::string& text) {
    MEGAMOE_CHECK(text.empty() || text == "0" || text == "1", "MEGAMOE_W4A8_G1_V10 = '", text, "' must be 0 or 1");
    return text == "0" ? 0 : 1;
  });
}

void set_w4a8_g1_v10(int enabled) {
  MEGAMOE_CHECK(enabled == 0 || enabled == 1, "W4A8 v10 GEMM-1 switch ", enabled, " must be 0 or 1");
  g_w4a8_g1_v10.store(enabled);
}

GemmRole w4a8_gemm1_packing() { return w4a8_g1_v10() == 1 ? GemmRole::kGateUpInterleaved8 : GemmRole::kGateUp; }

void grouped_gemm_w4a8_bf16out(const GroupedGemmW4a8Args& args, cudaStream_t stream) {
  launch_plain(args.a, args.a_scales, args.weights, args.expert_offsets, args.out, args.m_capacity, args.num_experts,
               args.n, args.k, args.rows_per_expert_hint, "n", "k", stream);
}

void grouped_gemm2_w4a8(const GroupedGemm2W4a8Args& args, cudaStream_t stream) {
  launch_plain(args.a, args.a_scales, args.weights, args.expert_offsets, args.out, args.m_capacity, args.num_experts,
               args.hidden, args.intermediate, args.rows_per_expert_hint, "hidden", "intermediate", stream);
}

void grouped_gemm1_w4a8(const GroupedGemm1W4a8Args& args, cudaStream_t stream) {
  detail::check_grouped_gemm_shape(args.m_capacity, args.num_experts, 2 * args.intermediate, args.hidden,
                                   "2*intermediate", "hidden");
  MEGAMOE_CHECK(args.intermediate % 128 == 0, "intermediate = ", args.intermediate, " must be a multiple of 128");
  check_weights(args.weights, true);
  detail::check_grouped_gemm_pointer(args.a, "a");
  detail::check_grouped_gemm_pointer(args.a_scales, "a_scales");
  detail::check_grouped_gemm_pointer(args.expert_offsets, "expert_offsets");
  detail::check_grouped_gemm_pointer(args.out, "out");
  detail::check_grouped_gemm_pointer(args.out_scales, "out_scales");
  const bool clamped = args.activation.kind == Activation::Kind::kSwigluClamped;
  if (clamped) {
    MEGAMOE_CHECK(args.activation.limit > 0.0f, "activation.limit = ", args.activation.limit, " must be > 0");
    MEGAMOE_CHECK(args.activation.alpha > 0.0f, "activation.alpha = ", args.activation.alpha, " must be > 0");
  }
  W4a8GemmParams params = base_params(args.a_scales, args.weights, args.expert_offsets, args.out, args.m_capacity,
                                      args.num_experts, 2 * args.intermediate, args.hidden);
  params.topk_weights = args.topk_weights;
  params.out_scales = args.out_scales;
  params.activation = clamped ? 1 : 0;
  params.limit = args.activation.limit;
  params.alpha = args.activation.alpha;
  params.swiglu_spread = detail::swiglu_spread_enabled();
  if (args.weights.packing == GemmRole::kGateUpInterleaved8 &&
      use_two_warpgroup_interleaved(args.rows_per_expert_hint, params.swiglu_spread)) {
    if (args.weights.format == WeightFormat::kNvfp4)
      launch<1, Fp4Format::kNvfp4, W4a8Epilogue::kSwigluInterleavedFp8>(args.a, args.weights.data, params, stream);
    else
      launch<1, Fp4Format::kMxfp4, W4a8Epilogue::kSwigluInterleavedFp8>(args.a, args.weights.data, params, stream);
    return;
  }
  if (args.weights.packing == GemmRole::kGateUpInterleaved8 && use_small_m_interleaved(args.rows_per_expert_hint)) {
    if (args.weights.format == WeightFormat::kNvfp4)
      launch_small_m<Fp4Format::kNvfp4, W4a8Epilogue::kSwigluQuantFp8, true>(args.a, args.weights.data, params, stream);
    else
      launch_small_m<Fp4Format::kMxfp4, W4a8Epilogue::kSwigluQuantFp8, true>(args.a, args.weights.data, params, stream);
    return;
  }
  if (args.weights.packing == GemmRole::kGateUpInterleaved8) {  // W4A8 v10 GEMM 1 (unknown or > 64 rows hints)
    MEGAMOE_CHECK(params.n % sm90::kW4a8V10Gemm1BlockN == 0, "2*intermediate = ", params.n, " must be a multiple of ",
                  sm90::kW4a8V10Gemm1BlockN, " for W4A8 v10 GEMM 1");
    if (args.weights.format == WeightFormat::kNvfp4)
      launch_v10_gemm1<Fp4Format::kNvfp4>(args.a, args.weights.data, params, stream);
    else
      launch_v10_gemm1<Fp4Format::kMxfp4>(args.a, args.weights.data, params, stream);
    return;
  }
  const int sub_tiles = sm90::choose_w4a8_sub_tiles(args.rows_per_expert_hint, args.num_experts, params.n,
                                                    detail::grouped_gemm_sm_count());
  dispatch<W4a8Epilogue::kSwigluQuantFp8>(args.weights.format, sub_tiles, args.rows_per_expert_hint, args.a,
                                          args.weights.data, params, stream);
}

}  // namespace megamoe::kernels
