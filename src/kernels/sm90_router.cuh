// Router kernel (every RouterKind) and its launcher: logits [T, E] -> top-k ids and weights.
//
// One warp per token, kWarpsPerBlock tokens per block. Lane L owns experts L, L + 32, L + 64, ...
// (kSlots of them, kSlots * 32 >= E), which is exactly the lane-strided order in which the CPU
// reference sums the softmax denominator. Lanes j < top_k own output slot j.
//
// NOTES: numerics follow src/routing/router_reference.cpp operation by operation, in fp32 with round
// to nearest even. Every add/mul/div/sqrt is an explicit __f*_rn intrinsic so that nvcc can neither
// contract into FMAs nor use approximate division/sqrt; exp/log1p are CUDA's expf/log1pf (<= 2 ulp,
// not the __expf intrinsics), so scores may differ from glibc's by an ulp or two.
// NOTES: all control flow that precedes a __shfl_sync is warp-uniform (it depends on the token, on
// parameters or on warp votes), so the full mask is always correct.
// NOTES: tests/cpu/test_router_kernel_emulated.cpp compiles this file as host C++ with
// MEGAMOE_ROUTER_HOST_EMULATION defined (warp intrinsics emulated, launcher left out), so that CI
// checks the kernel's logic bit for bit against the CPU reference without a GPU.
#pragma once

#include <cstdint>

#ifndef MEGAMOE_ROUTER_HOST_EMULATION
#include <cuda_runtime.h>

#include "megamoe/error_cuda.h"
#endif
#include "megamoe/routing.h"
#include "megamoe/routing_cuda.h"

// Full unrolling keeps the per-lane arrays in registers; the host emulation has no such pragma.
#ifdef MEGAMOE_ROUTER_HOST_EMULATION
#define MEGAMOE_ROUTER_UNROLL
#else
#define MEGAMOE_ROUTER_UNROLL _Pragma("unroll")
#endif

