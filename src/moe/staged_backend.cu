// `staged` backend. Experts run on the sm90 wgmma grouped GEMMs (kernels/grouped_gemm.h): FP8-block
// (GEMM 1 with the SwiGLU + top-k weight + FP8 requant epilogue, GEMM 2 with BF16 out) and BF16 x BF16
// (GEMM 1 with the SwiGLU + top-k weight epilogue to BF16, GEMM 2 with BF16 out), and W4A8 (NVFP4 / MXFP4
// weights decoded to FP8 in the mainloop, the FP8 epilogues; weights packed by pack_w4a8_expert_weights).
#include <cuda_bf16.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "backends/registry.h"
#include "kernels/grouped_gemm.h"
#include "kernels/sm90_gemm_heuristics.h"
#include "megamoe/ep.h"
#include "megamoe/ep_dispatch.h"
#include "megamoe/error_cuda.h"
#include "moe/packed_weights.h"
#include "moe/staged_backend.h"

namespace megamoe {
namespace {

// Empty when `staged` can run `c` on `ranks` ranks, else the reason (names the field and the limit).
std::string staged_reject_reason(const MoeConfig& c, int ranks) {
  auto text = [](auto&&... parts) { return detail::concat(parts...); };
  if (ranks < 1 || ranks > kMaxEpRanks) return text("ranks = ", ranks, " must be in [1, ", kMaxEpRanks, "]");
  const bool w4a8 = c.weight_format == WeightFormat::kNvfp4 || c.weight_format == WeightFormat::kMxfp4;
  if (c.weight_format != WeightFormat::kBf16 && c.weight_format != WeightFormat::kFp8Block && !w4a8)
    return text("weight_format ", weight_format_name(c.weight_format),
                " needs the grouped GEMM kernels (staged runs bf16, fp8_block, nvfp4 and mxfp4)");
  if (c.hidden <= 0 || c.hidden % 128 != 0) return text("hidden = ", c.hidden, " must be a positive multiple of 128");
  if (w4a8 && c.hidden % 256 != 0)
    return text("hidden = ", c.hidden, " must be a multiple of 256 for ", weight_format_name(c.weight_format),
                " (the W4A8 kernel's 256-column tiles)");
  if (c.intermediate <= 0 || c.intermediate % 128 != 0)
    return text("intermediate = ", c.intermediate, " must be a positive multiple of 128");
  if (c.num_experts <= 0 || c.num_experts % ranks != 0)
    return text("num_experts = ", c.num_experts, " must be a positive multiple of ranks = ", ranks);
  if (c.top_k < 1 || c.top_k > std::min(32, c.num_experts))
    return text("top_k = ", c.top_k, " must be in [1, min(32, num_experts)]");
  if (c.max_tokens_per_rank < 1) return text("max_tokens_per_rank = ", c.max_tokens_per_rank, " must be >= 1");
  if (c.shared_intermediate > 0) return text("shared_intermediate = ", c.shared_intermediate, ": shared experts are not supported");
  return {};
}

// What staged layers share (MoeWorkspace): the dispatcher (EP window + grouped rows + counters), the
// GEMM-1 output, its scales and the GEMM-2 output. rows = ranks * C * min(top_k, local experts).
struct StagedScratch final : MoeWorkspace::Shared {
  std::unique_ptr<EpDispatcher> io;
  void* act = nullptr;                    // [rows, I] fp8 (fp8/W4A8) or bf16
  float* act_scales = nullptr;            // [rows, I/128] (fp8/W4A8)
  __nv_bfloat16* y = nullptr;             // [rows, H] bf16
  std::vector<void*> allocations;
  ~StagedScratch() override {
    if (io) io->destroy();
    for (void* p : allocations) cudaFree(p);
  }
  void* alloc(size_t bytes) {
    void* p = nullptr;
    MEGAMOE_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    allocations.push_back(p);
    device_bytes += std::max<size_t>(bytes, 16);
    return p;
  }
};

std::string staged_scratch_key(const MoeConfig& c, const EpGroup& ep) {
  return detail::concat("staged H=", c.hidden, " I=", c.intermediate, " E=", c.num_experts, " k=", c.top_k,
                        " C=", c.max_tokens_per_rank, " format=", weight_format_name(c.weight_format), " group=",
                        static_cast<const void*>(&ep), " ranks=", ep.size());
}

class StagedBackend final : public MoeBackend {
 public:
  StagedBackend(const MoeConfig& config, EpGroup* ep, std::shared_ptr<MoeWorkspace> workspace) : config_(config) {
    const int ranks = ep ? ep->size() : 1;
    const std::string why = staged_reject_reason(config, ranks);
    MEGAMOE_CHECK(why.empty(), "backend staged cannot run this configuration: ", why);
    if (!ep) {
      const auto path = std::filesystem::temp_directory_path() /
                        ("megamoe-staged-" + std::to_string(getpid()) + "-" + std::to_string(reinterpret_cast<uintptr_t>(this)));
      own_group_ = EpGroup::bootstrap(0, 1, "file:" + path.string());
      ep = own_group_.get();
    }
    ep_ = ep;
    local_experts_ = config.num_experts / ep->size();
    first_expert_ = ep->rank() * local_experts_;
    w4a8_ = config.weight_format == WeightFormat::kNvfp4 || config.weight_format == WeightFormat::kMxfp4;
    fp8_ = config.weight_format == WeightFormat::kFp8Block || w4a8_;  // FP8 activations
    // GEMM-1 weight layout, i.e. which FP8-block GEMM-1 kernel runs (grouped_gemm.h): the packed layout is
    // made once at load time, so the choice is made here, per backend: v9 (gate/up interleaved by 8,
    // split-M 128 x 256) where sm90::prefer_gate_up_interleaved8(hidden) (measured crossover, see there),
    // else the split-N tiles; MEGAMOE_FP8_GEMM1_V9=1 / 0 forces one (docs/grouped_gemm.md "v9").
    // W4A8 / BF16 keep their own layouts.
    if (config.weight_format == WeightFormat::kFp8Block) {
      const char* v9 = std::getenv("MEGAMOE_FP8_GEMM1_V9");
      const bool use_v9 = v9 && *v9 ? std::string(v9) == "1" : kernels::sm90::prefer_gate_up_interleaved8(config.hidden);
      gate_up_packing_ = use_v9 ? kernels::GemmRole::kGateUpInterleaved8 : kernels::GemmRole::kGateUp;
    }
    if (!workspace) workspace = make_moe_workspace();  // one layer: a private region
    workspace_ = workspace;
    const int64_t H = config.hidden, I = config.intermediate, E = local_experts_;
    const size_t wbytes = fp8_ ? 1 : 2;
    const bool fp8 = fp8_;
    scratch_ = std::static_pointer_cast<StagedScratch>(workspace->acquire(staged_scratch_key(config, *ep), [&] {
      auto scratch = std::make_shared<StagedScratch>();
      EpDispatchConfig dc;
      dc.hidden = config.hidden;
      dc.top_k = config.top_k;
      dc.num_experts = config.num_experts;
      dc.max_tokens_per_rank = config.max_tokens_per_rank;
      dc.payload = fp8 ? EpPayload::kFp8 : EpPayload::kBf16;
      scratch->io = std::make_unique<EpDispatcher>(*ep, dc);  // collective
      scratch->device_bytes += scratch->io->device_bytes();
      scratch->symmetric_bytes += scratch->io->symmetric_bytes();
      const int64_t rows = scratch->io->received().max_rows;
      if (fp8) scratch->act_scales = static_cast<float*>(scratch->alloc(sizeof(float) * rows * (I / 128)));
      scratch->act = scratch->alloc(rows * I * wbytes);
      scratch->y = static_cast<__nv_bfloat16*>(scratch->alloc(2 * rows * H));
      return scratch;
    }));
    io_ = scratch_->io.get();
    act_ = scratch_->act;
    act_scales_ = scratch_->act_scales;
    y_ = scratch_->y;

    if (w4a8_) {
      const kernels::PackedW4a8Size s13 = kernels::packed_w4a8_size(config.weight_format, 2 * I, H);
      const kernels::PackedW4a8Size s2 = kernels::packed_w4a8_size(config.weight_format, H, I);
      w13_ = alloc(E * s13.data_bytes);
      w2_ = alloc(E * s2.data_bytes);
      w13_group_scales_ = static_cast<uint8_t*>(alloc(E * s13.group_scale_bytes));
      w2_group_scales_ = static_cast<uint8_t*>(alloc(E * s2.group_scale_bytes));
      w13_blocks_ = static_cast<kernels::W4a8BlockScale*>(alloc(E * s13.block_count * sizeof(kernels::W4a8BlockScale)));
      w2_blocks_ = static_cast<kernels::W4a8BlockScale*>(alloc(E * s2.block_count * sizeof(kernels::W4a8BlockScale)));
    } else {
      w13_ = alloc(E * 2 * I * H * wbytes);
      w2_ = alloc(E * H * I * wbytes);
    }
    if (fp8_ && !w4a8_) {
      w13_scales_ = static_cast<float*>(alloc(sizeof(float) * E * ((2 * I + 127) / 128) * ((H + 127) / 128)));
      w2_scales_ = static_cast<float*>(alloc(sizeof(float) * E * ((H + 127) / 128) * ((I + 127) / 128)));
    }
    loaded_.assign(E, false);
  }
  ~StagedBackend() override {
    try {
      destroy();
    } catch (...) {
    }
  }

