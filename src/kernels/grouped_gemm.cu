// Typed validating API of the grouped GEMMs (grouped_gemm.h): checks, TMA descriptors, launch.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdlib>
#include <string>

#include "kernels/grouped_gemm.h"
#include "kernels/grouped_gemm_internal.h"
#include "kernels/sm90_fp8_grouped_gemm.cuh"
#include "megamoe/error_cuda.h"

namespace megamoe::kernels {
namespace {

using sm90::Epilogue;
using sm90::GroupedGemmParams;

// 2D uint8 tensor map [outer, inner] (inner contiguous) read in boxes of [box_outer, 128 bytes] with
// the 128-byte swizzle the wgmma descriptors expect. Out-of-range rows read as zeros.
// NOTES: the driver entry point is looked up through the runtime instead of linking libcuda, so
// that binaries (and gtest discovery in CI) load on machines without a GPU driver.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult query{};
    MEGAMOE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                        cudaEnableDefault, &query));
    MEGAMOE_CHECK(fn != nullptr && query == cudaDriverEntryPointSuccess,
                  "driver entry point cuTensorMapEncodeTiled not found (driver too old?)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

CUtensorMap make_tensor_map(const void* base, uint64_t inner, uint64_t outer, uint32_t box_outer,
                            uint32_t box_inner = sm90::kBlockK, CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {inner, outer};
  const cuuint64_t strides[1] = {inner};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult status = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) {
    MEGAMOE_FAIL("cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(status), ") for a [", outer, ", ", inner,
                 "] tensor with box rows ", box_outer);
  }
  return map;
}

int current_device_attribute(cudaDeviceAttr attribute) {
  int device = 0;
  MEGAMOE_CUDA_CHECK(cudaGetDevice(&device));
  int value = 0;
  MEGAMOE_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}
int multiprocessor_count() { return current_device_attribute(cudaDevAttrMultiProcessorCount); }

template <sm90::TileConfig kTile, Epilogue kEpilogue, sm90::MathSchedule kSchedule>
void launch(const uint8_t* a, const uint8_t* weights, const GroupedGemmParams& params, cudaStream_t stream) {
  using Layout = sm90::StandaloneFp8Layout<kTile.warpgroups_m, kTile.sub_tiles_m, kTile.stages, kEpilogue, kSchedule>;
  // Every config fits at kMaxExperts (staging rows and scale ring included).
  static_assert(Layout::shared_bytes(sm90::kMaxExperts) <= sm90::kSharedBytesPerCta,
                "grouped GEMM tile config overflows 227 KiB of shared memory at kMaxExperts");
  static_assert(Layout::kBlockM == kTile.block_m() && Layout::kBlockN == kTile.block_n(), "tile config vs layout");
  // Both epilogues copy row pieces (BF16 256 bytes, FP8 128 bytes) with cp.async.bulk: 16-byte aligned
  // addresses (rows are n or n / 2 bytes apart, n a multiple of 128).
  MEGAMOE_CHECK(reinterpret_cast<uintptr_t>(params.out) % 16 == 0 && params.n % 128 == 0,
                "bulk-store epilogue: out must be 16-byte aligned and n = ", params.n, " a multiple of 128");
  const CUtensorMap a_map = make_tensor_map(a, params.k, params.m_capacity, sm90::kATrimRows);  // 64-row chunks
  const CUtensorMap b_map =
      make_tensor_map(weights, params.k, static_cast<uint64_t>(params.num_experts) * params.n, Layout::kBlockN);
  const int shared_bytes = Layout::shared_bytes(params.num_experts);
  const int shared_limit = current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  MEGAMOE_CHECK(shared_bytes <= shared_limit, "grouped GEMM ", Layout::kBlockM, "x", Layout::kBlockN, " tile with ",
                kTile.stages, " stages needs ", shared_bytes, " bytes of shared memory for num_experts = ",
                params.num_experts, ", more than the device's ", shared_limit, " per block");
  auto* kernel =
      &sm90::sm90_fp8_grouped_gemm_kernel<kTile.warpgroups_m, kTile.sub_tiles_m, kTile.stages, kEpilogue, kSchedule>;
  MEGAMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
  kernel<<<multiprocessor_count(), sm90::kThreadsPerCta, shared_bytes, stream>>>(a_map, b_map, params);
  MEGAMOE_LAUNCH_CHECK();
}

