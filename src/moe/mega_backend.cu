// `mega` backend: the typed, validating layer over the fused MegaMoE kernel (sm90_mega_moe.cuh), with
// the staged pipeline on the same weights as its "split" path for many rows per expert
// (mega_path_heuristics.h). Host work per forward: shape/capacity checks, the path choice, and ONE
// launch (fused) or the pipeline's launches (split); no allocation, no synchronisation.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "common/stream_sms.h"
#include "kernels/grouped_gemm.h"
#include "kernels/grouped_gemm_internal.h"
#include "kernels/sm90_mega_moe.cuh"
#include "megamoe/ep.h"
#include "megamoe/error_cuda.h"
#include "moe/mega_backend.h"
#include "moe/mega_path_heuristics.h"
#include "moe/mega_phase_times.h"
#include "moe/mega_w4a8.h"
#include "moe/staged_backend.h"
#include "moe/staged_pipeline.h"

namespace megamoe {
namespace {

using kernels::MegaFormat;
using kernels::MegaMoeParams;
// Both GEMMs of one launch use the same BLOCK_M (one m-tile table, one gemm1_done counter per m-tile).
// Both formats use these carve-ups (a BF16 stage is the same 128-byte rows; the 16 KiB SwiGLU exchange
// serves both SwiGLU epilogues) with the GEMM-2 BF16 staging aliasing the exchange (v8: 64 rows per
// math warpgroup at 64 x 256, 32 at 128 x 256, where 64 would not fit); FP8 adds the scale ring (the
// scale warp stages A and B scales in shared memory), BF16 has no scales.
// kInterleavedW13 (FP8): GEMM-1 tiles on W13 packed kGateUpInterleaved8 (the staged pipeline's packing, one W13 for
// both paths; GroupedGemmLayout kSplitNInterleaved: + 2 KiB FP8 row staging at 128 x 256, + 1 KiB amax exchange).
template <int kSubTiles, bool kFp8, bool kInterleavedW13 = false>
using MegaTiles = kernels::sm90::GroupedGemmLayout<1, kSubTiles, 4, kernels::sm90::Epilogue::kSwigluQuantFp8,
                                                   kSubTiles == 1 ? 64 : 32, kFp8, kInterleavedW13>;
using SmallTiles = MegaTiles<1, true>;  // 64 x 256
using LargeTiles = MegaTiles<2, true>;  // 128 x 256
static_assert(MegaTiles<1, false>::kBlockM == SmallTiles::kBlockM && MegaTiles<2, false>::kBlockM == LargeTiles::kBlockM);
// NOTES: shared memory at the largest local expert count mega accepts (mega_reject_reason), static
// shared variables (< 128 B) included. 128 x 256 FP8: 1,024 slack + 196,608 tiles + 17,408 staging/exchange
// + 2,080 scale ring + 64 barriers + 16 * (E + 1) tables = 225,392 B at E = 512 (953 would be the limit).
// The W4A8 layouts (mega_w4a8.cu) have their own budget there.
static_assert(mega_fits_shared<MegaTiles<1, true>>() && mega_fits_shared<MegaTiles<2, true>>() &&
              mega_fits_shared<MegaTiles<1, false>>() && mega_fits_shared<MegaTiles<2, false>>());
// Interleaved W13: 64 x 256 1,024 + 163,840 + 34,816 + 1,056 + 1,024 amax + 64 + 16 * 513 = 210,032 B; 128 x 256
// 1,024 + 196,608 + 18,432 + 2,080 + 1,024 + 64 + 8,208 = 227,440 B at E = 512 (limit 232,448 incl. static).
static_assert(mega_fits_shared<MegaTiles<1, true, true>>() && mega_fits_shared<MegaTiles<2, true, true>>());

// MEGAMOE_MEGA_OWN_GATE_UP=1 (read per backend; A/B and fallback): the FP8 and W4A8 fused kernels keep their own W13
// packed kGateUp (FP8: the split-N kernel before session 14; W4A8: before session 19) and the split path a second
// W13 in staged's packing where that differs, as before.
// Default (unset / 0): ONE W13 in staged_gate_up_packing for both paths (docs/mega.md "One W13").
bool mega_own_gate_up_requested() { return kernels::detail::env_switch("MEGAMOE_MEGA_OWN_GATE_UP", false); }

// What mega layers share (MoeWorkspace): the symmetric window (make_mega_moe_layout), the grouped
// activations, GEMM-1 output, row tables, the kernel's counters and its epoch, and the activation
// tensor maps over them. max_rows = ranks * C * min(top_k, local experts). Sized for one format (P bytes
// per token element, scales for FP8-block and W4A8), which is part of the key.
struct MegaScratch final : MoeWorkspace::Shared {
  SymmetricBuffer window;  // freed by EpGroup::destroy (a collective)
  MegaMoeParams params{};  // the shared fields only (see MegaBackend's constructor)
  struct ActivationMaps {
    CUtensorMap x, act;
  } maps[2]{};
  std::vector<void*> allocations;
  ~MegaScratch() override {
    for (void* p : allocations) cudaFree(p);
  }
  void* alloc(size_t bytes) {
    void* ptr = nullptr;
    MEGAMOE_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(bytes, 16)));
    MEGAMOE_CUDA_CHECK(cudaMemset(ptr, 0, std::max<size_t>(bytes, 16)));
    allocations.push_back(ptr);
    device_bytes += std::max<size_t>(bytes, 16);
    return ptr;
  }
};