  std::string_view name() const override { return "staged"; }
  Capabilities capabilities() const override { return staged_capabilities(); }
  const MoeConfig& config() const override { return config_; }
  int first_local_expert() const override { return first_expert_; }
  int num_local_experts() const override { return local_experts_; }

  void load_expert(int local_expert, const ExpertWeights& w) override {
    require_alive("load_expert");
    MEGAMOE_CHECK(local_expert >= 0 && local_expert < local_experts_, "local_expert = ", local_expert,
                  " must be in [0, ", local_experts_, ")");
    const int64_t H = config_.hidden, I = config_.intermediate;
    if (w4a8_) {
      upload_packed_w4a8_expert("w13", w.w13, config_.weight_format, 2 * I, H, local_expert, kernels::GemmRole::kGateUp,
                                w13_, w13_group_scales_, w13_blocks_);
      upload_packed_w4a8_expert("w2", w.w2, config_.weight_format, H, I, local_expert, kernels::GemmRole::kDown, w2_,
                                w2_group_scales_, w2_blocks_);
    } else {
      copy_matrix("w13", w.w13, 2 * I, H, local_expert, w13_, w13_scales_, gate_up_packing_);
      copy_matrix("w2", w.w2, H, I, local_expert, w2_, w2_scales_, kernels::GemmRole::kDown);
    }
    loaded_[local_expert] = true;
  }
  void load_shared_expert(const ExpertWeights&) override {
    MEGAMOE_FAIL("backend staged: shared experts are not supported (Capabilities::supports_shared_expert = false)");
  }

