// The `reference` backend: a plain CPU implementation of the MoE layer, written to be obviously
// right and to round exactly where the GPU backends round.
//
// NOTES: the pipeline for one token t (hidden row x, H channels), and every rounding point.
//   GPU kernels are tested against this; a kernel that rounds elsewhere must change, or change this.
//
//   0. Input. x = hidden[t] as fp32 (bf16 -> fp32 is exact). fp32 hidden exists for CPU use only.
//   1. GEMM-1 operand a1 [H]:
//        FP8 / W4A8 formats (fp8_block, nvfp4, mxfp4): q, s = formats::quantize_fp8_activations(x)
//          (one fp32 scale per 128 channels: s = max(amax, 1e-10) / 448, q = e4m3_rne(x / s));
//          a1[i] = e4m3(q[i]) * s[i / 128]  -- in fp64, exact (formats::dequantize_fp8_activations_f64).
//          Quantized once per token and shared by all its experts (dispatch sends FP8 + scales).
//        BF16: a1[i] = bf16_rne(x[i]) (a no-op for bf16 hidden).
//   2. Weights: W = formats::dequantize_f64(matrix): the format's value, exact in fp64 (no rounding).
//   3. GEMM-1, for r in [0, 2I): g[r] = fp32( sum_i a1[i] * W13[r, i] )
//        kF64: products in fp64 (exact for bf16, and for scaled formats whenever the significant bits
//              fit 53, e.g. power-of-two scales; else rounded at 2^-53), summed in fp64 (4 interleaved partial
//              sums, i mod 4, combined (s0 + s1) + (s2 + s3)), ONE rounding to fp32.
//        kF32: acc = fmaf(fp32(a1[i]), fp32(W13[r, i]), acc) from acc = 0, i ascending.
//      gate = g[0, I), up = g[I, 2I).
//   4. Activation, fp32, c in [0, I) (GPU: expf and IEEE division, no fast-math intrinsics):
//        silu:           h = (gate / (1.0f + expf(-gate))) * up
//        swiglu_clamped: gc = fminf(gate, limit); uc = fminf(fmaxf(up, -limit), limit);
//                        h = (gc * (1.0f / (1.0f + expf(-(alpha * gc))))) * (uc + 1.0f)
//   5. apply_topk_in_fc1: h = h * topk_weight (fp32 multiply).
//   6. GEMM-2 operand a2 [I]: FP8 formats: quantize_fp8_activations(h) exactly as step 1 (per 128 of
//      I); BF16: a2[c] = bf16_rne(h[c]).
//   7. GEMM-2, for r in [0, H): y[r] = fp32( sum_{c ascending} a2[c] * W2[r, c] ) as in step 3.
//   8. Expert contribution: v = apply_topk_in_fc1 ? y : y * topk_weight (fp32 multiply);
//      for bf16 output v = bf16_rne(v) (the GEMM-2 epilogue stores BF16 rows for the combine).
//   9. Combine: acc = 0.0f; for j = 0 .. top_k-1 with topk_ids[t, j] >= 0: acc = acc + v_j (fp32,
//      slot order; padding slots (id -1) skipped, their weight ignored).
//  10. Shared expert (shared_intermediate > 0): steps 1-7 with its own weights and no top-k weight,
//      v_s = y_s (bf16_rne for bf16 output), then acc = acc + v_s, after all routed slots.
//  11. out[t] = bf16_rne(acc) for bf16 hidden, acc for fp32 hidden. A token whose slots are all
//      padding and with no shared expert gets +0.
//
//   Expert parallel on the CPU (make_reference_backend(..., CpuEpGroup&, rank), tests and CI only):
//   steps 1-8 of a slot run on the rank that holds its expert, steps 9-11 on the token's rank, with
//   the same arithmetic, so results are bit-identical to one rank (see forward_collective).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "backends/registry.h"
#include "megamoe/cpu_ep.h"
#include "megamoe/error.h"
#include "megamoe/formats.h"
#include "megamoe/reference.h"
#include "megamoe/tensor.h"

