// The staged pipeline as a reusable piece: EP dispatch (EpDispatcher) -> grouped GEMM 1 (+ activation,
// top-k weight, requant) -> grouped GEMM 2 -> combine, on a layer's packed expert slabs. The `staged`
// backend is this pipeline on its own slabs; the `mega` backend runs it on ITS slabs as its "split"
// path (mega_path_heuristics.h). Host C++ over the CUDA launchers; included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/grouped_gemm.h"
#include "megamoe/ep_dispatch.h"
#include "megamoe/moe.h"

namespace megamoe {

// One layer's packed experts on the device, in the grouped GEMM layouts (kernels/grouped_gemm.h):
//   FP8-block : w13 [E, 2I, H] e4m3 packed with `gate_up_packing`, w13_scales [E, 2I/128, H/128];
//               w2 [E, H, I] e4m3 (kDown), w2_scales [E, H/128, I/128]
//   BF16      : w13 [E, 2I, H] bf16 packed with `gate_up_packing` (kGateUp, or kGateUpInterleaved8 for
//               the BF16 v2 GEMM-1 kernel), w2 [E, H, I] bf16 (kDown), no scales
//   W4A8      : pack_w4a8_expert_weights, W13 with `gate_up_packing` (kGateUp, or kGateUpInterleaved8 for W4A8 v10
//               GEMM 1), W2 kDown: data, group scales and block records (packed_w4a8_size per expert)
// NOTES: both backends allocate and load through this struct. mega FP8-block and W4A8 pack W13 with
// staged_gate_up_packing (their fused kernels' GEMM 1 reads kGateUpInterleaved8 too: one W13 for both paths,
// docs/mega.md "One W13"); mega BF16 and FP8 / W4A8 with MEGAMOE_MEGA_OWN_GATE_UP=1 pack kGateUp for the fused tiles
// and, where its split path can run and staged_gate_up_packing differs (BF16 v2; FP8 v9; W4A8 v10 GEMM 1,
// the default), a second W13 in that packing (with_own_gate_up: W13 memory twice, W2 shared); staged packs
// staged_gate_up_packing only. run_staged_pipeline hands `gate_up_packing` to grouped_gemm1_fp8 / grouped_gemm1_bf16
// / grouped_gemm1_w4a8 (W4a8Weights::packing), which pick the kernel for that layout.
struct ExpertSlabs {
  WeightFormat format = WeightFormat::kBf16;
  kernels::GemmRole gate_up_packing = kernels::GemmRole::kGateUp;
  // FP8-block only: GEMM 1 in two passes (kernels/swiglu_quant.h: the plain grouped GEMM into
  // StagedScratch::gate_up, then swiglu_quant_fp8) instead of the fused SwiGLU epilogue. Needs
  // gate_up_packing == kGateUp and a scratch acquired with fp8_gemm1_two_pass. The staged backend sets it
  // from MEGAMOE_FP8_GEMM1_TWO_PASS; mega never does.
  bool fp8_gemm1_two_pass = false;
  void *w13 = nullptr, *w2 = nullptr;
  float *w13_scales = nullptr, *w2_scales = nullptr;                     // FP8-block
  uint8_t *w13_group_scales = nullptr, *w2_group_scales = nullptr;      // W4A8
  kernels::W4a8BlockScale *w13_blocks = nullptr, *w2_blocks = nullptr;  // W4A8