  void warmup(StreamHandle stream) override {
    require_alive("warmup");
    ep_->warmup(stream);
    // Dry run with zero tokens: exercises every kernel and the bounded waits once.
    MoeInputs in;
    in.hidden = TensorView::make2d(nullptr, DType::kBF16, 0, config_.hidden, Device::kCuda);
    in.topk_ids = TensorView::make2d(nullptr, DType::kI32, 0, config_.top_k, Device::kCuda);
    in.topk_weights = TensorView::make2d(nullptr, DType::kF32, 0, config_.top_k, Device::kCuda);
    MoeOutputs out;
    out.out = TensorView::make2d(nullptr, DType::kBF16, 0, config_.hidden, Device::kCuda);
    forward(in, out, stream);
    ep_->synchronize(stream);
    warmed_up_ = true;
  }

  void forward(const MoeInputs& in, MoeOutputs& out, StreamHandle stream) override {
    require_alive("forward");
    for (int e = 0; e < local_experts_; ++e)
      MEGAMOE_CHECK(loaded_[e], "backend staged: local expert ", e, " (global ", first_expert_ + e,
                    ") was never loaded with load_expert()");
    const auto s = static_cast<cudaStream_t>(stream);
    check_tensor("outputs.out", out.out, DType::kBF16, {in.hidden.shape[0], config_.hidden}, Device::kCuda);
    mark_phase(0, s);  // before dispatch
    io_->dispatch(in.hidden, in.topk_ids, in.topk_weights, stream);
    mark_phase(1, s);  // after dispatch
    const ReceivedTokens& rx = io_->received();
    const int H = config_.hidden, I = config_.intermediate;
    // Tile choice of the grouped GEMMs (sm90_gemm_heuristics.h): rows per local expert as uniform routing
    // with every rank holding this rank's token count would give (the estimate mega uses).
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
                                                 1, in.hidden.shape[0] * config_.top_k / std::max(1, local_experts_)));