// One instantiation per schedule, so both run side by side in one binary (bench --variant both).
template <sm90::TileConfig kTile, Epilogue kEpilogue>
void launch(const uint8_t* a, const uint8_t* weights, const GroupedGemmParams& params, sm90::MathSchedule schedule,
            cudaStream_t stream) {
  if (schedule == sm90::MathSchedule::kOrderedIssue)
    launch<kTile, kEpilogue, sm90::MathSchedule::kOrderedIssue>(a, weights, params, stream);
  else if (schedule == sm90::MathSchedule::kHalfOverlap)
    launch<kTile, kEpilogue, sm90::MathSchedule::kHalfOverlap>(a, weights, params, stream);
  else
    launch<kTile, kEpilogue, sm90::MathSchedule::kSerial>(a, weights, params, stream);
}

// kAuto: MEGAMOE_FP8_GEMM_SCHEDULE if set (read per call: a getenv is small next to a launch, and a
// process can switch), else the heuristic.
sm90::MathSchedule resolve_schedule(Fp8GemmSchedule requested, int rows_hint) {
  if (requested == Fp8GemmSchedule::kSerial) return sm90::MathSchedule::kSerial;
  if (requested == Fp8GemmSchedule::kPingPong) return sm90::MathSchedule::kOrderedIssue;
  if (requested == Fp8GemmSchedule::kOverlap) return sm90::MathSchedule::kHalfOverlap;
  MEGAMOE_CHECK(requested == Fp8GemmSchedule::kAuto, "schedule = ", static_cast<int>(requested),
                " must be kAuto, kSerial, kPingPong or kOverlap");
  const Fp8GemmSchedule from_env = [] {
    const char* value = std::getenv("MEGAMOE_FP8_GEMM_SCHEDULE");
    const std::string text = value ? value : "";
    if (text.empty() || text == "auto") return Fp8GemmSchedule::kAuto;
    if (text == "serial") return Fp8GemmSchedule::kSerial;
    if (text == "pingpong") return Fp8GemmSchedule::kPingPong;
    if (text == "overlap") return Fp8GemmSchedule::kOverlap;
    MEGAMOE_FAIL("MEGAMOE_FP8_GEMM_SCHEDULE = '", text, "' must be auto, serial, pingpong or overlap");
  }();
  if (from_env != Fp8GemmSchedule::kAuto) return resolve_schedule(from_env, rows_hint);
  return sm90::choose_math_schedule(rows_hint);
}

// Tail-trimmed A loads (GroupedGemmParams::a_tail_trim, produce_fp8_tile_trimmed): on unless
// MEGAMOE_FP8_A_TAIL_TRIM=0 (read per call, as MEGAMOE_FP8_GEMM_SCHEDULE; 0 = every 64-row chunk of the
// tile, the bytes the kernels before session 10 loaded as one box, for A/B runs).
bool resolve_a_tail_trim() { return detail::env_switch("MEGAMOE_FP8_A_TAIL_TRIM", true); }

void check_aligned(const void* pointer, const char* field) {
  MEGAMOE_CHECK(pointer != nullptr, field, " must be non-null");
  MEGAMOE_CHECK(reinterpret_cast<uintptr_t>(pointer) % 16 == 0, field, " must be 16-byte aligned");
}