namespace megamoe::kernels::sm90 {

constexpr int kRouterWarpsPerBlock = 4;
constexpr unsigned kFullMask = 0xffffffffu;

struct RouterParams {
  const float* logits = nullptr;           // [T, E]
  const float* correction_bias = nullptr;  // [E] or null
  const uint8_t* padding = nullptr;        // [T] or null
  const int32_t* token_ids = nullptr;      // [T] (hash)
  const int32_t* hash_table = nullptr;     // [hash_vocab, top_k] (hash)
  int64_t hash_vocab = 0;
  int32_t* topk_ids = nullptr;             // [T, top_k]
  float* topk_weights = nullptr;           // [T, top_k]
  unsigned long long* status = nullptr;    // [1] or null
  int num_tokens = 0, num_experts = 0, top_k = 0, num_groups = 1, top_k_groups = 1;
  float routed_scaling_factor = 1.0f;
  ScoreFunction score = ScoreFunction::kSoftmax;
  bool hash = false, renormalize = true;
};

// ---- small device helpers ------------------------------------------------------------------------

__device__ __forceinline__ void record_error(unsigned long long* status, int64_t token, RouterDeviceError error,
                                             int index) {
  if (status == nullptr) return;
  const unsigned long long word = (static_cast<unsigned long long>(token) << 32) |
                                  (static_cast<unsigned long long>(error) << 28) |
                                  static_cast<unsigned long long>(index & 0x0fffffff);
  atomicMin(status, word);
}

// A candidate as one orderable word: larger = better (higher score, then lower id); 0 = none.
// NOTES: -0.0f is folded into +0.0f first because the reference treats them as a tie; the smallest
// valid key (-inf, id 511) is still > 0.
__device__ __forceinline__ unsigned long long candidate_key(float score, int id) {
  if (score == 0.0f) score = 0.0f;
  const unsigned bits = __float_as_uint(score);
  const unsigned ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (static_cast<unsigned long long>(ordered) << 32) | static_cast<unsigned>(~id);
}
__device__ __forceinline__ int candidate_id(unsigned long long key) {
  return static_cast<int>(~static_cast<unsigned>(key & 0xffffffffu));
}

__device__ __forceinline__ unsigned long long warp_max(unsigned long long key) {
MEGAMOE_ROUTER_UNROLL
  for (int offset = 16; offset >= 1; offset /= 2) {
    const unsigned long long other = __shfl_xor_sync(kFullMask, key, offset);
    key = other > key ? other : key;
  }
  return key;
}

template <int kSlots>
__device__ __forceinline__ unsigned long long best_of(const unsigned long long (&keys)[kSlots]) {
  unsigned long long best = 0;
MEGAMOE_ROUTER_UNROLL
  for (int i = 0; i < kSlots; ++i) best = keys[i] > best ? keys[i] : best;
  return best;
}

// Unbiased scores of the lane's experts (NaN logit -> NaN score); see the reference NOTES.
template <int kSlots>
__device__ __forceinline__ void unbiased_scores(ScoreFunction function, const float (&logit)[kSlots],
                                                float (&score)[kSlots]) {
  if (function == ScoreFunction::kSoftmax) {
    float max_logit = -INFINITY;  // fmaxf ignores NaN, like the reference's "non-NaN logits"
MEGAMOE_ROUTER_UNROLL
    for (int i = 0; i < kSlots; ++i) max_logit = fmaxf(max_logit, logit[i]);
MEGAMOE_ROUTER_UNROLL
    for (int offset = 16; offset >= 1; offset /= 2)
      max_logit = fmaxf(max_logit, __shfl_xor_sync(kFullMask, max_logit, offset));
    float exps[kSlots];
    float lane_sum = 0.0f;  // lane-strided: this lane's experts in increasing order, then a butterfly
MEGAMOE_ROUTER_UNROLL
    for (int i = 0; i < kSlots; ++i) {
      exps[i] = (isnan(logit[i]) || logit[i] == -INFINITY) ? 0.0f : expf(__fsub_rn(logit[i], max_logit));
      lane_sum = __fadd_rn(lane_sum, exps[i]);
    }
MEGAMOE_ROUTER_UNROLL
    for (int offset = 16; offset >= 1; offset /= 2)
      lane_sum = __fadd_rn(lane_sum, __shfl_xor_sync(kFullMask, lane_sum, offset));
    const float divisor = lane_sum == 0.0f ? 1.0f : lane_sum;
MEGAMOE_ROUTER_UNROLL
    for (int i = 0; i < kSlots; ++i) score[i] = isnan(logit[i]) ? logit[i] : __fdiv_rn(exps[i], divisor);
  } else if (function == ScoreFunction::kSigmoid) {
MEGAMOE_ROUTER_UNROLL
    for (int i = 0; i < kSlots; ++i) score[i] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-logit[i])));
  } else {
MEGAMOE_ROUTER_UNROLL
    for (int i = 0; i < kSlots; ++i) {
      const float softplus = logit[i] > 20.0f ? logit[i] : log1pf(expf(logit[i]));
      score[i] = __fsqrt_rn(softplus);
    }
  }
}

// Key of group g: sum of its top-2 valid selection scores (first + second, first the larger; the
// single top score for a group of one valid expert or of size 1); 0 when it has no valid expert.
__device__ __forceinline__ unsigned long long group_key(const float* selection, int g, int group_size) {
  float first = -INFINITY, second = -INFINITY;
  int valid = 0;
  for (int e = g * group_size; e < (g + 1) * group_size; ++e) {
    const float s = selection[e];
    if (isnan(s)) continue;
    ++valid;
    if (s > first) second = first, first = s;
    else if (s > second) second = s;
  }
  if (valid == 0) return 0;
  return candidate_key(valid == 1 || group_size == 1 ? first : __fadd_rn(first, second), g);
}

