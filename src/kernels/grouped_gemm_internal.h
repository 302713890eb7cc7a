// Host helpers shared by the grouped-GEMM API translation units (grouped_gemm.cu: FP8,
// grouped_gemm_bf16.cu: BF16). Internal: include only from src/kernels/*.cu.
#pragma once

#include <cuda.h>

#include <cstdint>

#include <cuda_runtime_api.h>

namespace megamoe::kernels::sm90 {
struct GroupedGemmParams;  // sm90_fp8_grouped_gemm.cuh
}  // namespace megamoe::kernels::sm90

namespace megamoe::kernels::detail {

// 2D byte tensor map [outer, inner_bytes] read in boxes of [box_outer, 128 bytes] with the 128-byte
// swizzle of the wgmma descriptors; out-of-range rows read as zeros.
CUtensorMap make_grouped_gemm_tensor_map(const void* base, uint64_t inner_bytes, uint64_t outer, uint32_t box_outer);
// General form: box [box_outer, box_inner_bytes] with the given swizzle (W4A8 FP4 tiles: 64 bytes, 64B).
CUtensorMap make_byte_tensor_map(const void* base, uint64_t inner_bytes, uint64_t outer, uint32_t box_inner_bytes,
                                 uint32_t box_outer, CUtensorMapSwizzle swizzle);
int grouped_gemm_sm_count();
// Throws megamoe::Error naming `field` unless non-null and 16-byte aligned.
void check_grouped_gemm_pointer(const void* pointer, const char* field);
// m_capacity in [1, 2^31), num_experts in [1, kMaxExperts], n and k positive multiples of 128.
void check_grouped_gemm_shape(int64_t m_capacity, int num_experts, int n, int k, const char* n_name,
                              const char* k_name);
// An A/B switch read from the environment (per call: a getenv is small next to a launch): unset or empty
// -> `unset_value`, "0" / "1" -> false / true, anything else throws megamoe::Error naming the variable.
bool env_switch(const char* name, bool unset_value);
// MEGAMOE_SWIGLU_SPREAD (default on): the spread SwiGLU epilogue of 64-row GEMM-1 tiles with few rows
// (swiglu_quant_fp8_spread_epilogue), FP8 split-N and W4A8 2-warpgroup kernels; 0 = the balanced / pair ones.
bool swiglu_spread_enabled();
// v11 plain FP8-block GEMM with BF16 out (grouped_gemm_fp8_v11.cu, sm90_fp8_wide_grouped_gemm.cuh): arguments
// already validated by the caller; block_n 128 or 192.
void launch_fp8_v11(const uint8_t* a, const float* a_scales, const uint8_t* weights, const float* weight_scales,
                    const int32_t* expert_offsets, uint16_t* out, int64_t m_capacity, int num_experts, int n, int k,
                    int block_n, cudaStream_t stream);
// v11 GEMM 1 (grouped_gemm_fp8_v11_gemm1.cu, sm90_fp8_wide_gemm1.cuh) on kGateUpInterleaved8 weights: `params`
// as the v9 launch in grouped_gemm1_fp8 fills them (already validated; v9_skew_kblocks, a_tail_trim unused).
// small: the 64 x 256 split-N tile ("v11 GEMM 1 small"), else 128 x 256 split-M.
void launch_fp8_v11_gemm1(const uint8_t* a, const uint8_t* weights, const sm90::GroupedGemmParams& params, bool small,
                          cudaStream_t stream);

}  // namespace megamoe::kernels::detail