    if (w4a8_) {
      kernels::W4a8Weights w13{config_.weight_format, static_cast<const uint8_t*>(w13_), w13_group_scales_, w13_blocks_};
      kernels::W4a8Weights w2{config_.weight_format, static_cast<const uint8_t*>(w2_), w2_group_scales_, w2_blocks_};
      kernels::GroupedGemm1W4a8Args g1;
      g1.a = static_cast<const uint8_t*>(rx.x);
      g1.a_scales = rx.x_scales;
      g1.weights = w13;
      g1.expert_offsets = rx.expert_offsets;
      g1.topk_weights = config_.apply_topk_in_fc1 ? rx.row_weights : nullptr;
      g1.out = static_cast<uint8_t*>(act_);
      g1.out_scales = act_scales_;
      g1.m_capacity = rx.max_rows;
      g1.num_experts = local_experts_;
      g1.hidden = H;
      g1.intermediate = I;
      g1.rows_per_expert_hint = rows_hint;
      g1.activation = config_.activation;
      kernels::grouped_gemm1_w4a8(g1, s);
      mark_phase(2, s);  // after GEMM 1
      kernels::GroupedGemm2W4a8Args g2;
      g2.a = static_cast<const uint8_t*>(act_);
      g2.a_scales = act_scales_;
      g2.weights = w2;
      g2.expert_offsets = rx.expert_offsets;
      g2.out = reinterpret_cast<uint16_t*>(y_);
      g2.m_capacity = rx.max_rows;
      g2.num_experts = local_experts_;
      g2.hidden = H;
      g2.intermediate = I;
      g2.rows_per_expert_hint = rows_hint;
      kernels::grouped_gemm2_w4a8(g2, s);
      mark_phase(3, s);  // after GEMM 2
    } else if (fp8_) {
      kernels::GroupedGemm1Fp8Args g1;
      g1.a = static_cast<const uint8_t*>(rx.x);
      g1.a_scales = rx.x_scales;
      g1.weights = static_cast<const uint8_t*>(w13_);
      g1.weight_scales = w13_scales_;
      g1.expert_offsets = rx.expert_offsets;
      g1.topk_weights = config_.apply_topk_in_fc1 ? rx.row_weights : nullptr;
      g1.out = static_cast<uint8_t*>(act_);
      g1.out_scales = act_scales_;
      g1.m_capacity = rx.max_rows;
      g1.num_experts = local_experts_;
      g1.hidden = H;
      g1.intermediate = I;
      g1.rows_per_expert_hint = rows_hint;
      g1.activation = config_.activation;
      g1.packing = gate_up_packing_;  // the layout load_expert packed
      kernels::grouped_gemm1_fp8(g1, s);
      mark_phase(2, s);  // after GEMM 1
      kernels::GroupedGemm2Fp8Args g2;
      g2.a = static_cast<const uint8_t*>(act_);
      g2.a_scales = act_scales_;
      g2.weights = static_cast<const uint8_t*>(w2_);
      g2.weight_scales = w2_scales_;
      g2.expert_offsets = rx.expert_offsets;
      g2.out = reinterpret_cast<uint16_t*>(y_);
      g2.m_capacity = rx.max_rows;
      g2.num_experts = local_experts_;
      g2.hidden = H;
      g2.intermediate = I;
      g2.rows_per_expert_hint = rows_hint;
      kernels::grouped_gemm2_fp8(g2, s);
      mark_phase(3, s);  // after GEMM 2
    } else {
      kernels::GroupedGemm1Bf16Args g1;
      g1.a = static_cast<const uint16_t*>(rx.x);
      g1.weights = static_cast<const uint16_t*>(w13_);
      g1.expert_offsets = rx.expert_offsets;
      g1.topk_weights = config_.apply_topk_in_fc1 ? rx.row_weights : nullptr;
      g1.out = static_cast<uint16_t*>(act_);
      g1.m_capacity = rx.max_rows;
      g1.num_experts = local_experts_;
      g1.hidden = H;
      g1.intermediate = I;
      g1.rows_per_expert_hint = rows_hint;
      g1.activation = config_.activation;
      kernels::grouped_gemm1_bf16(g1, s);
      mark_phase(2, s);  // after GEMM 1
      kernels::GroupedGemm2Bf16Args g2;
      g2.a = static_cast<const uint16_t*>(act_);
      g2.weights = static_cast<const uint16_t*>(w2_);
      g2.expert_offsets = rx.expert_offsets;
      g2.out = reinterpret_cast<uint16_t*>(y_);
      g2.m_capacity = rx.max_rows;
      g2.num_experts = local_experts_;
      g2.hidden = H;
      g2.intermediate = I;
      g2.rows_per_expert_hint = rows_hint;
      kernels::grouped_gemm2_bf16(g2, s);
      mark_phase(3, s);  // after GEMM 2
    }
    io_->combine(y_, out.out, stream, /*apply_weights=*/!config_.apply_topk_in_fc1);
    mark_phase(4, s);  // after combine
    phases_recorded_ = phase_events_[0] != nullptr;
  }

