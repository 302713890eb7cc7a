// CUDA routers: the kernels behind every RouterKind of routing.h, same results as route_reference.
//
// Three layers (DeepGEMM style):
//   __global__ kernel + launcher   src/kernels/sm90_router.cuh (raw device pointers + sizes + stream)
//   typed validating API           this header, implemented in src/routing/router_cuda.cu
//
// Contract (identical to route_reference, see the NOTES in src/routing/router_reference.cpp):
//   ids [T, top_k] int32 (-1 = none) and weights [T, top_k] fp32; padding rows and NaN logits as
//   there; ties to the lowest id; ids of a row in descending selection-score order. The kernels use
//   the reference's order of fp32 operations with IEEE division/sqrt and CUDA's expf/log1pf, which
//   may differ from the host libm by 1-2 ulp: ids are identical except where two candidates' scores
//   are within a few ulp of each other (never for softmax without a bias, where the logits select),
//   weights agree to a few ulp.
//
// Capturable in a CUDA graph: one kernel launch (none when T == 0), no allocation, no host sync.
//
// Bad device data (which the host cannot see without a sync): a +inf logit, a non-finite
// correction_bias, a token id outside [0, hash_vocab) or a hash_table entry outside [0, E) makes
// the affected rows (every row for a bad bias) ids -1 / weights 0 -- never an out-of-bounds access --
// and, when `status` is given, records the first such error (lowest token, then kind, then index)
// in that device word. check_router_status() reads it (synchronizing) and throws megamoe::Error
// naming the field and the limit, like route_reference would have.
#pragma once

#include <cstdint>
#include <string>

#include "megamoe/moe.h"  // StreamHandle
#include "megamoe/routing.h"

namespace megamoe {

// Limits of the CUDA kernels (route_cuda checks them): one warp per token holds E/32 scores per lane.
inline constexpr int kCudaRouterMaxExperts = 512;
inline constexpr int kCudaRouterMaxTopK = 16;

// Device-side error word: kRouterStatusOk (all ones) or (token << 32) | (error << 28) | index.
// Errors are ordered like route_reference's checks, so atomicMin keeps the one it would throw.
enum class RouterDeviceError : uint32_t {
  kBadCorrectionBias = 1,  // index = expert
  kPositiveInfLogit = 2,   // index = expert
  kTokenIdOutOfRange = 3,  // index = 0
  kHashEntryOutOfRange = 4,  // index = slot j of hash_table[token_ids[t], j]
};
inline constexpr uint64_t kRouterStatusOk = ~uint64_t{0};

struct RouterDeviceInputs {
  const float* logits = nullptr;           // [T, E] device
  int64_t num_tokens = 0;                  // T, in [0, 2^31)
  const float* correction_bias = nullptr;  // [E] device or null; selection only (DeepSeek)
  const uint8_t* padding = nullptr;        // [T] device or null; nonzero -> ids -1, weights 0
  const int32_t* token_ids = nullptr;      // [T] device, kHash only
  const int32_t* hash_table = nullptr;     // [hash_vocab, top_k] device, kHash only
  int64_t hash_vocab = 0;                  // rows of hash_table
  uint64_t* status = nullptr;              // [1] device or null: error word (see above), sticky
};

// Writes topk_ids [T, top_k] and topk_weights [T, top_k] (device) on `stream` (a cudaStream_t).
// Throws megamoe::Error for a bad config, sizes beyond the kernel limits or missing pointers.
void route_cuda(const RouterConfig& config, const RouterDeviceInputs& inputs, int32_t* topk_ids,
                float* topk_weights, StreamHandle stream);

// Sets *inputs.status to kRouterStatusOk on `stream` (a memset node; capturable).
void reset_router_status(uint64_t* status, StreamHandle stream);

// Synchronizes `stream`, reads *inputs.status and throws megamoe::Error describing the recorded error,
// if any. Not capturable (it reads device memory on the host).
void check_router_status(const RouterConfig& config, const RouterDeviceInputs& inputs, StreamHandle stream);

// Message for a status word ("" for kRouterStatusOk); `config` and `hash_vocab` supply the limits.
std::string describe_router_status(uint64_t status, const RouterConfig& config, int64_t hash_vocab);

}  // namespace megamoe
