// The staged pipeline (staged_pipeline.h): the body of the `staged` backend's forward and of the
// `mega` backend's split path.
#include "moe/staged_pipeline.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/grouped_gemm.h"
#include "kernels/sm90_gemm_heuristics.h"
#include "kernels/swiglu_quant.h"
#include "megamoe/ep.h"
#include "megamoe/error_cuda.h"
#include "moe/packed_weights.h"

namespace megamoe {

namespace {
bool is_w4a8(WeightFormat f) { return f == WeightFormat::kNvfp4 || f == WeightFormat::kMxfp4; }
}  // namespace

ExpertSlabs::Bytes ExpertSlabs::bytes(const MoeConfig& config, int local_experts) {
  const int64_t H = config.hidden, I = config.intermediate, E = local_experts;
  Bytes b;
  if (is_w4a8(config.weight_format)) {
    const kernels::PackedW4a8Size s13 = kernels::packed_w4a8_size(config.weight_format, 2 * I, H);
    const kernels::PackedW4a8Size s2 = kernels::packed_w4a8_size(config.weight_format, H, I);
    b.w13 = E * s13.data_bytes;
    b.w2 = E * s2.data_bytes;
    b.w13_group_scales = E * s13.group_scale_bytes;
    b.w2_group_scales = E * s2.group_scale_bytes;
    b.w13_blocks = E * s13.block_count * sizeof(kernels::W4a8BlockScale);
    b.w2_blocks = E * s2.block_count * sizeof(kernels::W4a8BlockScale);
    return b;
  }
  const int64_t element_bytes = config.weight_format == WeightFormat::kBf16 ? 2 : 1;
  b.w13 = E * 2 * I * H * element_bytes;
  b.w2 = E * H * I * element_bytes;
  if (config.weight_format == WeightFormat::kFp8Block) {
    b.w13_scales = sizeof(float) * E * ((2 * I + 127) / 128) * ((H + 127) / 128);
    b.w2_scales = sizeof(float) * E * ((H + 127) / 128) * ((I + 127) / 128);
  }
  return b;
}

ExpertSlabs ExpertSlabs::allocate(const MoeConfig& config, int local_experts, kernels::GemmRole gate_up_packing,
                                  const std::function<void*(size_t)>& alloc) {
  ExpertSlabs s;
  s.format = config.weight_format;
  s.gate_up_packing = gate_up_packing;
  const Bytes b = bytes(config, local_experts);
  s.w13 = alloc(b.w13);
  s.w2 = alloc(b.w2);
  if (is_w4a8(s.format)) {
    s.w13_group_scales = static_cast<uint8_t*>(alloc(b.w13_group_scales));
    s.w2_group_scales = static_cast<uint8_t*>(alloc(b.w2_group_scales));
    s.w13_blocks = static_cast<kernels::W4a8BlockScale*>(alloc(b.w13_blocks));
    s.w2_blocks = static_cast<kernels::W4a8BlockScale*>(alloc(b.w2_blocks));
  } else if (s.format == WeightFormat::kFp8Block) {
    s.w13_scales = static_cast<float*>(alloc(b.w13_scales));
    s.w2_scales = static_cast<float*>(alloc(b.w2_scales));
  }
  return s;
}

void ExpertSlabs::load(const MoeConfig& config, int local_expert, const ExpertWeights& w) const {
  const int64_t H = config.hidden, I = config.intermediate;
  if (is_w4a8(format)) {
    load_gate_up(config, local_expert, w);
    upload_packed_w4a8_expert("w2", w.w2, format, H, I, local_expert, kernels::GemmRole::kDown, w2, w2_group_scales,
                              w2_blocks);
    return;
  }
  load_gate_up(config, local_expert, w);
  upload_packed_expert("w2", w.w2, format, H, I, local_expert, kernels::GemmRole::kDown, w2, w2_scales);
}

void ExpertSlabs::load_gate_up(const MoeConfig& config, int local_expert, const ExpertWeights& w) const {
  const int64_t H = config.hidden, I = config.intermediate;
  if (is_w4a8(format)) {
    // W13 in `gate_up_packing` (kGateUp: the old GEMM-1 kernels and mega's fused kernel; kGateUpInterleaved8: W4A8
    // v10 GEMM 1); both packings have the same per-expert sizes (packed_w4a8_size).
    MEGAMOE_CHECK(gate_up_packing == kernels::GemmRole::kGateUp ||
                      gate_up_packing == kernels::GemmRole::kGateUpInterleaved8,
                  "ExpertSlabs::load_gate_up: W4A8 gate_up_packing = ", static_cast<int>(gate_up_packing),
                  " must be kGateUp or kGateUpInterleaved8");
    upload_packed_w4a8_expert("w13", w.w13, format, 2 * I, H, local_expert, gate_up_packing, w13, w13_group_scales,
                              w13_blocks);
    return;
  }
  upload_packed_expert("w13", w.w13, format, 2 * I, H, local_expert, gate_up_packing, w13, w13_scales);
}

ExpertSlabs ExpertSlabs::with_own_gate_up(const MoeConfig& config, int local_experts, kernels::GemmRole packing,
                                          const std::function<void*(size_t)>& alloc) const {
  ExpertSlabs s = *this;
  s.gate_up_packing = packing;
  const Bytes b = bytes(config, local_experts);
  s.w13 = alloc(b.w13);
  if (format == WeightFormat::kFp8Block) s.w13_scales = static_cast<float*>(alloc(b.w13_scales));
  // NOTES: W4A8 copies all three W13 slabs. The group scales follow the packing's row order; the block records are
  // the same in both packings (grouped_gemm.h "W4A8"), but a copy of them (E * 2I/128 * H/128 * 8 bytes, < 0.1 % of
  // W13) keeps the slab set self-contained (load_gate_up writes all three).
  if (is_w4a8(format)) {
    s.w13_group_scales = static_cast<uint8_t*>(alloc(b.w13_group_scales));
    s.w13_blocks = static_cast<kernels::W4a8BlockScale*>(alloc(b.w13_blocks));
  }
  return s;
}

kernels::GemmRole staged_gate_up_packing(const MoeConfig& config, bool fp8_gemm1_two_pass) {
  if (config.weight_format == WeightFormat::kFp8Block) {
    if (fp8_gemm1_two_pass) return kernels::GemmRole::kGateUp;
    const char* v9 = std::getenv("MEGAMOE_FP8_GEMM1_V9");
    const bool interleaved = v9 && *v9 ? std::string(v9) == "1" : kernels::sm90::prefer_gate_up_interleaved8(config.hidden);
    return interleaved ? kernels::GemmRole::kGateUpInterleaved8 : kernels::GemmRole::kGateUp;
  }
  if (config.weight_format == WeightFormat::kBf16)
    return kernels::bf16_gemm_v2_default() ? kernels::GemmRole::kGateUpInterleaved8 : kernels::GemmRole::kGateUp;
  MEGAMOE_CHECK(is_w4a8(config.weight_format), "staged_gate_up_packing: weight_format ",
                weight_format_name(config.weight_format), " has no GEMM-1 packing");
  return kernels::w4a8_gemm1_packing();  // MEGAMOE_W4A8_G1_V10 (read once per process; set_w4a8_g1_v10 overrides)
}

StagedScratch::~StagedScratch() {
  if (io) io->destroy();
  for (void* p : allocations) cudaFree(p);
}

void* StagedScratch::alloc(size_t bytes) {
  void* p = nullptr;
  MEGAMOE_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
  allocations.push_back(p);
  device_bytes += std::max<size_t>(bytes, 16);
  return p;
}

namespace {
// NOTES: the key keeps its "staged" prefix and fields as before the pipeline was shared, so a staged
// layer and a mega layer's split path of one geometry and group find the same region.
std::string staged_scratch_key(const MoeConfig& c, const EpGroup& ep) {
  return detail::concat("staged H=", c.hidden, " I=", c.intermediate, " E=", c.num_experts, " k=", c.top_k,
                        " C=", c.max_tokens_per_rank, " format=", weight_format_name(c.weight_format), " group=",
                        static_cast<const void*>(&ep), " ranks=", ep.size());
}
}  // namespace

std::shared_ptr<StagedScratch> acquire_staged_scratch(MoeWorkspace& workspace, const MoeConfig& config, EpGroup& ep,
                                                      bool fp8_gemm1_two_pass) {
  const bool fp8 = config.weight_format != WeightFormat::kBf16;  // FP8 activations (fp8_block, W4A8)
  auto scratch = std::static_pointer_cast<StagedScratch>(workspace.acquire(staged_scratch_key(config, ep), [&] {
    auto scratch = std::make_shared<StagedScratch>();
    EpDispatchConfig dc;
    dc.hidden = config.hidden;
    dc.top_k = config.top_k;
    dc.num_experts = config.num_experts;
    dc.max_tokens_per_rank = config.max_tokens_per_rank;
    dc.payload = fp8 ? EpPayload::kFp8 : EpPayload::kBf16;
    scratch->io = std::make_unique<EpDispatcher>(ep, dc);  // collective
    scratch->device_bytes += scratch->io->device_bytes();
    scratch->symmetric_bytes += scratch->io->symmetric_bytes();
    const int64_t rows = scratch->io->received().max_rows;
    const int64_t H = config.hidden, I = config.intermediate;
    if (fp8) scratch->act_scales = static_cast<float*>(scratch->alloc(sizeof(float) * rows * (I / 128)));
    scratch->act = scratch->alloc(rows * I * (fp8 ? 1 : 2));
    scratch->y = static_cast<__nv_bfloat16*>(scratch->alloc(2 * rows * H));
    return scratch;
  }));
  if (fp8_gemm1_two_pass) {
    // NOTES: the region's key does not name the two-pass switch, so the staged layers of a geometry (and a mega
    // layer's split path) keep sharing one region; the BF16 buffer joins it on the first request.
    MEGAMOE_CHECK(config.weight_format == WeightFormat::kFp8Block, "the two-pass GEMM 1 is FP8-block only (weight_format ",
                  weight_format_name(config.weight_format), ")");
    const std::lock_guard<std::mutex> lock(scratch->gate_up_mutex);
    if (scratch->gate_up == nullptr)
      scratch->gate_up = static_cast<uint16_t*>(
          scratch->alloc(sizeof(uint16_t) * scratch->io->received().max_rows * 2 * config.intermediate));
  }
  return scratch;
}

StagedPhaseEvents::~StagedPhaseEvents() {
  try {
    destroy();
  } catch (...) {
  }
}

void StagedPhaseEvents::set_enabled(bool enabled) {
  if (enabled == this->enabled()) return;
  if (enabled) {
    for (cudaEvent_t& e : events_) MEGAMOE_CUDA_CHECK(cudaEventCreate(&e));
  } else {
    destroy();
  }
  recorded_ = false;
}

void StagedPhaseEvents::mark(int index, cudaStream_t stream) {
  if (events_[index] == nullptr) return;
  MEGAMOE_CUDA_CHECK(cudaEventRecord(events_[index], stream));
  if (index == kPhaseCount) recorded_ = true;
}

std::vector<MoeBackend::PhaseTime> StagedPhaseEvents::times() const {
  if (!enabled() || !recorded_) return {};
  MEGAMOE_CUDA_CHECK(cudaEventSynchronize(events_[kPhaseCount]));
  static constexpr const char* kNames[kPhaseCount] = {"dispatch", "gemm1", "gemm2", "combine"};
  std::vector<MoeBackend::PhaseTime> times;
  for (int p = 0; p < kPhaseCount; ++p) {
    float ms = 0;
    MEGAMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[p], events_[p + 1]));
    times.push_back(MoeBackend::PhaseTime{kNames[p], 1e3 * ms});
  }
  return times;
}