  // NOTES: five events bound the four phases; staged has no shared expert (supports_shared_expert is
  // false), so nothing else is folded into a phase. Should one be added beside GEMM 1 / GEMM 2, it
  // counts into the GEMM phase whose events enclose its launch. Recording an event is one stream
  // operation (~1-2 us, no host synchronisation), so the timed forward stays what it was.
  void set_phase_timing(bool enabled) override {
    require_alive("set_phase_timing");
    if (enabled == (phase_events_[0] != nullptr)) return;
    if (enabled) {
      for (cudaEvent_t& e : phase_events_) MEGAMOE_CUDA_CHECK(cudaEventCreate(&e));
    } else {
      destroy_phase_events();
    }
    phases_recorded_ = false;
  }
  std::vector<PhaseTime> last_phase_times() const override {
    if (phase_events_[0] == nullptr || !phases_recorded_) return {};
    MEGAMOE_CUDA_CHECK(cudaEventSynchronize(phase_events_[kPhaseCount]));
    static constexpr const char* kNames[kPhaseCount] = {"dispatch", "gemm1", "gemm2", "combine"};
    std::vector<PhaseTime> times;
    for (int p = 0; p < kPhaseCount; ++p) {
      float ms = 0;
      MEGAMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, phase_events_[p], phase_events_[p + 1]));
      times.push_back(PhaseTime{kNames[p], 1e3 * ms});
    }
    return times;
  }

  void destroy() override {
    if (destroyed_) return;
    destroyed_ = true;
    // The shared region stays with the workspace (other layers may use it); a private one goes now.
    io_ = nullptr;
    scratch_.reset();
    workspace_.reset();
    for (void* p : allocations_) cudaFree(p);
    allocations_.clear();
    if (own_group_) own_group_->destroy();
    destroy_phase_events();
  }

 private:
  void require_alive(const char* call) const {
    MEGAMOE_CHECK(!destroyed_, "backend staged: ", call, " called after destroy()");
  }
  void* alloc(size_t bytes) {
    void* p = nullptr;
    MEGAMOE_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    allocations_.push_back(p);
    return p;
  }
  // Phase timing (set_phase_timing): boundary `index` of kPhaseCount + 1, a no-op when timing is off.
  void mark_phase(int index, cudaStream_t stream) {
    if (phase_events_[index] != nullptr) MEGAMOE_CUDA_CHECK(cudaEventRecord(phase_events_[index], stream));
  }
  void destroy_phase_events() {
    for (cudaEvent_t& e : phase_events_) {
      if (e != nullptr) MEGAMOE_CUDA_CHECK(cudaEventDestroy(e));
      e = nullptr;
    }
    phases_recorded_ = false;
  }
  void copy_matrix(const char* field, const formats::QuantizedMatrix& m, int64_t rows, int64_t cols, int expert,
                   void* data, float* scales, kernels::GemmRole role) {
    upload_packed_expert(field, m, config_.weight_format, rows, cols, expert, role, data, scales);
  }

  MoeConfig config_;
  std::unique_ptr<EpGroup> own_group_;
  EpGroup* ep_ = nullptr;
  std::shared_ptr<MoeWorkspace> workspace_;
  std::shared_ptr<StagedScratch> scratch_;
  EpDispatcher* io_ = nullptr;  // scratch_->io
  int local_experts_ = 0, first_expert_ = 0;
  bool fp8_ = false, w4a8_ = false, destroyed_ = false, warmed_up_ = false;
  kernels::GemmRole gate_up_packing_ = kernels::GemmRole::kGateUp;  // FP8-block W13 layout (constructor)
  std::vector<bool> loaded_;
  std::vector<void*> allocations_;
  void *w13_ = nullptr, *w2_ = nullptr, *act_ = nullptr;
  float *w13_scales_ = nullptr, *w2_scales_ = nullptr, *act_scales_ = nullptr;
  uint8_t *w13_group_scales_ = nullptr, *w2_group_scales_ = nullptr;                 // W4A8
  kernels::W4a8BlockScale *w13_blocks_ = nullptr, *w2_blocks_ = nullptr;             // W4A8
  __nv_bfloat16* y_ = nullptr;
  static constexpr int kPhaseCount = 4;  // dispatch, gemm1, gemm2, combine
  cudaEvent_t phase_events_[kPhaseCount + 1] = {};
  bool phases_recorded_ = false;  // a forward ran with the current events
};

}  // namespace