// The path heuristic's threshold for this weight format (mega_path_heuristics.h).
int64_t fused_max_rows(WeightFormat format) {
  return mega_fused_max_rows_per_expert(format == WeightFormat::kNvfp4 || format == WeightFormat::kMxfp4);
}

MegaFormat mega_format(WeightFormat format) {
  switch (format) {
    case WeightFormat::kBf16: return MegaFormat::kBf16;
    case WeightFormat::kNvfp4: return MegaFormat::kNvfp4;
    case WeightFormat::kMxfp4: return MegaFormat::kMxfp4;
    default: return MegaFormat::kFp8Block;
  }
}

std::string mega_scratch_key(const MoeConfig& c, const EpGroup& ep) {
  return detail::concat("mega H=", c.hidden, " I=", c.intermediate, " E=", c.num_experts, " k=", c.top_k,
                        " C=", c.max_tokens_per_rank, " format=", weight_format_name(c.weight_format),
                        " group=", static_cast<const void*>(&ep), " ranks=", ep.size());
}

// Makes the shared region (collective: allocates the window).
std::shared_ptr<MegaScratch> make_mega_scratch(const MoeConfig& config, EpGroup& ep) {
  auto scratch = std::make_shared<MegaScratch>();
  const int R = ep.size();
  const int64_t H = config.hidden, I = config.intermediate, E = config.num_experts / R, C = config.max_tokens_per_rank;
  const int64_t max_rows = R * C * std::min<int64_t>(config.top_k, E);
  const MegaFormat format = mega_format(config.weight_format);
  const bool scales = kernels::mega_has_scales(format);
  const int64_t P = kernels::mega_element_bytes(format);
  const kernels::MegaMoeLayout layout = kernels::make_mega_moe_layout(config.max_tokens_per_rank, config.hidden,
                                                                       config.top_k, config.num_experts, format);
  scratch->window = ep.allocate(layout.total);  // collective; zeroed
  scratch->symmetric_bytes = scratch->window.bytes;
  MegaMoeParams& p = scratch->params;
  p.ctx = ep.device_context();
  for (int r = 0; r < R; ++r) p.window[r] = static_cast<char*>(scratch->window.peers[r]);
  p.layout = layout;
  p.epoch = static_cast<uint64_t*>(scratch->alloc(sizeof(uint64_t)));
  p.ctas_quantized = static_cast<uint32_t*>(scratch->alloc(sizeof(uint32_t)));
  p.ctas_gathered = static_cast<uint32_t*>(scratch->alloc(sizeof(uint32_t)));
  p.ctas_finished = static_cast<uint32_t*>(scratch->alloc(sizeof(uint32_t)));
  p.expected_from = static_cast<uint32_t*>(scratch->alloc(sizeof(uint32_t) * kMaxEpRanks));
  p.cursors = static_cast<int32_t*>(scratch->alloc(sizeof(int32_t) * E));
  p.arrived = static_cast<uint64_t*>(scratch->alloc(sizeof(uint64_t) * E));
  p.max_m_tiles = static_cast<int>((max_rows + SmallTiles::kBlockM - 1) / SmallTiles::kBlockM + E);
  p.gemm1_done = static_cast<uint64_t*>(scratch->alloc(sizeof(uint64_t) * p.max_m_tiles));
  p.grouped_x = static_cast<uint8_t*>(scratch->alloc(max_rows * H * P));
  p.grouped_scales = scales ? static_cast<float*>(scratch->alloc(sizeof(float) * max_rows * (H / 128))) : nullptr;
  p.sources = static_cast<RowSource*>(scratch->alloc(sizeof(RowSource) * max_rows));
  p.row_weights = static_cast<float*>(scratch->alloc(sizeof(float) * max_rows));
  p.act = static_cast<uint8_t*>(scratch->alloc(max_rows * I * P));
  p.act_scales = scales ? static_cast<float*>(scratch->alloc(sizeof(float) * max_rows * (I / 128))) : nullptr;
  p.max_rows = max_rows;
  using kernels::detail::make_grouped_gemm_tensor_map;
  for (int v = 0; v < 2; ++v) {
    const uint32_t block_m = v == 0 ? SmallTiles::kBlockM : LargeTiles::kBlockM;
    scratch->maps[v].x = make_grouped_gemm_tensor_map(p.grouped_x, H * P, max_rows, block_m);
    scratch->maps[v].act = make_grouped_gemm_tensor_map(p.act, I * P, max_rows, block_m);
  }
  return scratch;
}

