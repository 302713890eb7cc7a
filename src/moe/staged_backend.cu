// `staged` backend. Experts run on the sm90 wgmma grouped GEMMs (kernels/grouped_gemm.h): FP8-block
// (GEMM 1 with the SwiGLU + top-k weight + FP8 requant epilogue, GEMM 2 with BF16 out) and BF16 x BF16
// (GEMM 1 with the SwiGLU + top-k weight epilogue to BF16, GEMM 2 with BF16 out; FP8 GEMM 1 optionally in two
// passes, MEGAMOE_FP8_GEMM1_TWO_PASS=1), and W4A8 (NVFP4 / MXFP4
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
#include "kernels/swiglu_quant.h"
#include "megamoe/ep.h"
#include "megamoe/ep_dispatch.h"
#include "megamoe/error_cuda.h"
#include "moe/staged_backend.h"
#include "moe/staged_pipeline.h"

namespace megamoe {

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

namespace {

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
    // GEMM-1 weight layout, i.e. which GEMM-1 kernel runs: staged_gate_up_packing (staged_pipeline.h).
    // FP8-block, MEGAMOE_FP8_GEMM1_TWO_PASS=1 (read once here; default off): GEMM 1 in two passes, the plain
    // grouped GEMM (BF16 gate/up into the scratch's gate_up) then swiglu_quant_fp8 (kernels/swiglu_quant.h,
    // docs/grouped_gemm.md "Two-pass GEMM 1"), on kGateUp weights.
    if (config.weight_format == WeightFormat::kFp8Block) fp8_gemm1_two_pass_ = kernels::fp8_gemm1_two_pass_from_env();
    gate_up_packing_ = staged_gate_up_packing(config, fp8_gemm1_two_pass_);
    if (!workspace) workspace = make_moe_workspace();  // one layer: a private region
    workspace_ = workspace;
    scratch_ = acquire_staged_scratch(*workspace, config, *ep, fp8_gemm1_two_pass_);
    weights_ = ExpertSlabs::allocate(config, local_experts_, gate_up_packing_, [this](size_t bytes) { return alloc(bytes); });
    weights_.fp8_gemm1_two_pass = fp8_gemm1_two_pass_;
    loaded_.assign(local_experts_, false);
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
    weights_.load(config_, local_expert, w);
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
    run_staged_pipeline(config_, local_experts_, *scratch_, weights_, in, out, static_cast<cudaStream_t>(stream), phases_);
  }

  // NOTES: staged has no shared expert (supports_shared_expert is false), so nothing else is folded into
  // a phase. Should one be added beside GEMM 1 / GEMM 2, it counts into the GEMM phase whose events
  // enclose its launch (StagedPhaseEvents, staged_pipeline.h).
  void set_phase_timing(bool enabled) override {
    require_alive("set_phase_timing");
    phases_.set_enabled(enabled);
  }
  std::vector<PhaseTime> last_phase_times() const override { return phases_.times(); }

  void destroy() override {
    if (destroyed_) return;
    destroyed_ = true;
    // The shared region stays with the workspace (other layers may use it); a private one goes now.
    scratch_.reset();
    workspace_.reset();
    for (void* p : allocations_) cudaFree(p);
    allocations_.clear();
    if (own_group_) own_group_->destroy();
    phases_.destroy();
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
  MoeConfig config_;
  std::unique_ptr<EpGroup> own_group_;
  EpGroup* ep_ = nullptr;
  std::shared_ptr<MoeWorkspace> workspace_;
  std::shared_ptr<StagedScratch> scratch_;
  int local_experts_ = 0, first_expert_ = 0;
  bool destroyed_ = false, warmed_up_ = false;
  kernels::GemmRole gate_up_packing_ = kernels::GemmRole::kGateUp;  // FP8-block / BF16 W13 layout (constructor)
  bool fp8_gemm1_two_pass_ = false;  // FP8-block: MEGAMOE_FP8_GEMM1_TWO_PASS (constructor)
  ExpertSlabs weights_;  // in allocations_
  std::vector<bool> loaded_;
  std::vector<void*> allocations_;
  StagedPhaseEvents phases_;
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