namespace megamoe {
namespace {

// One expert's weights dequantized exactly (step 2), row-major, K contiguous.
struct DenseExpert {
  bool loaded = false;
  int intermediate = 0;
  std::vector<double> w13;  // [2I, H]
  std::vector<double> w2;   // [H, I]
};

void check_matrix(const char* field, const formats::QuantizedMatrix& m, WeightFormat format, int64_t rows,
                  int64_t cols, const std::string& context) {
  MEGAMOE_CHECK(m.format == format, context, field, ".format = ", weight_format_name(m.format),
                " must equal config weight_format = ", weight_format_name(format));
  MEGAMOE_CHECK(m.rows == rows && m.cols == cols, context, field, " shape = [", m.rows, ", ", m.cols,
                "] must be [", rows, ", ", cols, "]");
  try {
    m.validate();
  } catch (const Error& e) {
    std::string inner = e.what();
    if (inner.rfind("megamoe: ", 0) == 0) inner.erase(0, 9);
    MEGAMOE_FAIL(context, field, ": ", inner);
  }
}

class ReferenceBackend final : public MoeBackend {
 public:
  ReferenceBackend(const MoeConfig& config, ReferenceOptions options, CpuEpGroup* group = nullptr, int rank = 0)
      : config_(config), options_(options), group_(group), rank_(rank) {
    config_.validate();
    if (group_ != nullptr) {
      std::tie(first_expert_, num_experts_) = CpuEpGroup::local_experts(config_.num_experts, group_->num_ranks(), rank);
    } else {
      num_experts_ = config_.num_experts;
    }
    experts_.resize(num_experts_);
  }

  std::string_view name() const override {
    return options_.accumulation == Accumulation::kF64 ? "reference" : "reference_fp32";
  }
  Capabilities capabilities() const override { return reference_capabilities(); }
  const MoeConfig& config() const override { return config_; }
  int first_local_expert() const override { return first_expert_; }
  int num_local_experts() const override { return num_experts_; }

  static Capabilities reference_capabilities() {
    Capabilities caps;
    caps.formats = {WeightFormat::kBf16, WeightFormat::kFp8Block, WeightFormat::kNvfp4, WeightFormat::kMxfp4};
    caps.activations = {Activation::Kind::kSiluMul, Activation::Kind::kSwigluClamped};
    caps.min_ranks = caps.max_ranks = 1;  // through make_backend; CpuEpGroup ranks via make_reference_backend
    return caps;
  }

  void load_expert(int local_expert, const ExpertWeights& weights) override {
    check_alive("load_expert");
    MEGAMOE_CHECK(local_expert >= 0 && local_expert < num_experts_, "load_expert: local_expert = ",
                  local_expert, " must be in [0, num_local_experts = ", num_experts_, ")");
    load(experts_[local_expert], weights, config_.intermediate,
         "expert " + std::to_string(first_expert_ + local_expert) + " ");
  }

  void load_shared_expert(const ExpertWeights& weights) override {
    check_alive("load_shared_expert");
    MEGAMOE_CHECK(config_.shared_intermediate > 0,
                  "load_shared_expert: config shared_intermediate = 0 (no shared expert configured)");
    load(shared_, weights, config_.shared_intermediate, "shared expert ");
  }

  void warmup(StreamHandle) override { check_alive("warmup"); }

  void forward(const MoeInputs& inputs, MoeOutputs& outputs, StreamHandle) override {
    check_alive("forward");
    if (group_ == nullptr) {
      validate(inputs, outputs);
      forward_single_rank(inputs, outputs);
      return;
    }
    // NOTES: a rank whose inputs are bad still joins every barrier; all ranks then throw its error.
    std::string error;
    try {
      validate(inputs, outputs);
    } catch (const Error& e) {
      error = e.what();
      if (error.rfind("megamoe: ", 0) == 0) error.erase(0, 9);
    }
    forward_collective(inputs, outputs, error);
  }

