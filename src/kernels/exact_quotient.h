// Correctly rounded x / divisor from the divisor's correctly rounded reciprocal: the FP8 requantization of the GEMM-1
// rows epilogue (swiglu_quant_fp8_rows_epilogue) divides every output of a row by the row's one scale, and an IEEE
// division (__fdiv_rn: MUFU.RCP, refinement FFMAs, FCHK and a slow-path branch per call) per element was ~1/3 of the
// epilogue's MUFU work. Plain C++ (host and device): tests/cpu/test_exact_quotient.cpp checks the claim below against
// IEEE division on the host.
//
// quotient_by_reciprocal(x, d, r) with r = RN(1 / d) (__frcp_rn on the device):
//   q = RN(x r);  e = RN(x - d q) by one FMA (exact: the residual of a quotient within an ulp is representable);
//   result = q if e == 0 (x / d is q exactly; keeps the sign of a zero x), else RN(q + e r) by one FMA
// (Markstein's correction: with r correctly rounded and q within an ulp, RN(q + e r) = RN(x / d)).
// NOTES (the range it is used in: d = RN(max(RN(amax |w|), 1e-10) / 448), finite, >= 2^-43; x = RN(h w), |x| <= amax
// |w|):
// - The same float as RN(x / d) whenever |x| >= 2^-103 and |x / d| >= 2^-126 (the residual e is then exact and q
//   normal), and for x = +-0. That covers every quotient of magnitude >= 2^-10 (|x| >= 2^-53 there), i.e. every one
//   whose E4M3 code (round to nearest, smallest subnormal 2^-9) is not a zero.
// - Below that the result may differ from RN(x / d) in the last bit; both are then < 2^-10 in magnitude with x's
//   sign, so both E4M3 codes are the same signed zero (tests/cpu/test_exact_quotient.cpp compares the codes).
// - d = inf (an infinite amax) gives r = 0 and a NaN residual: the caller keeps __fdiv_rn for such rows. NaN x gives
//   the canonical NaN either way.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define MEGAMOE_QUOTIENT_HD __host__ __device__ __forceinline__
#else
#define MEGAMOE_QUOTIENT_HD inline
#endif

namespace megamoe::kernels {

MEGAMOE_QUOTIENT_HD float quotient_by_reciprocal(float x, float divisor, float reciprocal) {
#if defined(__CUDA_ARCH__)
  const float q = __fmul_rn(x, reciprocal);  // _rn: never contracted into a neighbouring FMA
  const float e = __fmaf_rn(-divisor, q, x);
  return e == 0.0f ? q : __fmaf_rn(e, reciprocal, q);
#else
  const float q = x * reciprocal;
  const float e = std::fma(-divisor, q, x);
  return e == 0.0f ? q : std::fma(e, reciprocal, q);
#endif
}

}  // namespace megamoe::kernels