void check_common(int64_t m_capacity, int num_experts, int n, int k, const char* n_name, const char* k_name) {
  MEGAMOE_CHECK(m_capacity > 0 && m_capacity < (int64_t{1} << 31), "m_capacity = ", m_capacity,
                " must be in [1, 2^31)");
  MEGAMOE_CHECK(num_experts >= 1 && num_experts <= sm90::kMaxExperts, "num_experts = ", num_experts,
                " must be in [1, ", sm90::kMaxExperts, "]");
  MEGAMOE_CHECK(n > 0 && n % 128 == 0, n_name, " = ", n, " must be a positive multiple of 128");
  MEGAMOE_CHECK(k > 0 && k % 128 == 0, k_name, " = ", k, " must be a positive multiple of 128");
  MEGAMOE_CHECK(static_cast<int64_t>(num_experts) * n < (int64_t{1} << 31), "num_experts * ", n_name, " = ",
                static_cast<int64_t>(num_experts) * n, " must be < 2^31");
}

// v11 selection (GroupedGemm2Fp8Args::v11 / v11_block_n; sm90::resolve_v11_block_n): the request, else the
// environment (read per call, as MEGAMOE_FP8_GEMM_SCHEDULE).
int resolve_v11_block_n(int v11, int block_n, int rows_hint, int num_experts, int n) {
  const char* env_v11 = std::getenv("MEGAMOE_FP8_GEMM_V11");
  const char* env_bn = std::getenv("MEGAMOE_FP8_GEMM_V11_BN");
  const int resolved =
      sm90::resolve_v11_block_n(v11, block_n, env_v11, env_bn, sm90::prefer_fp8_v11(rows_hint, num_experts, n));
  MEGAMOE_CHECK(resolved >= 0, "v11 = ", v11, ", v11_block_n = ", block_n, " (MEGAMOE_FP8_GEMM_V11 = '",
                env_v11 ? env_v11 : "", "', MEGAMOE_FP8_GEMM_V11_BN = '", env_bn ? env_bn : "",
                "'): v11 must be -1, 0 or 1 (the variable 0 or 1), the block width 0, 128 or 192 (the variable 128 or 192)");
  return resolved;
}

void launch_plain(const uint8_t* a, const float* a_scales, const uint8_t* weights, const float* weight_scales,
                  const int32_t* offsets, uint16_t* out, int64_t m_capacity, int num_experts, int n, int k,
                  int rows_hint, Fp8GemmSchedule requested, int v11, int v11_block_n, cudaStream_t stream) {
  if (const int block_n = resolve_v11_block_n(v11, v11_block_n, rows_hint, num_experts, n); block_n != 0) {
    detail::launch_fp8_v11(a, a_scales, weights, weight_scales, offsets, out, m_capacity, num_experts, n, k, block_n,
                           stream);
    return;
  }
  GroupedGemmParams params;
  params.a_scales = a_scales;
  params.b_scales = weight_scales;
  params.expert_offsets = offsets;
  params.out = out;
  params.m_capacity = static_cast<int>(m_capacity);
  params.num_experts = num_experts;
  params.n = n;
  params.k = k;
  params.a_tail_trim = resolve_a_tail_trim();
  const sm90::TileConfig tile = sm90::choose_plain_tile(rows_hint);
  const sm90::MathSchedule schedule = resolve_schedule(requested, rows_hint);
  if (tile.warpgroups_m == 1 && n % 256 == 0)
    launch<sm90::kSplitNSmall, Epilogue::kStoreBf16>(a, weights, params, schedule, stream);
  else if (tile.sub_tiles_m == 1)
    launch<sm90::kSplitMSmall, Epilogue::kStoreBf16>(a, weights, params, schedule, stream);
  else
    launch<sm90::kSplitMLarge, Epilogue::kStoreBf16>(a, weights, params, schedule, stream);
}

}  // namespace

void grouped_gemm_fp8_bf16out(const GroupedGemmFp8Args& args, cudaStream_t stream) {
  check_common(args.m_capacity, args.num_experts, args.n, args.k, "n", "k");
  check_aligned(args.a, "a");
  check_aligned(args.a_scales, "a_scales");
  check_aligned(args.weights, "weights");
  check_aligned(args.weight_scales, "weight_scales");
  check_aligned(args.expert_offsets, "expert_offsets");
  check_aligned(args.out, "out");
  launch_plain(args.a, args.a_scales, args.weights, args.weight_scales, args.expert_offsets, args.out,
               args.m_capacity, args.num_experts, args.n, args.k, args.rows_per_expert_hint, args.schedule, args.v11,
               args.v11_block_n, stream);
}

