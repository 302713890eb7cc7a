// Token dispatch and combine across an EpGroup (typed, validating API over the sm90 kernels).
//
//   EpDispatcher ep_io(group, {hidden, top_k, num_experts, capacity, EpPayload::kFp8});  // collective
//   ep_io.dispatch(hidden_bf16, topk_ids, topk_weights, stream);   // every rank, T may differ
//   const ReceivedTokens& rx = ep_io.received();   // grouped by local expert, device-side offsets
//   ... expert GEMMs: rows [rx.expert_offsets[e], rx.expert_offsets[e+1]) -> expert_out[row] (bf16) ...
//   ep_io.combine(expert_out, out_bf16, stream, /*apply_weights=*/true);
//
// Semantics (bit-exact, tested):
// - Each token is sent ONCE to every rank that holds at least one of its top-k experts (expert e lives
//   on rank e / (E / ranks)); ids of -1 are padding and go nowhere. Payload kFp8: the BF16 row is
//   quantized per 128 channels exactly as formats::quantize_fp8_activations (scale = amax/448 with
//   amax floored at 1e-10, __fdiv_rn, RNE, saturating); kBf16: the row is copied.
// - The receiver learns its counts from device counters (never the host) and groups the rows by
//   local expert: a token with two experts on this rank appears in two grouped rows. Row order inside
//   an expert is unspecified; every row carries its RowSource, and results never depend on the order.
// - combine(): each rank reduces, for every token it received, the BF16 outputs of its local experts
//   and sends one BF16 row back to the source (one row per (token, rank), not per (token, slot)):
//       partial[t, r] = bf16_rne(acc), acc = 0; for j in 0..top_k-1 (in order) with ids[t,j] on rank r:
//                                               acc = fmaf(w[t,j], y[t,j], acc)
//       out[t] = bf16_rne(sum over ranks r in order that hold one of t's experts of float(partial[t, r]))
//   (w = 1 when apply_weights is false). Deterministic; with all of a token's experts on one rank (and
//   always with one rank) out = bf16_rne(fp32 fmaf sum over its slots in order), otherwise each
//   rank's partial is rounded to BF16 once before the fp32 sum.
// - Capacity: T <= max_tokens_per_rank is checked on the host before anything is launched.
//   dispatch() and combine() must alternate; both are collective and CUDA-graph capturable.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "megamoe/ep.h"
#include "megamoe/tensor.h"

namespace megamoe {

enum class EpPayload : uint8_t { kFp8, kBf16 };

struct EpDispatchConfig {
  int hidden = 0;               // H, multiple of 128
  int top_k = 0;                // 1..32
  int num_experts = 0;          // E, global, multiple of ranks
  int max_tokens_per_rank = 0;  // capacity C
  EpPayload payload = EpPayload::kFp8;
};

struct RowSource {
  int32_t rank;    // source rank
  int32_t token;   // token index on the source rank
  int32_t slot;    // top-k slot j of that token
  float weight;    // topk_weights[token, slot]
};

// Device pointers, fixed for the dispatcher's lifetime; contents valid (stream-ordered) after dispatch().
struct ReceivedTokens {
  int num_local_experts = 0;
  int first_local_expert = 0;
  int64_t max_rows = 0;              // ranks * C * min(top_k, num_local_experts)
  const int32_t* expert_offsets = nullptr;  // [num_local_experts + 1], device
  void* x = nullptr;                 // [max_rows, H] e4m3 (kFp8) or bf16 (kBf16)
  float* x_scales = nullptr;         // [max_rows, H/128] (kFp8 only)
  const RowSource* sources = nullptr;  // [max_rows]
  const float* row_weights = nullptr;  // [max_rows]: sources[m].weight, contiguous (GEMM 1 epilogue input)
};

class EpDispatcher {
 public:
  // Collective: allocates the symmetric window (see docs/ep.md for every region's size formula).
  EpDispatcher(EpGroup& group, const EpDispatchConfig& config);
  ~EpDispatcher();
  EpDispatcher(const EpDispatcher&) = delete;
  EpDispatcher& operator=(const EpDispatcher&) = delete;

  const EpDispatchConfig& config() const;
  // Memory this dispatcher holds on this rank: cudaMalloc'ed scratch (grouped rows, counters) and
  // its symmetric window (docs/ep.md has the formulas).
  size_t device_bytes() const;
  size_t symmetric_bytes() const;
  // MEGAMOE_EP_OVERLAP as read when this dispatcher was created (1: dispatch send + receive fused into one
  // kernel, combine send + reduce fused into one kernel; docs/ep.md "Overlap"; MEGAMOE_EP_OVERLAP_DISPATCH=0
  // keeps the two-kernel dispatch beside the fused combine, for A/B). Results are bit-identical either way.
  bool overlap() const;
  // hidden [T, H] bf16, topk_ids [T, k] int32, topk_weights [T, k] f32, all on the GPU; T <= C.
  void dispatch(const TensorView& hidden, const TensorView& topk_ids, const TensorView& topk_weights,
                StreamHandle stream);
  const ReceivedTokens& received() const;
  // expert_out: [max_rows, H] bf16 device (row m = output for grouped row m); out: [T, H] bf16 with
  // the T of the preceding dispatch().
  void combine(const void* expert_out, const TensorView& out, StreamHandle stream, bool apply_weights = true);
  // Bytes this rank's last dispatch/combine moved to OTHER ranks, for bandwidth figures (needs a
  // stream sync; reads device counters).
  struct Traffic { uint64_t dispatch_bytes, combine_bytes; };
  Traffic last_remote_traffic(StreamHandle stream) const;
  // Diagnostics (`megamoe bench ep`): with timing on, dispatch()/combine() record CUDA events around
  // each kernel; last_kernel_times_us() (after a stream sync) returns {layout, send, receive,
  // combine send, combine reduce} of the latest calls in microseconds. Leave off under graph capture.
  void enable_kernel_timing(bool on);
  std::array<float, 5> last_kernel_times_us() const;
  // Idempotent; later calls throw.
  void destroy();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace megamoe