  // Bytes of each slab for `local_experts` experts of `config`'s geometry: what allocate (and, for W13,
  // with_own_gate_up) requests; 0 for the slabs a format does not have.
  struct Bytes {
    size_t w13 = 0, w2 = 0;
    size_t w13_scales = 0, w2_scales = 0;              // FP8-block
    size_t w13_group_scales = 0, w2_group_scales = 0;  // W4A8
    size_t w13_blocks = 0, w2_blocks = 0;              // W4A8
    size_t gate_up_total() const { return w13 + w13_scales + w13_group_scales + w13_blocks; }
    size_t down_total() const { return w2 + w2_scales + w2_group_scales + w2_blocks; }
  };
  static Bytes bytes(const MoeConfig& config, int local_experts);
  // Slabs for `local_experts` experts of `config`'s geometry; `alloc(bytes)` returns device memory the
  // caller owns.
  static ExpertSlabs allocate(const MoeConfig& config, int local_experts, kernels::GemmRole gate_up_packing,
                              const std::function<void*(size_t)>& alloc);
  // Checks, packs and uploads one expert (synchronous; packed_weights.h).
  void load(const MoeConfig& config, int local_expert, const ExpertWeights& weights) const;
  // This slab set with its own W13 (and FP8 W13 scales, W4A8 W13 group scales and block records) packed with
  // `gate_up_packing`, sharing W2: how mega gives its split path the staged pipeline's GEMM-1 layout where its fused
  // kernel reads kGateUp (BF16; W4A8 and FP8 only with MEGAMOE_MEGA_OWN_GATE_UP=1).
  ExpertSlabs with_own_gate_up(const MoeConfig& config, int local_experts, kernels::GemmRole gate_up_packing,
                               const std::function<void*(size_t)>& alloc) const;
  // Packs and uploads W13 of one expert only (the slab set from with_own_gate_up).
  void load_gate_up(const MoeConfig& config, int local_expert, const ExpertWeights& weights) const;
};

// The W13 packing the staged pipeline runs best on (made once at load time, so one choice for every rows hint):
//   FP8-block: kGateUpInterleaved8 (v9 / v11 GEMM 1) where sm90::prefer_gate_up_interleaved8 (every hidden since
//              session 13), else kGateUp (split-N tiles); MEGAMOE_FP8_GEMM1_V9=1 / 0 forces one; kGateUp whenever
//              fp8_gemm1_two_pass (its plain GEMM needs the by-128 gate/up order).
//   BF16:      kGateUpInterleaved8 (BF16 v2 GEMM 1) when kernels::bf16_gemm_v2_default(), else kGateUp.
//   W4A8:      kernels::w4a8_gemm1_packing(): kGateUpInterleaved8 (the default since session 19: the 2-warpgroup
//              interleaved mode at rows hints <= 32, small-M interleaved at 33..64, W4A8 v10 GEMM 1 above), kGateUp
//              (the old GEMM-1 kernels) with MEGAMOE_W4A8_G1_V10=0 (read once per process; kernels::set_w4a8_g1_v10
//              overrides it). Read when a layer is made: a layer keeps its packing.
kernels::GemmRole staged_gate_up_packing(const MoeConfig& config, bool fp8_gemm1_two_pass);

// What staged pipelines share (MoeWorkspace): the dispatcher (EP window + grouped rows + counters), the
// GEMM-1 output, its scales and the GEMM-2 output. rows = ranks * C * min(top_k, local experts):
//   act        rows * I * (1 for FP8 / W4A8, 2 for BF16) bytes
//   act_scales rows * I/128 * 4 bytes (FP8 / W4A8)
//   y          rows * H * 2 bytes
//   gate_up    rows * 2I * 2 bytes, only once a user asked for the two-pass FP8 GEMM 1 (BF16 gate/up)
// plus the dispatcher's device and symmetric bytes (docs/ep.md).
struct StagedScratch final : MoeWorkspace::Shared {
  std::unique_ptr<EpDispatcher> io;
  void* act = nullptr;
  float* act_scales = nullptr;
  __nv_bfloat16* y = nullptr;
  uint16_t* gate_up = nullptr;  // BF16 bits [rows, 2I], packed gate/up order; null unless two-pass was asked for
  std::mutex gate_up_mutex;     // acquire_staged_scratch's lazy allocation of gate_up (layers share the region)
  std::vector<void*> allocations;
  ~StagedScratch() override;
  void* alloc(size_t bytes);
};

// The region for `config` on `group` from `workspace`, made on first use (collective: the dispatcher
// allocates its symmetric window). The key names the backend-independent geometry, so a staged layer
// and a mega layer's split path of one geometry share one region (layers never overlap in time).
// fp8_gemm1_two_pass: also make sure the region has gate_up (allocated on the first such request, at backend
// creation, never during a forward).
std::shared_ptr<StagedScratch> acquire_staged_scratch(MoeWorkspace& workspace, const MoeConfig& config, EpGroup& group,
                                                      bool fp8_gemm1_two_pass = false);

// CUDA events at the four phase boundaries (dispatch, gemm1, gemm2, combine) of a pipeline run.
// NOTES: five events bound the four phases. Recording an event is one stream operation (~1-2 us, no
// host synchronisation), so the timed forward stays what it was. Create / destroy outside graph capture.
class StagedPhaseEvents {
 public:
  StagedPhaseEvents() = default;
  StagedPhaseEvents(const StagedPhaseEvents&) = delete;
  StagedPhaseEvents& operator=(const StagedPhaseEvents&) = delete;
  ~StagedPhaseEvents();
  void set_enabled(bool enabled);
  bool enabled() const { return events_[0] != nullptr; }
  // Boundary `index` of kPhaseCount + 1; a no-op when disabled.
  void mark(int index, cudaStream_t stream);
  // The last run's phases (waits for its last event); empty when disabled or nothing ran since enabling.
  std::vector<MoeBackend::PhaseTime> times() const;
  void destroy();

  static constexpr int kPhaseCount = 4;

 private:
  cudaEvent_t events_[kPhaseCount + 1] = {};
  bool recorded_ = false;
};

// One forward of the pipeline on this rank (collective over scratch.io's group): dispatch, GEMM 1,
// GEMM 2, combine, with `phases` marked at the boundaries. Checks outputs.out; the dispatcher checks
// the inputs and the capacity before anything is launched. The grouped GEMMs' tile choice uses this
// rank's rows per local expert (MEGAMOE_STAGED_ROWS_HINT overrides it, staged_pipeline.cu).
void run_staged_pipeline(const MoeConfig& config, int local_experts, StagedScratch& scratch, const ExpertSlabs& weights,
                         const MoeInputs& in, MoeOutputs& out, cudaStream_t stream, StagedPhaseEvents& phases);

}  // namespace megamoe