// Group-limited selection: clears keys of experts outside the top_k_groups best groups.
// `selection` is this warp's shared row [E] (NaN = invalid), `kept` its shared [num_groups] flags.
template <int kSlots>
__device__ __forceinline__ void keep_best_groups(const RouterParams& p, const float* selection, uint8_t* kept,
                                                 unsigned long long (&keys)[kSlots]) {
  const int lane = threadIdx.x % 32;
  const int group_size = p.num_experts / p.num_groups;
  // Group g = lane + 32 * j (num_groups <= E <= 32 * kSlots).
  unsigned long long group_keys[kSlots];
MEGAMOE_ROUTER_UNROLL
  for (int j = 0; j < kSlots; ++j) {
    const int g = lane + 32 * j;
    const bool exists = g < p.num_groups;
    group_keys[j] = exists ? group_key(selection, g, group_size) : 0;
    if (exists) kept[g] = 0;
  }
  __syncwarp();
  for (int round = 0; round < p.top_k_groups; ++round) {
    const unsigned long long best = warp_max(best_of(group_keys));
    if (best == 0) break;
    if (lane == candidate_id(best) % 32) kept[candidate_id(best)] = 1;
MEGAMOE_ROUTER_UNROLL
    for (int j = 0; j < kSlots; ++j)  // keys are unique: only the winner's own entry matches
      if (group_keys[j] == best) group_keys[j] = 0;
  }
  __syncwarp();
MEGAMOE_ROUTER_UNROLL
  for (int i = 0; i < kSlots; ++i) {
    const int e = lane + 32 * i;
    if (keys[i] != 0 && !kept[e / group_size]) keys[i] = 0;
  }
}

// Renormalisation and routed scaling of this lane's slot, as the reference's finish_weights.
__device__ __forceinline__ float finish_weight(const RouterParams& p, int32_t id, float weight) {
  if (p.renormalize) {
    float sum = 0.0f;  // slot order, sequential: w_0 + w_1 + ... (all lanes compute the same)
    for (int j = 0; j < p.top_k; ++j) sum = __fadd_rn(sum, __shfl_sync(kFullMask, weight, j));
    weight = __fdiv_rn(weight, sum == 0.0f ? 1.0f : sum);
  }
  return id < 0 ? 0.0f : __fmul_rn(weight, p.routed_scaling_factor);
}

// ---- the kernel -----------------------------------------------------------------------------------