Capabilities staged_capabilities() {
  Capabilities c;
  c.formats = {WeightFormat::kBf16, WeightFormat::kFp8Block, WeightFormat::kNvfp4, WeightFormat::kMxfp4};
  c.activations = {Activation::Kind::kSiluMul, Activation::Kind::kSwigluClamped};
  c.min_ranks = 1;
  c.max_ranks = kMaxEpRanks;
  c.needs_gpu = true;
  c.supports_apply_topk_in_fc1 = true;
  c.supports_shared_expert = false;
  return c;
}

std::unique_ptr<MoeBackend> make_staged_backend(const MoeConfig& config, EpGroup* ep,
                                                std::shared_ptr<MoeWorkspace> workspace) {
  return std::make_unique<StagedBackend>(config, ep, std::move(workspace));
}

namespace {
MEGAMOE_REGISTER_BACKEND(backends::BackendEntry{
    .name = "staged",
    .capabilities = [] { return staged_capabilities(); },
    .unavailable_reason = []() -> std::string {
      int devices = 0;
      if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        cudaGetLastError();
        return "no CUDA device visible";
      }
      return {};
    },
    .create = [](const MoeConfig& c, EpGroup* ep, std::shared_ptr<MoeWorkspace> ws) {
      return make_staged_backend(c, ep, std::move(ws));
    },
});
}  // namespace

}  // namespace megamoe
