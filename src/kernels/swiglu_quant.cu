// Launcher and typed API of the two-pass FP8 GEMM 1 (swiglu_quant.h); the checks are in swiglu_quant_args.cpp.
#include <algorithm>

#include "kernels/grouped_gemm.h"
#include "kernels/grouped_gemm_internal.h"
#include "kernels/sm90_swiglu_quant.cuh"
#include "kernels/swiglu_quant.h"
#include "megamoe/error_cuda.h"

namespace megamoe::kernels {

namespace {

// Grid: one CTA per 16 (row, block) units of m_capacity rows, at most what the SMs hold at once (the kernel
// loops over the rest). Depends on m_capacity only, never on the device offsets.
// NOTES: ptxas gives the kernels 37-40 registers (6 CTAs of 256 threads per SM); capping them at 32
// (__launch_bounds__ minimum 8 CTAs) spilled 4-12 bytes, so the occupancy is asked once per instantiation.
template <int kActivation, bool kTopk>
void launch_swiglu_quant(const sm90::SwigluQuantParams& params, cudaStream_t stream) {
  auto* kernel = &sm90::sm90_swiglu_quant_fp8_kernel<kActivation, kTopk>;
  static const int ctas_per_sm = [kernel] {
    int ctas = 0;
    MEGAMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, sm90::kSwigluQuantThreads, 0));
    return std::max(1, ctas);
  }();
  const int64_t units = static_cast<int64_t>(params.m_capacity) * (params.intermediate / 128);
  const int64_t needed = (units + sm90::kSwigluQuantUnitsPerCta - 1) / sm90::kSwigluQuantUnitsPerCta;
  const int64_t resident = static_cast<int64_t>(detail::grouped_gemm_sm_count()) * ctas_per_sm;
  const unsigned grid = static_cast<unsigned>(std::max<int64_t>(1, std::min(needed, resident)));
  kernel<<<grid, sm90::kSwigluQuantThreads, 0, stream>>>(params);
  MEGAMOE_LAUNCH_CHECK();
}

}  // namespace

void swiglu_quant_fp8(const SwigluQuantFp8Args& args, cudaStream_t stream) {
  check_swiglu_quant_fp8_args(args);
  sm90::SwigluQuantParams params;
  params.in = args.in;
  params.expert_offsets = args.expert_offsets;
  params.topk_weights = args.topk_weights;
  params.out = args.out;
  params.out_scales = args.out_scales;
  params.m_capacity = static_cast<int>(args.m_capacity);
  params.num_experts = args.num_experts;
  params.intermediate = args.intermediate;
  params.limit = args.activation.limit;
  params.alpha = args.activation.alpha;
  const bool clamped = args.activation.kind == Activation::Kind::kSwigluClamped;
  const bool topk = args.topk_weights != nullptr;
  if (clamped)
    topk ? launch_swiglu_quant<1, true>(params, stream) : launch_swiglu_quant<1, false>(params, stream);
  else
    topk ? launch_swiglu_quant<0, true>(params, stream) : launch_swiglu_quant<0, false>(params, stream);
}

void grouped_gemm1_fp8_two_pass(const GroupedGemm1Fp8Args& args, uint16_t* gate_up, cudaStream_t stream) {
  MEGAMOE_CHECK(args.packing == GemmRole::kGateUp, "two-pass GEMM 1: packing = ", static_cast<int>(args.packing),
                " must be kGateUp (the plain GEMM writes gate/up in the by-128 packed order)");
  MEGAMOE_CHECK(gate_up != nullptr && reinterpret_cast<uintptr_t>(gate_up) % 16 == 0,
                "two-pass GEMM 1: gate_up must be non-null and 16-byte aligned");
  SwigluQuantFp8Args pass2;
  pass2.in = gate_up;
  pass2.expert_offsets = args.expert_offsets;
  pass2.topk_weights = args.topk_weights;
  pass2.out = args.out;
  pass2.out_scales = args.out_scales;
  pass2.m_capacity = args.m_capacity;
  pass2.num_experts = args.num_experts;
  pass2.intermediate = args.intermediate;
  pass2.activation = args.activation;
  check_swiglu_quant_fp8_args(pass2);  // before pass 1 runs
  GroupedGemmFp8Args pass1;
  pass1.a = args.a;
  pass1.a_scales = args.a_scales;
  pass1.weights = args.weights;
  pass1.weight_scales = args.weight_scales;
  pass1.expert_offsets = args.expert_offsets;
  pass1.out = gate_up;
  pass1.m_capacity = args.m_capacity;
  pass1.num_experts = args.num_experts;
  pass1.n = 2 * args.intermediate;
  pass1.k = args.hidden;
  pass1.rows_per_expert_hint = args.rows_per_expert_hint;
  pass1.schedule = args.schedule;
  grouped_gemm_fp8_bf16out(pass1, stream);
  swiglu_quant_fp8(pass2, stream);
}

}  // namespace megamoe::kernels