template <int kSlots>
__global__ void __launch_bounds__(kRouterWarpsPerBlock * 32) sm90_router_kernel(const RouterParams p) {
  constexpr int kMaxExperts = kSlots * 32;
  __shared__ float shared_row[kRouterWarpsPerBlock][kMaxExperts];     // selection (groups) / scores (hash)
  __shared__ uint8_t shared_kept[kRouterWarpsPerBlock][kMaxExperts];  // kept groups
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kRouterWarpsPerBlock + warp;
  if (token >= p.num_tokens) return;  // warp-uniform
  const int num_experts = p.num_experts;
  int32_t* out_ids = p.topk_ids + token * p.top_k;
  float* out_weights = p.topk_weights + token * p.top_k;
  auto write_empty_row = [&] {
    if (lane < p.top_k) out_ids[lane] = -1, out_weights[lane] = 0.0f;
  };

  // A bad correction bias poisons the whole call (the reference throws before any row): every row,
  // padded or not, checks it.
  float bias[kSlots];
  bool bad = false;
MEGAMOE_ROUTER_UNROLL
  for (int i = 0; i < kSlots; ++i) {
    const int e = lane + 32 * i;
    bias[i] = 0.0f;
    if (p.correction_bias != nullptr && e < num_experts) {
      bias[i] = p.correction_bias[e];
      if (!isfinite(bias[i])) {
        record_error(p.status, token, RouterDeviceError::kBadCorrectionBias, e);
        bad = true;
      }
    }
  }
  if (__any_sync(kFullMask, bad) || (p.padding != nullptr && p.padding[token] != 0)) return write_empty_row();

  float logit[kSlots];
  const float* row = p.logits + token * num_experts;
MEGAMOE_ROUTER_UNROLL
  for (int i = 0; i < kSlots; ++i) {
    const int e = lane + 32 * i;
    logit[i] = e < num_experts ? row[e] : __int_as_float(0x7fffffff);  // NaN: not an expert
    if (logit[i] == INFINITY) {
      record_error(p.status, token, RouterDeviceError::kPositiveInfLogit, e);
      bad = true;
    }
  }
  if (__any_sync(kFullMask, bad)) return write_empty_row();

  float score[kSlots];
  unbiased_scores<kSlots>(p.score, logit, score);

  int32_t my_id = -1;  // lane j < top_k: slot j
  float my_weight = 0.0f;
  if (p.hash) {
    const int32_t hashed_token = p.token_ids[token];
    if (hashed_token < 0 || hashed_token >= p.hash_vocab) {
      if (lane == 0) record_error(p.status, token, RouterDeviceError::kTokenIdOutOfRange, 0);
      return write_empty_row();
    }
MEGAMOE_ROUTER_UNROLL
    for (int i = 0; i < kSlots; ++i)
      if (lane + 32 * i < num_experts) shared_row[warp][lane + 32 * i] = score[i];
    __syncwarp();
    if (lane < p.top_k) {
      const int32_t expert = p.hash_table[static_cast<int64_t>(hashed_token) * p.top_k + lane];
      if (expert < 0 || expert >= num_experts) {
        record_error(p.status, token, RouterDeviceError::kHashEntryOutOfRange, lane);
        bad = true;
      } else if (!isnan(shared_row[warp][expert])) {  // a NaN logit never selects, never weighs
        my_id = expert;
        my_weight = shared_row[warp][expert];
      }
    }
    if (__any_sync(kFullMask, bad)) return write_empty_row();
  } else {
    // Selection scores: biased scores, or the logits themselves for softmax without a bias.
    unsigned long long keys[kSlots];
    float selection[kSlots];
MEGAMOE_ROUTER_UNROLL
    for (int i = 0; i < kSlots; ++i) {
      selection[i] = p.correction_bias != nullptr        ? __fadd_rn(score[i], bias[i])
                     : p.score == ScoreFunction::kSoftmax ? logit[i]
                                                         : score[i];
      keys[i] = isnan(selection[i]) ? 0 : candidate_key(selection[i], lane + 32 * i);
    }
    if (p.num_groups > 1) {
MEGAMOE_ROUTER_UNROLL
      for (int i = 0; i < kSlots; ++i)
        if (lane + 32 * i < num_experts) shared_row[warp][lane + 32 * i] = selection[i];
      __syncwarp();
      keep_best_groups<kSlots>(p, shared_row[warp], shared_kept[warp], keys);
    }
    // top_k rounds of a warp arg-max; only the winner's lane rescans its experts.
    unsigned long long lane_best = best_of(keys);
    for (int j = 0; j < p.top_k; ++j) {
      const unsigned long long best = warp_max(lane_best);
      if (best == 0) break;  // fewer valid candidates than top_k: remaining slots stay -1 / 0
      const int expert = candidate_id(best);
      // Keys are unique, so only the winner's own entry matches: it supplies the score and drops out.
      float winner_score = 0.0f;
MEGAMOE_ROUTER_UNROLL
      for (int i = 0; i < kSlots; ++i)
        if (keys[i] == best) winner_score = score[i], keys[i] = 0;
      const float weight = __shfl_sync(kFullMask, winner_score, expert % 32);
      if (lane == expert % 32) lane_best = best_of(keys);
      if (lane == j) my_id = expert, my_weight = weight;
    }
  }

  my_weight = finish_weight(p, my_id, my_weight);
  if (lane < p.top_k) out_ids[lane] = my_id, out_weights[lane] = my_weight;
}

// ---- launcher -------------------------------------------------------------------------------------
#ifndef MEGAMOE_ROUTER_HOST_EMULATION

template <int kSlots>
void launch_router_kernel(const RouterParams& params, cudaStream_t stream) {
  const int64_t blocks = (static_cast<int64_t>(params.num_tokens) + kRouterWarpsPerBlock - 1) / kRouterWarpsPerBlock;
  sm90_router_kernel<kSlots><<<static_cast<unsigned>(blocks), kRouterWarpsPerBlock * 32, 0, stream>>>(params);
  MEGAMOE_LAUNCH_CHECK();
}

// Raw launcher: pointers and sizes as in RouterParams, already validated (router_cuda.cu). Picks the
// smallest experts-per-lane count that covers E. Launches nothing for T == 0.
inline void launch_router(const RouterParams& params, cudaStream_t stream) {
  if (params.num_tokens == 0) return;
  const int slots = (params.num_experts + 31) / 32;
  if (slots <= 1) launch_router_kernel<1>(params, stream);
  else if (slots <= 2) launch_router_kernel<2>(params, stream);
  else if (slots <= 4) launch_router_kernel<4>(params, stream);
  else if (slots <= 8) launch_router_kernel<8>(params, stream);
  else launch_router_kernel<16>(params, stream);
}
#endif  // MEGAMOE_ROUTER_HOST_EMULATION

}  // namespace megamoe::kernels::sm90