  void destroy() override {
    destroyed_ = true;
    experts_.clear();
    shared_ = DenseExpert{};
  }

 private:
  // Checks shapes, dtypes, ids and weights; ids of experts on other ranks are checked by their owner.
  void validate(const MoeInputs& inputs, const MoeOutputs& outputs) const {
    const int H = config_.hidden, K = config_.top_k, E = config_.num_experts;
    const TensorView& hidden = inputs.hidden;
    MEGAMOE_CHECK(hidden.dtype == DType::kBF16 || hidden.dtype == DType::kF32, "hidden: dtype ",
                  dtype_name(hidden.dtype), " must be bf16 or f32");
    check_tensor("hidden", hidden, hidden.dtype, {-1, H}, Device::kCpu);
    const int64_t T = hidden.shape[0];
    MEGAMOE_CHECK(T <= config_.max_tokens_per_rank, "hidden: tokens T = ", T, " must be <= max_tokens_per_rank = ",
                  config_.max_tokens_per_rank);
    check_tensor("topk_ids", inputs.topk_ids, DType::kI32, {T, K}, Device::kCpu);
    check_tensor("topk_weights", inputs.topk_weights, DType::kF32, {T, K}, Device::kCpu);
    check_tensor("out", outputs.out, hidden.dtype, {T, H}, Device::kCpu);
    const int32_t* ids = inputs.topk_ids.as<int32_t>();
    const float* weights = inputs.topk_weights.as<float>();
    for (int64_t t = 0; t < T; ++t) {
      for (int j = 0; j < K; ++j) {
        const int32_t id = ids[t * K + j];
        const float w = weights[t * K + j];
        MEGAMOE_CHECK(id >= -1 && id < E, "topk_ids[", t, ", ", j, "] = ", id, " must be in [-1, num_experts = ", E, ")");
        MEGAMOE_CHECK(std::isfinite(w), "topk_weights[", t, ", ", j, "] = ", w, " must be finite");
        MEGAMOE_CHECK(!is_local(id) || experts_[id - first_expert_].loaded, "topk_ids[", t, ", ", j, "] = ", id,
                      " names an expert that was never loaded (call load_expert(", id - first_expert_, ", ...))");
      }
    }
    if (group_ != nullptr) {  // remote ranks' tokens may name any local expert
      for (int e = 0; e < num_experts_; ++e)
        MEGAMOE_CHECK(experts_[e].loaded, "rank ", rank_, ": local expert ", e, " (global ", first_expert_ + e,
                      ") was never loaded (call load_expert(", e, ", ...) on every rank before forward)");
    }
    MEGAMOE_CHECK(config_.shared_intermediate == 0 || shared_.loaded,
                  "forward: shared expert configured (shared_intermediate = ", config_.shared_intermediate,
                  ") but load_shared_expert() was never called");
  }

  bool is_local(int32_t id) const { return id >= first_expert_ && id < first_expert_ + num_experts_; }

  static float hidden_value(const TensorView& hidden, int64_t index) {
    return hidden.dtype == DType::kBF16 ? formats::bf16_to_f32(hidden.as<uint16_t>()[index]) : hidden.as<float>()[index];
  }

  // Steps 3-8 for one top-k slot: v [H], the expert contribution (bf16-rounded for bf16 output).
  void slot_contribution(int32_t id, const std::vector<double>& a1, float w, bool bf16_io, std::vector<float>& y,
                         float* v) const {
    expert_output(experts_[id - first_expert_], a1, w, y);
    for (int r = 0; r < config_.hidden; ++r) {
      float value = config_.apply_topk_in_fc1 ? y[r] : y[r] * w;  // step 8
      v[r] = bf16_io ? formats::round_to_bf16(value) : value;
    }
  }

