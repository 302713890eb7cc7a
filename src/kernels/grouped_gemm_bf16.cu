// Typed validating API of the BF16 x BF16 grouped GEMMs (grouped_gemm.h): checks, TMA descriptors,
// tile choice (sm90_gemm_heuristics.h, the FP8 tile shapes: a BF16 stage is the same bytes; GEMM 1 at
// 128 x 256 runs the FP8 config's 4 stages since its gate/up exchange is the same 16 KiB chunked one), launch.
// BF16 v2 (docs/grouped_gemm.md "BF16 v2"): GEMM 2 / plain on the wide 128 x 256 tile (or the 64 x 256
// one at <= 64 rows) with bulk-store epilogues when resolve_v2; GEMM 1 on the wide tile when the weights
// are packed kGateUpInterleaved8.
#include "kernels/cluster_launch.h"
#include "kernels/grouped_gemm.h"
#include "kernels/grouped_gemm_internal.h"
#include "kernels/sm90_bf16_grouped_gemm.cuh"
#include "megamoe/error_cuda.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <string>

namespace megamoe::kernels {
namespace {

using sm90::Bf16Epilogue;
using sm90::Bf16GroupedGemmParams;

template <sm90::TileConfig kTile, Bf16Epilogue kEpilogue, int kStagingRows = 0>
void launch(const uint16_t* a, const uint16_t* weights, const Bf16GroupedGemmParams& params, cudaStream_t stream) {
  using Layout =
      sm90::Bf16GroupedGemmLayout<kTile.warpgroups_m, kTile.sub_tiles_m, kTile.stages, kEpilogue, kStagingRows>;
  // BF16 rows addressed as bytes: [rows, 2K] (see the kernel's header comment).
  const uint64_t row_bytes = 2 * static_cast<uint64_t>(params.k);
  const CUtensorMap a_map = detail::make_grouped_gemm_tensor_map(a, row_bytes, params.m_capacity, Layout::kBlockM);
  const CUtensorMap b_map = detail::make_grouped_gemm_tensor_map(
      weights, row_bytes, static_cast<uint64_t>(params.num_experts) * params.n, Layout::kBlockN);
  // NOTES: 227 KiB of dynamic shared memory per CTA on sm_90; the tile table of up to 1024 experts
  // must fit beside the stages (checked again at run time by cudaFuncSetAttribute).
  static_assert(Layout::shared_bytes(1024) <= 227 * 1024, "BF16 grouped GEMM tile config overflows shared memory");
  const int shared_bytes = Layout::shared_bytes(params.num_experts);
  auto* kernel = &sm90::sm90_bf16_grouped_gemm_kernel<kTile.warpgroups_m, kTile.sub_tiles_m, kTile.stages, kEpilogue,
                                                      kStagingRows>;
  MEGAMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
  kernel<<<detail::grouped_gemm_sm_count(), sm90::kThreadsPerCta, shared_bytes, stream>>>(a_map, b_map, params);
  MEGAMOE_LAUNCH_CHECK();
}

// BF16 v2 wide tile (sm90_bf16_wide_grouped_gemm_kernel, 128 x 256). kCluster (MEGAMOE_BF16_CLUSTER=1,
// docs/grouped_gemm.md "BF16 clusters"): clusters of 2 CTAs share each B tile by TMA multicast; B is loaded in
// 128-row parts (the B map's box), the grid is 2 x the co-resident clusters (cluster_launch.h). Same outputs.
template <Bf16Epilogue kEpilogue, bool kCluster = false>
void launch_wide_impl(const uint16_t* a, const uint16_t* weights, const Bf16GroupedGemmParams& params,
                      cudaStream_t stream) {
  using Layout = sm90::Bf16WideLayout<sm90::kBf16WideStages, sm90::kBf16WideStagingRows, kCluster ? 2 : 1>;
  static_assert(Layout::kBlockM == sm90::kBf16Wide.block_m() && Layout::kBlockN == sm90::kBf16Wide.block_n() &&
                    Layout::kStageCount == sm90::kBf16Wide.stages,
                "the heuristics' kBf16Wide is the kernel's layout");
  static_assert(Layout::shared_bytes(sm90::kMaxExperts) == sm90::Bf16WideStandaloneLayout::shared_bytes(sm90::kMaxExperts),
                "clusters: the same shared memory");
  const uint64_t row_bytes = 2 * static_cast<uint64_t>(params.k);
  const CUtensorMap a_map = detail::make_grouped_gemm_tensor_map(a, row_bytes, params.m_capacity, Layout::kBlockM);
  const CUtensorMap b_map = detail::make_grouped_gemm_tensor_map(
      weights, row_bytes, static_cast<uint64_t>(params.num_experts) * params.n, Layout::kBBlockRows);
  // store_bf16_epilogue_tma's out map: out [m_capacity, out columns] BF16 as bytes (n plain, n / 2 after SwiGLU),
  // boxes of 128 bytes (64 columns) x kOutMapRows rows, 128-byte swizzle.
  const uint64_t out_columns = kEpilogue == Bf16Epilogue::kStoreBf16 ? params.n : params.n / 2;
  const CUtensorMap out_map = detail::make_byte_tensor_map(params.out, 2 * out_columns, params.m_capacity, 128,
                                                           Layout::kOutMapRows, CU_TENSOR_MAP_SWIZZLE_128B);
  const int shared_bytes = Layout::shared_bytes(params.num_experts);
  auto* kernel = &sm90::sm90_bf16_wide_grouped_gemm_kernel<kEpilogue, kCluster>;
  MEGAMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
  if constexpr (kCluster) {
    static std::array<std::atomic<int>, detail::kClusterGridDevices> grids{};  // per device, this instantiation
    detail::launch_cluster_kernel(kernel, detail::cluster_grid(kernel, shared_bytes, grids), shared_bytes, stream,
                                  a_map, b_map, out_map, params);
  } else {
    kernel<<<detail::grouped_gemm_sm_count(), sm90::kThreadsPerCta, shared_bytes, stream>>>(a_map, b_map, out_map,
                                                                                           params);
    MEGAMOE_LAUNCH_CHECK();
  }
}

// MEGAMOE_BF16_CLUSTER=0|1, read per launch (docs/grouped_gemm.md "BF16 clusters"); unset: the heuristic below
// (kept here, not in sm90_gemm_heuristics.h: that header is included by most of the tree).
// Measured (session 16 call 4, one H200, bench gemm bf16 v2, 128 experts, best of 2 rounds, cluster 1 vs 0): dsv3
// (hidden 7168) GEMM 1 1.03-1.29x, GEMM 2 1.01-1.29x (exact 1024 rows: GEMM 1 612 -> 700 TFLOP/s); ms4 1.00-1.22x;
// qwen3-30b (hidden 2048) 0.95-1.06x, the losses at multinomial 1024 rows. Hence: clusters where the hidden size
// (GEMM 1's K, GEMM 2's N) is >= 4096; the larger the B tile's reuse the more the shared load saves.
inline bool prefer_bf16_cluster(int n, int k) { return std::max(n, k) >= 4096; }
template <Bf16Epilogue kEpilogue>
void launch_wide(const uint16_t* a, const uint16_t* weights, const Bf16GroupedGemmParams& params, cudaStream_t stream) {
  if (detail::env_switch("MEGAMOE_BF16_CLUSTER", prefer_bf16_cluster(params.n, params.k)))
    launch_wide_impl<kEpilogue, true>(a, weights, params, stream);
  else
    launch_wide_impl<kEpilogue, false>(a, weights, params, stream);
}

// Staging rows of the v2 bulk-store epilogue on a v1 tile (the FP8 standalone rule, no scale ring).
template <sm90::TileConfig kTile>
constexpr int bulk_rows() {
  return sm90::standalone_bf16_staging_rows<kTile.warpgroups_m, kTile.sub_tiles_m, kTile.stages, false>();
}

// v2: -1 = the default (env / heuristic), 0 / 1 = forced.
bool resolve_v2(int requested) {
  MEGAMOE_CHECK(requested >= -1 && requested <= 1, "v2 = ", requested, " must be -1 (default), 0 or 1");
  return requested < 0 ? bf16_gemm_v2_default() : requested == 1;
}

void launch_plain(const uint16_t* a, const uint16_t* weights, const int32_t* offsets, uint16_t* out,
                  int64_t m_capacity, int num_experts, int n, int k, int rows_hint, int v2, cudaStream_t stream) {
  detail::check_grouped_gemm_pointer(a, "a");
  detail::check_grouped_gemm_pointer(weights, "weights");
  detail::check_grouped_gemm_pointer(offsets, "expert_offsets");
  detail::check_grouped_gemm_pointer(out, "out");
  Bf16GroupedGemmParams params;
  params.expert_offsets = offsets;
  params.out = reinterpret_cast<__nv_bfloat16*>(out);
  params.m_capacity = static_cast<int>(m_capacity);
  params.num_experts = num_experts;
  params.n = n;
  params.k = k;
  const sm90::TileConfig tile = sm90::choose_plain_tile(rows_hint);
  if (resolve_v2(v2)) {  // BF16 v2 (sm90_gemm_heuristics.h, kBf16Wide): bulk stores everywhere
    if (tile.warpgroups_m == 1 && n % 256 == 0)
      launch<sm90::kSplitNSmall, Bf16Epilogue::kStoreBf16, bulk_rows<sm90::kSplitNSmall>()>(a, weights, params, stream);
    else if (n % 256 == 0)
      launch_wide<Bf16Epilogue::kStoreBf16>(a, weights, params, stream);
    else  // n an odd multiple of 128: the wide tile does not divide it
      launch<sm90::kSplitMSmall, Bf16Epilogue::kStoreBf16, bulk_rows<sm90::kSplitMSmall>()>(a, weights, params, stream);
    return;
  }
  if (tile.warpgroups_m == 1 && n % 256 == 0)
    launch<sm90::kSplitNSmall, Bf16Epilogue::kStoreBf16>(a, weights, params, stream);
  else if (tile.sub_tiles_m == 1)
    launch<sm90::kSplitMSmall, Bf16Epilogue::kStoreBf16>(a, weights, params, stream);
  else
    launch<sm90::kSplitMLarge, Bf16Epilogue::kStoreBf16>(a, weights, params, stream);
}

}  // namespace

bool bf16_gemm_v2_default() { return detail::env_switch("MEGAMOE_BF16_GEMM_V2", sm90::prefer_bf16_v2()); }

void grouped_gemm_bf16(const GroupedGemmBf16Args& args, cudaStream_t stream) {
  detail::check_grouped_gemm_shape(args.m_capacity, args.num_experts, args.n, args.k, "n", "k");
  launch_plain(args.a, args.weights, args.expert_offsets, args.out, args.m_capacity, args.num_experts, args.n,
               args.k, args.rows_per_expert_hint, args.v2, stream);
}

void grouped_gemm2_bf16(const GroupedGemm2Bf16Args& args, cudaStream_t stream) {
  detail::check_grouped_gemm_shape(args.m_capacity, args.num_experts, args.hidden, args.intermediate, "hidden",
                                   "intermediate");
  launch_plain(args.a, args.weights, args.expert_offsets, args.out, args.m_capacity, args.num_experts, args.hidden,
               args.intermediate, args.rows_per_expert_hint, args.v2, stream);
}

void grouped_gemm1_bf16(const GroupedGemm1Bf16Args& args, cudaStream_t stream) {
  detail::check_grouped_gemm_shape(args.m_capacity, args.num_experts, 2 * args.intermediate, args.hidden,
                                   "2*intermediate", "hidden");
  MEGAMOE_CHECK(args.intermediate % 128 == 0, "intermediate = ", args.intermediate, " must be a multiple of 128");
  detail::check_grouped_gemm_pointer(args.a, "a");
  detail::check_grouped_gemm_pointer(args.weights, "weights");
  detail::check_grouped_gemm_pointer(args.expert_offsets, "expert_offsets");
  detail::check_grouped_gemm_pointer(args.out, "out");
  const bool clamped = args.activation.kind == Activation::Kind::kSwigluClamped;
  if (clamped) {
    MEGAMOE_CHECK(args.activation.limit > 0.0f, "activation.limit = ", args.activation.limit, " must be > 0");
    MEGAMOE_CHECK(args.activation.alpha > 0.0f, "activation.alpha = ", args.activation.alpha, " must be > 0");
  }
  Bf16GroupedGemmParams params;
  params.expert_offsets = args.expert_offsets;
  params.topk_weights = args.topk_weights;
  params.out = reinterpret_cast<__nv_bfloat16*>(args.out);
  params.m_capacity = static_cast<int>(args.m_capacity);
  params.num_experts = args.num_experts;
  params.n = 2 * args.intermediate;
  params.k = args.hidden;
  params.activation = clamped ? 1 : 0;
  params.limit = args.activation.limit;
  params.alpha = args.activation.alpha;
  MEGAMOE_CHECK(args.packing == GemmRole::kGateUp || args.packing == GemmRole::kGateUpInterleaved8, "packing = ",
                static_cast<int>(args.packing), " must be kGateUp or kGateUpInterleaved8 (GEMM-1 weights)");
  if (args.packing == GemmRole::kGateUpInterleaved8) {  // BF16 v2: one tile for every rows hint
    launch_wide<Bf16Epilogue::kSwigluInterleavedBf16>(args.a, args.weights, params, stream);
    return;
  }
  const sm90::TileConfig tile = sm90::choose_gate_up_tile(args.rows_per_expert_hint, args.num_experts, params.n,
                                                          detail::grouped_gemm_sm_count());
  if (tile.sub_tiles_m == 1)
    launch<sm90::kSplitNSmall, Bf16Epilogue::kSwigluBf16>(args.a, args.weights, params, stream);
  else
    launch<sm90::kSplitNLarge, Bf16Epilogue::kSwigluBf16>(args.a, args.weights, params, stream);
}

}  // namespace megamoe::kernels