class MegaBackend final : public MoeBackend {
 public:
  MegaBackend(const MoeConfig& config, EpGroup* ep, std::shared_ptr<MoeWorkspace> workspace, MegaPathMode path_mode)
      : config_(config), path_mode_(path_mode) {
    const int ranks = ep ? ep->size() : 1;
    const std::string why = mega_reject_reason(config, ranks);
    MEGAMOE_CHECK(why.empty(), "backend mega cannot run this configuration: ", why);
    if (!ep) {
      const auto path = std::filesystem::temp_directory_path() /
                        ("megamoe-mega-" + std::to_string(getpid()) + "-" + std::to_string(reinterpret_cast<uintptr_t>(this)));
      own_group_ = EpGroup::bootstrap(0, 1, "file:" + path.string());
      ep = own_group_.get();
    }
    ep_ = ep;
    const int R = ep->size();
    local_experts_ = config.num_experts / R;
    first_expert_ = ep->rank() * local_experts_;
    const int64_t H = config.hidden, I = config.intermediate, E = local_experts_, C = config.max_tokens_per_rank;
    const int64_t k = config.top_k;
    const int64_t max_rows = R * C * std::min<int64_t>(k, E);
    MEGAMOE_CHECK(max_rows < (int64_t{1} << 31), "ranks * max_tokens_per_rank * min(top_k, local experts) = ", max_rows,
                  " grouped rows must be < 2^31");

    if (!workspace) workspace = make_moe_workspace();  // one layer: a private region
    workspace_ = workspace;
    scratch_ = std::static_pointer_cast<MegaScratch>(
        workspace->acquire(mega_scratch_key(config, *ep), [&] { return make_mega_scratch(config, *ep); }));

    format_ = mega_format(config.weight_format);
    const bool w4a8 = kernels::mega_is_w4a8(format_);
    const int64_t P = kernels::mega_element_bytes(format_);
    // The grouped GEMMs' layouts (ExpertSlabs): W13 FP8-block and W4A8 in staged's packing (staged_gate_up_packing:
    // FP8 kGateUpInterleaved8 unless MEGAMOE_FP8_GEMM1_V9=0, W4A8 kGateUpInterleaved8 unless MEGAMOE_W4A8_G1_V10=0,
    // else kGateUp; the fused kernel's GEMM-1 tiles read either), kGateUp with MEGAMOE_MEGA_OWN_GATE_UP=1; BF16 kGateUp
    // (the fused BF16 tiles); W2 kDown; the split path's own W13 below where its packing differs.
    const kernels::GemmRole fused_packing =
        (format_ == MegaFormat::kFp8Block || w4a8) && !mega_own_gate_up_requested() ? staged_gate_up_packing(config, false)
                                                                                    : kernels::GemmRole::kGateUp;
    slabs_ = ExpertSlabs::allocate(config, local_experts_, fused_packing, [this](size_t bytes) { return alloc(bytes); });

    // The split path's scratch (the staged pipeline's dispatcher, window and buffers) only where a
    // forward can take it; shared with staged layers and other mega layers of this geometry.
    const std::string split_why = staged_reject_reason(config, R);
    MEGAMOE_CHECK(path_mode_ != MegaPathMode::kSplit || split_why.empty(),
                  "backend mega: path split (MEGAMOE_MEGA_PATH) cannot run this configuration: ", split_why);
    if (split_why.empty() &&
        mega_split_reachable(path_mode_, C, config.top_k, local_experts_, fused_max_rows(config.weight_format)))
      split_scratch_ = acquire_staged_scratch(*workspace, config, *ep);  // collective on first use
    // The split path runs the staged GEMMs on staged's W13 packing (staged_gate_up_packing). FP8-block: the fused
    // kernel reads that packing too (one W13). BF16 (staged's v2 packing is kGateUpInterleaved8, the fused BF16
    // tiles read kGateUp) and FP8 with MEGAMOE_MEGA_OWN_GATE_UP=1: a second W13 in the split path's packing
    // (with_own_gate_up), W13 memory twice, only where the split path can run. W4A8: one W13 in staged's packing
    // (kGateUpInterleaved8 by default, kGateUp with MEGAMOE_W4A8_G1_V10=0; the fused W4A8 GEMM 1 reads both since
    // session 19: docs/mega.md "One W13"); with MEGAMOE_MEGA_OWN_GATE_UP=1 and the interleaved packing, kGateUp for
    // the fused kernel and the split path's own interleaved copy.
    split_slabs_ = slabs_;
    if (split_scratch_) {
      const kernels::GemmRole split_packing = staged_gate_up_packing(config, false);
      if (split_packing != slabs_.gate_up_packing)
        split_slabs_ = slabs_.with_own_gate_up(config, local_experts_, split_packing,
                                               [this](size_t bytes) { return alloc(bytes); });
    }
    if (kernels::detail::env_switch("MEGAMOE_MEGA_LOG_MEMORY", false)) log_weight_memory();

    // Shared fields (window, counters, epoch, grouped rows, act) from the region; the rest is this layer's.
    MegaMoeParams& p = params_;
    p = scratch_->params;
    p.hidden = config.hidden;
    p.intermediate = config.intermediate;
    p.top_k = config.top_k;
    p.num_experts = config.num_experts;
    p.experts_per_rank = local_experts_;
    p.capacity = config.max_tokens_per_rank;
    p.activation = config.activation.kind == Activation::Kind::kSwigluClamped ? 1 : 0;
    p.limit = config.activation.limit;
    p.alpha = config.activation.alpha;
    p.apply_topk_in_fc1 = config.apply_topk_in_fc1;
    p.swiglu_spread = kernels::detail::swiglu_spread_enabled();
    p.w4a8_decoder = kernels::w4a8_decode();
    p.diag_local_combine = [] {  // MegaMoeParams NOTES: a timing diagnostic, wrong output
      const char* v = std::getenv("MEGAMOE_MEGA_DIAG_LOCAL_COMBINE");
      return v != nullptr && std::string(v) == "1" ? 1 : 0;
    }();
    if (p.diag_local_combine)
      std::fprintf(stderr, "megamoe: MEGAMOE_MEGA_DIAG_LOCAL_COMBINE=1: mega combine rows stay local, OUTPUT IS WRONG\n");
    p.w13_scales = slabs_.w13_scales;
    p.w2_scales = slabs_.w2_scales;
    p.w13_group_scales = slabs_.w13_group_scales;
    p.w2_group_scales = slabs_.w2_group_scales;
    p.w13_blocks = reinterpret_cast<const kernels::sm90::W4a8BlockScaleDevice*>(slabs_.w13_blocks);
    p.w2_blocks = reinterpret_cast<const kernels::sm90::W4a8BlockScaleDevice*>(slabs_.w2_blocks);
    MEGAMOE_CHECK(p.max_rows == max_rows, "mega workspace region has ", p.max_rows, " rows, expected ", max_rows);
    for (int v = 0; v < 2; ++v) {
      maps_[v].x = scratch_->maps[v].x;
      maps_[v].act = scratch_->maps[v].act;
    }
    using kernels::detail::make_grouped_gemm_tensor_map;
    if (w4a8) {  // FP4 bytes: K / 2 per row, 64-byte boxes of 256 rows (the standalone W4A8 GEMM's b_map)
      using kernels::detail::make_byte_tensor_map;
      w13_map_ = make_byte_tensor_map(slabs_.w13, H / 2, E * 2 * I, kernels::sm90::kW4a8Fp4RowBytes, kernels::sm90::kW4a8BlockN,
                                      CU_TENSOR_MAP_SWIZZLE_64B);
      w2_map_ = make_byte_tensor_map(slabs_.w2, I / 2, E * H, kernels::sm90::kW4a8Fp4RowBytes, kernels::sm90::kW4a8BlockN,
                                     CU_TENSOR_MAP_SWIZZLE_64B);
    } else {
      w13_map_ = make_grouped_gemm_tensor_map(slabs_.w13, H * P, E * 2 * I, 256);
      w2_map_ = make_grouped_gemm_tensor_map(slabs_.w2, I * P, E * H, 256);
    }
    MEGAMOE_CUDA_CHECK(cudaDeviceGetAttribute(&device_sms_, cudaDevAttrMultiProcessorCount, ep_->device()));
    loaded_.assign(E, false);
    MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~MegaBackend() override {
    try {
      destroy();
    } catch (...) {
    }
  }

  std::string_view name() const override { return "mega"; }
  Capabilities capabilities() const override { return mega_capabilities(); }
  const MoeConfig& config() const override { return config_; }
  int first_local_expert() const override { return first_expert_; }
  int num_local_experts() const override { return local_experts_; }

  void load_expert(int local_expert, const ExpertWeights& w) override {
    require_alive("load_expert");
    MEGAMOE_CHECK(local_expert >= 0 && local_expert < local_experts_, "local_expert = ", local_expert,
                  " must be in [0, ", local_experts_, ")");
    slabs_.load(config_, local_expert, w);
    if (split_slabs_.w13 != slabs_.w13) split_slabs_.load_gate_up(config_, local_expert, w);
    loaded_[local_expert] = true;
  }
  void load_shared_expert(const ExpertWeights&) override {
    MEGAMOE_FAIL("backend mega: shared experts are not supported (Capabilities::supports_shared_expert = false)");
  }

  void warmup(StreamHandle stream) override {
    require_alive("warmup");
    ep_->warmup(stream);
    MoeInputs in;
    in.hidden = TensorView::make2d(nullptr, DType::kBF16, 0, config_.hidden, Device::kCuda);
    in.topk_ids = TensorView::make2d(nullptr, DType::kI32, 0, config_.top_k, Device::kCuda);
    in.topk_weights = TensorView::make2d(nullptr, DType::kF32, 0, config_.top_k, Device::kCuda);
    MoeOutputs out;
    out.out = TensorView::make2d(nullptr, DType::kBF16, 0, config_.hidden, Device::kCuda);
    // Zero tokens on every path a forward can take: every phase and every flag once. Same order on
    // every rank (both paths are collective).
    require_loaded();
    forward_on(MegaPath::kFused, in, out, stream);
    if (split_scratch_) forward_on(MegaPath::kSplit, in, out, stream);
    ep_->synchronize(stream);
    last_path_ = -1;
  }

  void forward(const MoeInputs& in, MoeOutputs& out, StreamHandle stream) override {
    require_alive("forward");
    require_loaded();
    MEGAMOE_CHECK(in.hidden.rank == 2, "inputs.hidden: expected a 2-D tensor, got rank ", in.hidden.rank);
    const int64_t T = in.hidden.shape[0];
    // NOTES: checked before the launch, so an overflowing call writes nothing anywhere.
    MEGAMOE_CHECK(T >= 0 && T <= config_.max_tokens_per_rank, "tokens T = ", T,
                  " exceeds the EP capacity max_tokens_per_rank = ", config_.max_tokens_per_rank, " on rank ",
                  ep_->rank());
    check_tensor("inputs.hidden", in.hidden, DType::kBF16, {T, config_.hidden}, Device::kCuda);
    check_tensor("inputs.topk_ids", in.topk_ids, DType::kI32, {T, config_.top_k}, Device::kCuda);
    check_tensor("inputs.topk_weights", in.topk_weights, DType::kF32, {T, config_.top_k}, Device::kCuda);
    check_tensor("outputs.out", out.out, DType::kBF16, {T, config_.hidden}, Device::kCuda);
    // NOTES: the path must be the same on every rank (both are collective): it is decided on the agreed
    // token count (mega_agreed_tokens: T on one rank, else max_tokens_any_rank, else 0 = fused),
    // never on this rank's T alone. Checked here, before anything is launched.
    const int64_t any_rank = in.max_tokens_any_rank;
    MEGAMOE_CHECK(any_rank < 0 || (any_rank >= T && any_rank <= config_.max_tokens_per_rank),
                  "inputs.max_tokens_any_rank = ", any_rank, " must be >= this rank's T = ", T,
                  " and <= max_tokens_per_rank = ", config_.max_tokens_per_rank, " (or -1)");
    const int64_t agreed = mega_agreed_tokens(ep_->size(), T, any_rank, config_.max_tokens_per_rank);
    MegaPath path =
        choose_mega_path(path_mode_, agreed, config_.top_k, local_experts_, fused_max_rows(config_.weight_format));
    if (!split_scratch_) path = MegaPath::kFused;  // staged cannot run it, or no forward reaches split
    forward_on(path, in, out, stream);
  }

  std::string last_forward_path() const override {
    return last_path_ < 0 ? std::string() : mega_path_name(static_cast<MegaPath>(last_path_));
  }

 private:
  void require_loaded() {
    ep_->check_errors();
    for (int e = 0; e < local_experts_; ++e)
      MEGAMOE_CHECK(loaded_[e], "backend mega: local expert ", e, " (global ", first_expert_ + e,
                    ") was never loaded with load_expert()");
  }
  // One forward on `path` (inputs already checked).
  void forward_on(MegaPath path, const MoeInputs& in, MoeOutputs& out, StreamHandle stream) {
    last_path_ = static_cast<int>(path);
    const auto s = static_cast<cudaStream_t>(stream);
    if (path == MegaPath::kSplit) {
      run_staged_pipeline(config_, local_experts_, *split_scratch_, split_slabs_, in, out, s, split_phases_);
      return;
    }
    const int ctas = fused_grid(s);
    ep_->enter_collective("mega forward");  // a no-op on NCCL groups (EpGroup::enter_collective)
    const int64_t T = in.hidden.shape[0];
    MegaMoeParams p = params_;
    p.num_tokens = static_cast<int>(T);
    p.hidden_in = static_cast<const __nv_bfloat16*>(in.hidden.data);
    p.topk_ids = static_cast<const int32_t*>(in.topk_ids.data);
    p.topk_weights = static_cast<const float*>(in.topk_weights.data);
    p.out = static_cast<__nv_bfloat16*>(out.out.data);
    p.phase_stamps = phase_timing_ ? phase_stamps_ : nullptr;
    // Tile height from this rank's expected rows per local expert (uniform routing, every rank like
    // this one); the choice is local: ranks may differ.
    const int64_t rows_hint = T * config_.top_k / std::max(1, local_experts_);
    const bool small = rows_hint <= 64;
    const ActivationMaps& maps = maps_[small ? 0 : 1];
    using kernels::launch_mega_moe;
    constexpr MegaFormat kBf16 = MegaFormat::kBf16, kFp8 = MegaFormat::kFp8Block;
    if (kernels::mega_is_w4a8(format_)) {
      launch_mega_w4a8(format_, small, slabs_.gate_up_packing == kernels::GemmRole::kGateUpInterleaved8, maps.x,
                       w13_map_, maps.act, w2_map_, p, ctas, s);
    } else if (format_ == kBf16) {
      if (small) launch_mega_moe<MegaTiles<1, false>, kBf16>(maps.x, w13_map_, maps.act, w2_map_, p, ctas, s);
      else launch_mega_moe<MegaTiles<2, false>, kBf16>(maps.x, w13_map_, maps.act, w2_map_, p, ctas, s);
    } else if (slabs_.gate_up_packing == kernels::GemmRole::kGateUpInterleaved8) {  // one W13 (docs/mega.md)
      if (small) launch_mega_moe<MegaTiles<1, true, true>, kFp8>(maps.x, w13_map_, maps.act, w2_map_, p, ctas, s);
      else launch_mega_moe<MegaTiles<2, true, true>, kFp8>(maps.x, w13_map_, maps.act, w2_map_, p, ctas, s);
    } else {
      if (small) launch_mega_moe<MegaTiles<1, true>, kFp8>(maps.x, w13_map_, maps.act, w2_map_, p, ctas, s);
      else launch_mega_moe<MegaTiles<2, true>, kFp8>(maps.x, w13_map_, maps.act, w2_map_, p, ctas, s);
    }
    last_ctas_ = ctas;
    if (phase_timing_) {
      MEGAMOE_CUDA_CHECK(cudaEventRecord(phase_done_, s));
      phases_recorded_ = true;
    }
  }

 public:
  // NOTES: the stamp buffer ([ctas, kMegaPhaseStamps] u64) and the event are made on the first
  // set_phase_timing(true) and kept until destroy(), so switching timing on and off allocates once;
  // call it outside CUDA-graph capture. With timing off the kernel gets a null buffer and stamps nothing.
  void set_phase_timing(bool enabled) override {
    require_alive("set_phase_timing");
    if (enabled && phase_stamps_ == nullptr) {
      phase_stamps_ = static_cast<uint64_t*>(alloc(sizeof(uint64_t) * kMegaPhaseStamps * device_sms_));
      MEGAMOE_CUDA_CHECK(cudaEventCreateWithFlags(&phase_done_, cudaEventDisableTiming));
    }
    phase_timing_ = enabled;
    phases_recorded_ = false;
    if (split_scratch_) split_phases_.set_enabled(enabled);  // the split path: staged's four phases
  }
  // The last forward's path's phases: the fused kernel's seven (mega_phase_times.h) or the split
  // path's dispatch / gemm1 / gemm2 / combine.
  std::vector<PhaseTime> last_phase_times() const override {
    if (last_path_ == static_cast<int>(MegaPath::kSplit)) return split_phases_.times();
    if (!phase_timing_ || !phases_recorded_) return {};
    MEGAMOE_CUDA_CHECK(cudaEventSynchronize(phase_done_));
    std::vector<uint64_t> stamps(static_cast<size_t>(kMegaPhaseStamps) * last_ctas_);
    MEGAMOE_CUDA_CHECK(cudaMemcpy(stamps.data(), phase_stamps_, stamps.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    return mega_phase_times(stamps.data(), last_ctas_);
  }

  void destroy() override {
    if (destroyed_) return;
    destroyed_ = true;
    for (void* ptr : allocations_) cudaFree(ptr);
    allocations_.clear();
    if (phase_done_ != nullptr) cudaEventDestroy(phase_done_);
    phase_done_ = nullptr;
    phase_stamps_ = nullptr;
    phase_timing_ = phases_recorded_ = false;
    // The shared region stays with the workspace (other layers may use it); a private one goes now.
    // Its symmetric window belongs to the group (freed by EpGroup::destroy, a collective).
    split_phases_.destroy();
    scratch_.reset();
    split_scratch_.reset();
    workspace_.reset();
    if (own_group_) own_group_->destroy();
  }

 private:
  // MEGAMOE_MEGA_LOG_MEMORY=1: one stderr line per layer with its expert weight bytes on this rank (W13 with
  // scales, the split path's own W13 if any, W2 with scales; W4A8: data + group scales + block records).
  void log_weight_memory() const {
    const ExpertSlabs::Bytes bytes = ExpertSlabs::bytes(config_, local_experts_);
    const double w13 = static_cast<double>(bytes.gate_up_total()), w2 = static_cast<double>(bytes.down_total());
    const bool copy = split_slabs_.w13 != slabs_.w13;
    const double total = w13 * (copy ? 2 : 1) + w2;
    const double gib = 1.0 / (1024.0 * 1024.0 * 1024.0);
    std::fprintf(stderr,
                 "megamoe: mega weights rank %d: W13 %.3f GiB (packing %d) + split W13 copy %.3f GiB (packing %d) + "
                 "W2 %.3f GiB = %.3f GiB per layer\n",
                 ep_->rank(), w13 * gib, static_cast<int>(slabs_.gate_up_packing), copy ? w13 * gib : 0.0,
                 static_cast<int>(split_slabs_.gate_up_packing), w2 * gib, total * gib);
  }
  void require_alive(const char* call) const {
    MEGAMOE_CHECK(!destroyed_, "backend mega: ", call, " called after destroy()");
  }
  // The fused kernel's grid: one CTA per SM the stream can use (its green context's, detail::stream_green_context_sms,
  // else the device's). NOTES: the persistent kernel's CTAs wait on each other (rows gathered, GEMM-1 tiles done) and
  // on the peers' kernels, so every CTA of every rank must be resident at once. Across GPUs that is the cooperative
  // launch. In-process ranks of ONE GPU (EpGroup::loopback) share its SMs: each rank needs its own SM partition (a
  // green-context stream, as src/common/sm_partition.h makes) of at most device SMs / ranks, or the first rank's
  // grid would hold SMs that a peer's grid needs while it waits for that peer; refused here before anything is launched.
  int fused_grid(cudaStream_t stream) const {
    const int partition_sms = std::min(detail::stream_green_context_sms(stream), device_sms_);
    const int sms = partition_sms > 0 ? partition_sms : device_sms_;
    const int ranks = ep_->size();
    MEGAMOE_CHECK(!ep_->is_loopback() || ranks == 1 || (partition_sms > 0 && sms * ranks <= device_sms_),
                  "backend mega on in-process ranks (EpGroup::loopback, ", ranks, " ranks on one GPU) needs each rank's "
                  "stream on its own SM partition (a green context of at most ", device_sms_ / ranks, " of the ",
                  device_sms_, " SMs): rank ", ep_->rank(), "'s stream ", static_cast<const void*>(stream), " can use ",
                  sms, " SMs", partition_sms > 0 ? "" : " (no green context)");
    return sms;
  }
  void* alloc(size_t bytes) {
    void* ptr = nullptr;
    MEGAMOE_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(bytes, 16)));
    MEGAMOE_CUDA_CHECK(cudaMemset(ptr, 0, std::max<size_t>(bytes, 16)));
    allocations_.push_back(ptr);
    return ptr;
  }

  struct ActivationMaps {
    CUtensorMap x, act;
  };
  MoeConfig config_;
  std::unique_ptr<EpGroup> own_group_;
  EpGroup* ep_ = nullptr;
  std::shared_ptr<MoeWorkspace> workspace_;
  std::shared_ptr<MegaScratch> scratch_;
  MegaMoeParams params_{};
  MegaFormat format_ = MegaFormat::kFp8Block;
  ActivationMaps maps_[2]{};
  CUtensorMap w13_map_{}, w2_map_{};
  int device_sms_ = 0;  // the largest grid (fused_grid) and the phase stamp buffer's CTA rows
  int last_ctas_ = 0;   // the last fused launch's grid (fused_grid)
  int local_experts_ = 0, first_expert_ = 0;
  bool destroyed_ = false;
  std::vector<bool> loaded_;
  std::vector<void*> allocations_;
  ExpertSlabs slabs_;        // in allocations_; the fused kernel's (FP8: W13 in staged's packing) and the split path's W2
  ExpertSlabs split_slabs_;  // the split path's: slabs_ with its own W13 where staged_gate_up_packing differs
  // The split path (mega_path_heuristics.h): its mode, the staged pipeline's scratch (null when no
  // forward can take it) and phase events, and the path of the last forward (-1: none yet).
  MegaPathMode path_mode_ = MegaPathMode::kAuto;
  std::shared_ptr<StagedScratch> split_scratch_;
  StagedPhaseEvents split_phases_;
  int last_path_ = -1;
  // phase timing (set_phase_timing)
  uint64_t* phase_stamps_ = nullptr;  // in allocations_
  cudaEvent_t phase_done_ = nullptr;  // recorded after a timed forward's launch
  bool phase_timing_ = false, phases_recorded_ = false;
};

}  // namespace

std::unique_ptr<MoeBackend> make_mega_backend(const MoeConfig& config, EpGroup* ep,
                                              std::shared_ptr<MoeWorkspace> workspace) {
  return std::make_unique<MegaBackend>(config, ep, std::move(workspace), mega_path_mode_from_env());
}

std::unique_ptr<MoeBackend> make_mega_backend(const MoeConfig& config, EpGroup* ep,
                                              std::shared_ptr<MoeWorkspace> workspace, MegaPathMode path_mode) {
  return std::make_unique<MegaBackend>(config, ep, std::move(workspace), path_mode);
}

namespace {
MEGAMOE_REGISTER_BACKEND(backends::BackendEntry{
    .name = "mega",
    .capabilities = [] { return mega_capabilities(); },
    .unavailable_reason = []() -> std::string {
      int devices = 0;
      if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        cudaGetLastError();
        return "no CUDA device visible";
      }
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9) {
        cudaGetLastError();
        return "needs an sm_90 (Hopper) GPU";
      }
      return {};
    },
    .create = [](const MoeConfig& c, EpGroup* ep, std::shared_ptr<MoeWorkspace> ws) {
      return make_mega_backend(c, ep, std::move(ws));
    },
});
}  // namespace

}  // namespace megamoe