  // Steps 10-11 after the routed slots were summed into acc [H].
  void finish_token(const std::vector<double>& a1, bool bf16_io, std::vector<float>& y, float* acc) const {
    if (config_.shared_intermediate > 0) {  // step 10
      expert_output(shared_, a1, 1.0f, y, /*shared=*/true);
      for (int r = 0; r < config_.hidden; ++r) acc[r] = acc[r] + (bf16_io ? formats::round_to_bf16(y[r]) : y[r]);
    }
  }

  static void write_out(const std::vector<float>& result, bool bf16_io, MoeOutputs& outputs) {
    for (size_t n = 0; n < result.size(); ++n) {
      if (bf16_io) outputs.out.as<uint16_t>()[n] = formats::f32_to_bf16(result[n]);
      else outputs.out.as<float>()[n] = result[n];
    }
  }

  void forward_single_rank(const MoeInputs& inputs, MoeOutputs& outputs) const {
    const int H = config_.hidden, K = config_.top_k;
    const TensorView& hidden = inputs.hidden;
    const int64_t T = hidden.shape[0];
    const int32_t* ids = inputs.topk_ids.as<int32_t>();
    const float* weights = inputs.topk_weights.as<float>();
    // Everything is validated; compute into a scratch buffer, then write `out` (which may alias hidden).
    const bool bf16_io = hidden.dtype == DType::kBF16;
    std::vector<float> result(static_cast<size_t>(T) * H);
    std::vector<float> x(H), y(H), v(H);
    std::vector<double> a1(H);
    for (int64_t t = 0; t < T; ++t) {
      for (int i = 0; i < H; ++i) x[i] = hidden_value(hidden, t * H + i);
      gemm_operand(x.data(), H, a1);  // step 1
      float* acc = result.data() + t * H;  // step 9: starts at +0 (the vector is zero-filled)
      for (int j = 0; j < K; ++j) {
        const int32_t id = ids[t * K + j];
        if (id < 0) continue;
        slot_contribution(id, a1, weights[t * K + j], bf16_io, y, v.data());
        for (int r = 0; r < H; ++r) acc[r] = acc[r] + v[r];
      }
      finish_token(a1, bf16_io, y, acc);
    }
    write_out(result, bf16_io, outputs);
  }

  // What a rank shares with the group for one forward (lives on its stack until the last barrier).
  struct Posted {
    const MoeInputs* inputs = nullptr;
    int64_t tokens = 0;                 // 0 when this rank's inputs failed validation
    bool bf16_io = false;
    float* contributions = nullptr;     // [tokens, top_k, H]: slot (t, j) written by expert owner
    const std::string* error = nullptr;
  };