void StagedPhaseEvents::destroy() {
  for (cudaEvent_t& e : events_) {
    if (e != nullptr) MEGAMOE_CUDA_CHECK(cudaEventDestroy(e));
    e = nullptr;
  }
  recorded_ = false;
}

void run_staged_pipeline(const MoeConfig& config, int local_experts, StagedScratch& scratch, const ExpertSlabs& w,
                         const MoeInputs& in, MoeOutputs& out, cudaStream_t s, StagedPhaseEvents& phases) {
  EpDispatcher& io = *scratch.io;
  check_tensor("outputs.out", out.out, DType::kBF16, {in.hidden.shape[0], config.hidden}, Device::kCuda);
  phases.mark(0, s);  // before dispatch
  io.dispatch(in.hidden, in.topk_ids, in.topk_weights, s);
  phases.mark(1, s);  // after dispatch
  const ReceivedTokens& rx = io.received();
  const int H = config.hidden, I = config.intermediate;
  // Tile choice of the grouped GEMMs (sm90_gemm_heuristics.h): rows per local expert as uniform routing
  // with every rank holding this rank's token count would give (the estimate mega uses). The choice is
  // local (ranks may differ; it changes no collective step).
  // MEGAMOE_STAGED_ROWS_HINT (read once): unset or "auto" = the estimate, a number = that hint
  // (0 = unknown: the largest tiles).
  // NOTES: session 7 made the estimate opt-in after `MegaMulti.ManyGemm2TilesPerCta` hung with it; the
  // cause was a lane-divergent bar.sync in the 64-row FP8 SwiGLU bulk-store epilogue (synccheck,
  // session 8; fixed in sm90_ptx.cuh named_barrier_sync). With the estimate dsv3 FP8 at 128 tokens/rank
  // ran 2490 -> 1661 us (GEMM 2 at 8 rows/expert in 256 x 128 tiles streamed 2.1 TB/s). docs/perf.md.
  static const int forced_hint = [] {
    const char* v = std::getenv("MEGAMOE_STAGED_ROWS_HINT");
    if (v == nullptr || *v == 0 || std::string(v) == "auto") return -1;
    return std::max(0, std::atoi(v));
  }();
  const int rows_hint = forced_hint >= 0 ? forced_hint
                                         : static_cast<int>(std::max<int64_t>(
                                               1, in.hidden.shape[0] * config.top_k / std::max(1, local_experts)));
  const bool fc1_weights = config.apply_topk_in_fc1;

  if (is_w4a8(w.format)) {
    // GEMM 1's kernel follows the packing W13 was loaded with (kGateUpInterleaved8: W4A8 v10 GEMM 1, else the old
    // kernels), not the switch's current value.
    kernels::W4a8Weights w13{w.format, static_cast<const uint8_t*>(w.w13), w.w13_group_scales, w.w13_blocks,
                             w.gate_up_packing};
    kernels::W4a8Weights w2{w.format, static_cast<const uint8_t*>(w.w2), w.w2_group_scales, w.w2_blocks};
    kernels::GroupedGemm1W4a8Args g1;
    g1.a = static_cast<const uint8_t*>(rx.x);
    g1.a_scales = rx.x_scales;
    g1.weights = w13;
    g1.expert_offsets = rx.expert_offsets;
    g1.topk_weights = fc1_weights ? rx.row_weights : nullptr;
    g1.out = static_cast<uint8_t*>(scratch.act);
    g1.out_scales = scratch.act_scales;
    g1.m_capacity = rx.max_rows;
    g1.num_experts = local_experts;
    g1.hidden = H;
    g1.intermediate = I;
    g1.rows_per_expert_hint = rows_hint;
    g1.activation = config.activation;
    kernels::grouped_gemm1_w4a8(g1, s);
    phases.mark(2, s);  // after GEMM 1
    kernels::GroupedGemm2W4a8Args g2;
    g2.a = static_cast<const uint8_t*>(scratch.act);
    g2.a_scales = scratch.act_scales;
    g2.weights = w2;
    g2.expert_offsets = rx.expert_offsets;
    g2.out = reinterpret_cast<uint16_t*>(scratch.y);
    g2.m_capacity = rx.max_rows;
    g2.num_experts = local_experts;
    g2.hidden = H;
    g2.intermediate = I;
    g2.rows_per_expert_hint = rows_hint;
    kernels::grouped_gemm2_w4a8(g2, s);
    phases.mark(3, s);  // after GEMM 2
  } else if (w.format == WeightFormat::kFp8Block) {
    kernels::GroupedGemm1Fp8Args g1;
    g1.a = static_cast<const uint8_t*>(rx.x);
    g1.a_scales = rx.x_scales;
    g1.weights = static_cast<const uint8_t*>(w.w13);
    g1.weight_scales = w.w13_scales;
    g1.expert_offsets = rx.expert_offsets;
    g1.topk_weights = fc1_weights ? rx.row_weights : nullptr;
    g1.out = static_cast<uint8_t*>(scratch.act);
    g1.out_scales = scratch.act_scales;
    g1.m_capacity = rx.max_rows;
    g1.num_experts = local_experts;
    g1.hidden = H;
    g1.intermediate = I;
    g1.rows_per_expert_hint = rows_hint;
    g1.activation = config.activation;
    g1.packing = w.gate_up_packing;  // the layout the slabs were loaded with
    if (w.fp8_gemm1_two_pass) {  // plain grouped GEMM -> BF16 gate/up -> swiglu_quant_fp8 (swiglu_quant.h)
      MEGAMOE_CHECK(scratch.gate_up != nullptr,
                    "two-pass FP8 GEMM 1: the staged scratch has no gate_up buffer (acquire_staged_scratch with "
                    "fp8_gemm1_two_pass)");
      kernels::grouped_gemm1_fp8_two_pass(g1, scratch.gate_up, s);
    } else {
      kernels::grouped_gemm1_fp8(g1, s);
    }
    phases.mark(2, s);  // after GEMM 1
    kernels::GroupedGemm2Fp8Args g2;
    g2.a = static_cast<const uint8_t*>(scratch.act);
    g2.a_scales = scratch.act_scales;
    g2.weights = static_cast<const uint8_t*>(w.w2);
    g2.weight_scales = w.w2_scales;
    g2.expert_offsets = rx.expert_offsets;
    g2.out = reinterpret_cast<uint16_t*>(scratch.y);
    g2.m_capacity = rx.max_rows;
    g2.num_experts = local_experts;
    g2.hidden = H;
    g2.intermediate = I;
    g2.rows_per_expert_hint = rows_hint;
    kernels::grouped_gemm2_fp8(g2, s);
    phases.mark(3, s);  // after GEMM 2
  } else {
    kernels::GroupedGemm1Bf16Args g1;
    g1.a = static_cast<const uint16_t*>(rx.x);
    g1.weights = static_cast<const uint16_t*>(w.w13);
    g1.expert_offsets = rx.expert_offsets;
    g1.topk_weights = fc1_weights ? rx.row_weights : nullptr;
    g1.out = static_cast<uint16_t*>(scratch.act);
    g1.m_capacity = rx.max_rows;
    g1.num_experts = local_experts;
    g1.hidden = H;
    g1.intermediate = I;
    g1.rows_per_expert_hint = rows_hint;
    g1.activation = config.activation;
    g1.packing = w.gate_up_packing;  // the layout the slabs were loaded with (staged: maybe BF16 v2; mega: kGateUp)
    kernels::grouped_gemm1_bf16(g1, s);
    phases.mark(2, s);  // after GEMM 1
    kernels::GroupedGemm2Bf16Args g2;
    g2.a = static_cast<const uint16_t*>(scratch.act);
    g2.weights = static_cast<const uint16_t*>(w.w2);
    g2.expert_offsets = rx.expert_offsets;
    g2.out = reinterpret_cast<uint16_t*>(scratch.y);
    g2.m_capacity = rx.max_rows;
    g2.num_experts = local_experts;
    g2.hidden = H;
    g2.intermediate = I;
    g2.rows_per_expert_hint = rows_hint;
    kernels::grouped_gemm2_bf16(g2, s);
    phases.mark(3, s);  // after GEMM 2
  }
  io.combine(scratch.y, out.out, s, /*apply_weights=*/!config.apply_topk_in_fc1);
  phases.mark(4, s);  // after combine
}

}  // namespace megamoe