void grouped_gemm2_fp8(const GroupedGemm2Fp8Args& args, cudaStream_t stream) {
  check_common(args.m_capacity, args.num_experts, args.hidden, args.intermediate, "hidden", "intermediate");
  check_aligned(args.a, "a");
  check_aligned(args.a_scales, "a_scales");
  check_aligned(args.weights, "weights");
  check_aligned(args.weight_scales, "weight_scales");
  check_aligned(args.expert_offsets, "expert_offsets");
  check_aligned(args.out, "out");
  launch_plain(args.a, args.a_scales, args.weights, args.weight_scales, args.expert_offsets, args.out,
               args.m_capacity, args.num_experts, args.hidden, args.intermediate, args.rows_per_expert_hint,
               args.schedule, args.v11, args.v11_block_n, stream);
}

void grouped_gemm1_fp8(const GroupedGemm1Fp8Args& args, cudaStream_t stream) {
  check_common(args.m_capacity, args.num_experts, 2 * args.intermediate, args.hidden, "2*intermediate", "hidden");
  MEGAMOE_CHECK(args.intermediate % 128 == 0, "intermediate = ", args.intermediate, " must be a multiple of 128");
  check_aligned(args.a, "a");
  check_aligned(args.a_scales, "a_scales");
  check_aligned(args.weights, "weights");
  check_aligned(args.weight_scales, "weight_scales");
  check_aligned(args.expert_offsets, "expert_offsets");
  check_aligned(args.out, "out");
  check_aligned(args.out_scales, "out_scales");
  const bool clamped = args.activation.kind == Activation::Kind::kSwigluClamped;
  if (clamped)
    MEGAMOE_CHECK(args.activation.limit > 0.0f, "activation.limit = ", args.activation.limit, " must be > 0");
  GroupedGemmParams params;
  params.a_scales = args.a_scales;
  params.b_scales = args.weight_scales;
  params.expert_offsets = args.expert_offsets;
  params.topk_weights = args.topk_weights;
  params.out = args.out;
  params.out_scales = args.out_scales;
  params.m_capacity = static_cast<int>(args.m_capacity);
  params.num_experts = args.num_experts;
  params.n = 2 * args.intermediate;
  params.k = args.hidden;
  params.activation = clamped ? 1 : 0;
  params.limit = args.activation.limit;
  params.alpha = args.activation.alpha;
  params.a_tail_trim = resolve_a_tail_trim();
  params.swiglu_spread = detail::swiglu_spread_enabled();
  const sm90::MathSchedule schedule = resolve_schedule(args.schedule, args.rows_per_expert_hint);
  MEGAMOE_CHECK(args.packing == GemmRole::kGateUp || args.packing == GemmRole::kGateUpInterleaved8,
                "packing = ", static_cast<int>(args.packing), " must be kGateUp or kGateUpInterleaved8 (GEMM-1 weights)");
  if (args.packing == GemmRole::kGateUpInterleaved8) {  // v9: one tile for every rows hint (heuristics header)
    MEGAMOE_CHECK(schedule != sm90::MathSchedule::kHalfOverlap,
                  "schedule overlap is not available for GEMM-1 weights packed kGateUpInterleaved8 (v9): use serial "
                  "or pingpong");
    int skew = args.v9_skew_kblocks;
    if (skew < 0) {  // read per call, as MEGAMOE_FP8_GEMM_SCHEDULE
      const char* value = std::getenv("MEGAMOE_FP8_GEMM1_V9_SKEW");
      skew = value && *value ? std::atoi(value) : 0;
    }
    MEGAMOE_CHECK(skew >= 0 && skew <= sm90::kGateUpInterleaved.stages, "v9_skew_kblocks (or MEGAMOE_FP8_GEMM1_V9_SKEW) = ",
                  skew, " must be in [0, ", sm90::kGateUpInterleaved.stages, "] (the pipeline depth)");
    MEGAMOE_CHECK(skew == 0 || schedule == sm90::MathSchedule::kSerial, "v9_skew_kblocks = ", skew,
                  " needs the serial schedule (the pingpong issue token would deadlock with it)");
    params.v9_skew_kblocks = skew;
    MEGAMOE_CHECK(args.v11 >= -1 && args.v11 <= 1, "GroupedGemm1Fp8Args::v11 = ", args.v11, " must be -1, 0 or 1");
    MEGAMOE_CHECK(args.v11_small >= -1 && args.v11_small <= 1, "GroupedGemm1Fp8Args::v11_small = ", args.v11_small,
                  " must be -1, 0 or 1");
    if (args.v11 == 1 ||
        (args.v11 == -1 &&
         detail::env_switch("MEGAMOE_FP8_GEMM1_V11", sm90::prefer_fp8_gemm1_v11(args.rows_per_expert_hint)))) {
      // docs/grouped_gemm.md "v11 GEMM 1" and "v11 GEMM 1 small"
      const bool small = args.v11_small == 1 ||
                         (args.v11_small == -1 &&
                          detail::env_switch("MEGAMOE_FP8_GEMM1_V11_SMALL",
                                             sm90::prefer_fp8_gemm1_v11_small(args.rows_per_expert_hint)));
      detail::launch_fp8_v11_gemm1(args.a, args.weights, params, small, stream);
      return;
    }
    if (schedule == sm90::MathSchedule::kOrderedIssue)
      launch<sm90::kGateUpInterleaved, Epilogue::kSwigluInterleavedFp8, sm90::MathSchedule::kOrderedIssue>(
          args.a, args.weights, params, stream);
    else
      launch<sm90::kGateUpInterleaved, Epilogue::kSwigluInterleavedFp8, sm90::MathSchedule::kSerial>(
          args.a, args.weights, params, stream);
    return;
  }
  const sm90::TileConfig tile =
      sm90::choose_gate_up_tile(args.rows_per_expert_hint, args.num_experts, params.n, multiprocessor_count(),
                                sm90::kFp8Gemm1SmallRowsLimit);
  if (tile.sub_tiles_m == 1)
    launch<sm90::kSplitNSmall, Epilogue::kSwigluQuantFp8>(args.a, args.weights, params, schedule, stream);
  else
    launch<sm90::kSplitNLarge, Epilogue::kSwigluQuantFp8>(args.a, args.weights, params, schedule, stream);
}