  // NOTES: three barriers. A: everyone posted; B: everyone read the errors (so a rank that returns
  // early cannot overwrite its slot while another still reads it); C: every slot contribution is
  // written. Between B and C rank r reads peers' inputs and writes the slots of its experts into
  // their buffers; after C each rank sums only its own buffer, in slot order, exactly as
  // forward_single_rank does, and may then overwrite its hidden (out may alias it).
  void forward_collective(const MoeInputs& inputs, MoeOutputs& outputs, const std::string& error) {
    const int H = config_.hidden, K = config_.top_k;
    Posted mine;
    mine.inputs = &inputs;
    mine.error = &error;
    if (error.empty()) {
      mine.tokens = inputs.hidden.shape[0];
      mine.bf16_io = inputs.hidden.dtype == DType::kBF16;
      contributions_.assign(static_cast<size_t>(mine.tokens) * K * H, 0.0f);
      mine.contributions = contributions_.data();
    }
    group_->post(rank_, &mine);
    group_->barrier(rank_);  // A
    std::string group_error;
    for (int r = 0; r < group_->num_ranks() && group_error.empty(); ++r) {
      const auto* peer = static_cast<const Posted*>(group_->peer(r));
      if (!peer->error->empty()) group_error = detail::concat("rank ", r, ": ", *peer->error);
    }
    group_->barrier(rank_);  // B
    MEGAMOE_CHECK(group_error.empty(), "expert-parallel forward failed on ", group_error);

    try {
      std::vector<float> x(H), y(H);
      std::vector<double> a1(H);
      for (int r = 0; r < group_->num_ranks(); ++r) {
        const Posted& peer = *static_cast<const Posted*>(group_->peer(r));
        const int32_t* ids = peer.inputs->topk_ids.as<int32_t>();
        const float* weights = peer.inputs->topk_weights.as<float>();
        for (int64_t t = 0; t < peer.tokens; ++t) {
          bool any_local = false;
          for (int j = 0; j < K; ++j) any_local = any_local || is_local(ids[t * K + j]);
          if (!any_local) continue;
          for (int i = 0; i < H; ++i) x[i] = hidden_value(peer.inputs->hidden, t * H + i);
          gemm_operand(x.data(), H, a1);  // step 1, as the token's own rank would
          for (int j = 0; j < K; ++j) {
            const int32_t id = ids[t * K + j];
            if (!is_local(id)) continue;
            slot_contribution(id, a1, weights[t * K + j], peer.bf16_io, y,
                              peer.contributions + (static_cast<size_t>(t) * K + j) * H);
          }
        }
      }
    } catch (const std::exception& e) {
      group_->abort(detail::concat("rank ", rank_, " failed computing its experts: ", e.what()));
      throw;
    }
    group_->barrier(rank_);  // C

    const int64_t T = mine.tokens;
    const int32_t* ids = inputs.topk_ids.as<int32_t>();
    std::vector<float> result(static_cast<size_t>(T) * H), x(H), y(H);
    std::vector<double> a1(H);
    for (int64_t t = 0; t < T; ++t) {
      float* acc = result.data() + t * H;  // step 9, slot order
      for (int j = 0; j < K; ++j) {
        if (ids[t * K + j] < 0) continue;
        const float* v = contributions_.data() + (static_cast<size_t>(t) * K + j) * H;
        for (int r = 0; r < H; ++r) acc[r] = acc[r] + v[r];
      }
      if (config_.shared_intermediate > 0) {
        for (int i = 0; i < H; ++i) x[i] = hidden_value(inputs.hidden, t * H + i);
        gemm_operand(x.data(), H, a1);
        finish_token(a1, mine.bf16_io, y, acc);
      }
    }
    write_out(result, mine.bf16_io, outputs);
  }

  void check_alive(const char* call) const {
    MEGAMOE_CHECK(!destroyed_, call, ": the ", name(), " backend was destroyed");
  }

  void load(DenseExpert& expert, const ExpertWeights& weights, int intermediate, const std::string& context) {
    const int H = config_.hidden;
    check_matrix("w13", weights.w13, config_.weight_format, 2LL * intermediate, H, context);
    check_matrix("w2", weights.w2, config_.weight_format, H, intermediate, context);
    expert.w13 = formats::dequantize_f64(weights.w13);
    expert.w2 = formats::dequantize_f64(weights.w2);
    expert.intermediate = intermediate;
    expert.loaded = true;
  }

  // Steps 1 / 6: the exact operand a GEMM sees, as fp64.
  void gemm_operand(const float* values, int count, std::vector<double>& operand) const {
    operand.resize(count);
    if (uses_fp8_activations(config_.weight_format)) {
      operand = formats::dequantize_fp8_activations_f64(formats::quantize_fp8_activations(values, 1, count));
    } else {
      for (int i = 0; i < count; ++i) operand[i] = formats::round_to_bf16(values[i]);
    }
  }

  // Steps 3 / 7: one output element.
  float dot(const std::vector<double>& a, const double* w_row) const {
    const size_t n = a.size();
    if (options_.accumulation == Accumulation::kF64) {
      // Four interleaved partial sums (vectorisable); their order only shows at 2^-53 relative.
      double partial[4] = {0.0, 0.0, 0.0, 0.0};
      size_t i = 0;
      for (; i + 4 <= n; i += 4)
        for (size_t lane = 0; lane < 4; ++lane) partial[lane] += a[i + lane] * w_row[i + lane];
      for (; i < n; ++i) partial[i % 4] += a[i] * w_row[i];
      return static_cast<float>((partial[0] + partial[1]) + (partial[2] + partial[3]));
    }
    float sum = 0.0f;
    for (size_t i = 0; i < n; ++i) sum = std::fma(static_cast<float>(a[i]), static_cast<float>(w_row[i]), sum);
    return sum;
  }

  // Steps 3-7 for one expert: y [H] from the GEMM-1 operand a1 [H].
  // The shared expert takes no top-k weight, also not with apply_topk_in_fc1.
  void expert_output(const DenseExpert& expert, const std::vector<double>& a1, float topk_weight,
                     std::vector<float>& y, bool shared = false) const {
    const int H = config_.hidden, I = expert.intermediate;
    std::vector<float> g(2 * static_cast<size_t>(I));
    for (int r = 0; r < 2 * I; ++r) g[r] = dot(a1, expert.w13.data() + static_cast<size_t>(r) * H);
    std::vector<float> h(I);
    const Activation& act = config_.activation;
    for (int c = 0; c < I; ++c) {
      const float gate = g[c], up = g[I + c];
      float value;
      if (act.kind == Activation::Kind::kSiluMul) {
        value = (gate / (1.0f + std::exp(-gate))) * up;
      } else {
        const float gc = std::fmin(gate, act.limit);
        const float uc = std::fmin(std::fmax(up, -act.limit), act.limit);
        value = (gc * (1.0f / (1.0f + std::exp(-(act.alpha * gc))))) * (uc + 1.0f);
      }
      h[c] = config_.apply_topk_in_fc1 && !shared ? value * topk_weight : value;  // step 5
    }
    std::vector<double> a2;
    gemm_operand(h.data(), I, a2);  // step 6
    for (int r = 0; r < H; ++r) y[r] = dot(a2, expert.w2.data() + static_cast<size_t>(r) * I);
  }

  MoeConfig config_;
  ReferenceOptions options_;
  CpuEpGroup* group_ = nullptr;  // null: single rank, all experts local
  int rank_ = 0;
  int first_expert_ = 0, num_experts_ = 0;
  std::vector<DenseExpert> experts_;  // local experts
  std::vector<float> contributions_;  // collective forward: this rank's [T, top_k, H] slot results
  DenseExpert shared_;
  bool destroyed_ = false;
};

backends::BackendEntry reference_entry(const char* name, Accumulation accumulation) {
  backends::BackendEntry entry;
  entry.name = name;
  entry.capabilities = [] { return ReferenceBackend::reference_capabilities(); };
  entry.unavailable_reason = [] { return std::string(); };
  // The reference backend keeps no scratch between forwards: nothing to share in a MoeWorkspace.
  entry.create = [accumulation](const MoeConfig& config, EpGroup* ep,
                                std::shared_ptr<MoeWorkspace>) -> std::unique_ptr<MoeBackend> {
    MEGAMOE_CHECK(ep == nullptr, "backend reference runs on a single rank: pass ep = nullptr (ranks must be 1)");
    return make_reference_backend(config, ReferenceOptions{accumulation});
  };
  return entry;
}

MEGAMOE_REGISTER_BACKEND(reference_entry("reference", Accumulation::kF64));
MEGAMOE_REGISTER_BACKEND(reference_entry("reference_fp32", Accumulation::kF32));

}  // namespace

std::unique_ptr<MoeBackend> make_reference_backend(const MoeConfig& config, ReferenceOptions options) {
  return std::make_unique<ReferenceBackend>(config, options);
}

std::unique_ptr<MoeBackend> make_reference_backend(const MoeConfig& config, ReferenceOptions options,
                                                   CpuEpGroup& group, int rank) {
  return std::make_unique<ReferenceBackend>(config, options, &group, rank);
}

}  // namespace megamoe