namespace detail {  // shared with grouped_gemm_bf16.cu (grouped_gemm_internal.h)
CUtensorMap make_grouped_gemm_tensor_map(const void* base, uint64_t inner_bytes, uint64_t outer, uint32_t box_outer) {
  return make_tensor_map(base, inner_bytes, outer, box_outer);
}
CUtensorMap make_byte_tensor_map(const void* base, uint64_t inner_bytes, uint64_t outer, uint32_t box_inner_bytes,
                                 uint32_t box_outer, CUtensorMapSwizzle swizzle) {
  return make_tensor_map(base, inner_bytes, outer, box_outer, box_inner_bytes, swizzle);
}
int grouped_gemm_sm_count() { return multiprocessor_count(); }
void check_grouped_gemm_pointer(const void* pointer, const char* field) { check_aligned(pointer, field); }
void check_grouped_gemm_shape(int64_t m_capacity, int num_experts, int n, int k, const char* n_name,
                              const char* k_name) {
  check_common(m_capacity, num_experts, n, k, n_name, k_name);
}
bool swiglu_spread_enabled() { return env_switch("MEGAMOE_SWIGLU_SPREAD", true); }
bool env_switch(const char* name, bool unset_value) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return unset_value;
  const std::string text(value);
  MEGAMOE_CHECK(text == "0" || text == "1", name, " = '", text, "' must be 0 or 1");
  return text == "1";
}
}  // namespace detail


}  // namespace megamoe::kernels
