// EpDispatcher: the typed, validating layer over the dispatch/combine kernels.
#include <algorithm>
#include <cstdlib>

#include "kernels/grouped_gemm_internal.h"  // env_switch
#include "kernels/sm90_combine.cuh"
#include "kernels/sm90_dispatch.cuh"
#include "megamoe/ep_dispatch.h"
#include "megamoe/error_cuda.h"

namespace megamoe {
namespace {

// Depth of the combine-send load ring (items in flight per lane): env MEGAMOE_EP_COMBINE_STAGES in
// {4, 8, 12}, default 8 (a tuning knob for A/B runs; every depth gives bit-identical results).
int combine_send_stages() {
  static const int stages = [] {
    const char* v = std::getenv("MEGAMOE_EP_COMBINE_STAGES");
    if (!v || !*v) return 8;
    const int n = std::atoi(v);
    MEGAMOE_CHECK(n == 4 || n == 8 || n == 12, "MEGAMOE_EP_COMBINE_STAGES = '", v, "' must be 4, 8 or 12");
    return n;
  }();
  return stages;
}

// An integer tuning knob from the environment, in [lo, hi]; unset or empty: unset_value. Every knob below is
// read when a dispatcher is created (like MEGAMOE_EP_OVERLAP), so a test can pick them per dispatcher, and
// every value gives bit-identical results.
int int_from_env(const char* name, int unset_value, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return unset_value;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  MEGAMOE_CHECK(*end == '\0' && n >= lo && n <= hi, name, " = '", v, "' must be an integer in [", lo, ", ", hi, "]");
  return static_cast<int>(n);
}
// Fused combine's lag (virtual steps the own tokens trail the peers' rows): env MEGAMOE_EP_COMBINE_LAG in
// [0, 2^20], default 128 (session 16: 0 / 128 / 512 measured equal).
int combine_lag() { return int_from_env("MEGAMOE_EP_COMBINE_LAG", 128, 0, 1 << 20); }
// Fused dispatch's piece: scale groups (128 channels) a sender stores between two progress publications of a
// row: env MEGAMOE_EP_DISPATCH_PIECE in [1, kEpDispatchMaxGroups], default kEpDispatchMaxGroups, which the
// kernel clamps to the row (one publication per row): session 16 measured 4 / 16 / 28 / 56 groups at 7168
// channels, and 56 was fastest, 1.10x over 16 at 4096 tokens, 1.16x at 8192.
int dispatch_piece_groups() {
  return int_from_env("MEGAMOE_EP_DISPATCH_PIECE", kernels::kEpDispatchMaxGroups, 1, kernels::kEpDispatchMaxGroups);
}
// Fused dispatch's role split: sender warps per block of kEpRoleWarps (the others expand received rows):
// env MEGAMOE_EP_DISPATCH_SEND_WARPS in [1, kEpRoleWarps - 1], default kEpRoleSendWarps (24; a tuning knob:
// session 16 measured 12 / 16 / 20 / 24 / 26 / 28 of 32, and 24 was fastest).
int dispatch_send_warps() {
  return int_from_env("MEGAMOE_EP_DISPATCH_SEND_WARPS", kernels::kEpRoleSendWarps, 1, kernels::kEpRoleWarps - 1);
}

}  // namespace

struct EpDispatcher::Impl {
  EpGroup* group = nullptr;
  EpDispatchConfig config;
  SymmetricBuffer window;
  kernels::DispatchLayout layout{};
  kernels::EpParams params{};
  ReceivedTokens received;
  std::vector<void*> allocations;
  size_t allocated_bytes = 0;
  bool destroyed = false;
  int last_tokens = -1;
  std::array<cudaEvent_t, 7> marks{};  // kernel timing: 4 around dispatch, 3 around combine
  bool timing = false;
  // MEGAMOE_EP_OVERLAP (read once, here at creation, so a test can choose per dispatcher; default 1 since
  // session 16, when both whole suites passed with it): 1 = the fused dispatch (ep_dispatch_fused_kernel)
  // and combine (ep_combine_fused_kernel), 0 = the two-kernel paths. Every rank of the group must use the
  // same value (a mismatch ends in the bounded-wait error of the combine).
  bool overlap = true;
  // MEGAMOE_EP_OVERLAP_DISPATCH=0|1 (unset: = overlap) picks the dispatch path alone, so the fused combine
  // can be timed beside the two-kernel dispatch (every combination is valid).
  bool overlap_dispatch = false;

  void* device_alloc(size_t bytes) {
    void* p = nullptr;
    MEGAMOE_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    MEGAMOE_CUDA_CHECK(cudaMemset(p, 0, std::max<size_t>(bytes, 16)));
    allocations.push_back(p);
    allocated_bytes += std::max<size_t>(bytes, 16);
    return p;
  }
  void require_alive(const char* call) const {
    MEGAMOE_CHECK(!destroyed, "EpDispatcher::", call, " called after destroy()");
    MEGAMOE_CHECK(!group->destroyed(), "EpDispatcher::", call, " called after its EpGroup was destroyed");
  }
};

EpDispatcher::EpDispatcher(EpGroup& group, const EpDispatchConfig& c) : impl_(std::make_unique<Impl>()) {
  const int R = group.size();
  MEGAMOE_CHECK(c.hidden > 0 && c.hidden % kernels::kEpScaleGroup == 0, "EpDispatchConfig.hidden = ", c.hidden,
                " must be a positive multiple of 128");
  MEGAMOE_CHECK(c.top_k >= 1 && c.top_k <= 32, "EpDispatchConfig.top_k = ", c.top_k, " must be in [1, 32]");
  MEGAMOE_CHECK(c.num_experts >= R && c.num_experts % R == 0, "EpDispatchConfig.num_experts = ", c.num_experts,
                " must be a positive multiple of ranks = ", R);
  MEGAMOE_CHECK(c.hidden / kernels::kEpScaleGroup <= kernels::kEpDispatchMaxGroups, "EpDispatchConfig.hidden = ", c.hidden,
                " must be < ", (kernels::kEpDispatchMaxGroups + 1) * kernels::kEpScaleGroup);
  MEGAMOE_CHECK(c.num_experts <= kernels::kEpMaxExperts, "EpDispatchConfig.num_experts = ", c.num_experts,
                " must be <= ", kernels::kEpMaxExperts);
  MEGAMOE_CHECK(c.max_tokens_per_rank >= 1 && c.max_tokens_per_rank <= (1 << 20),
                "EpDispatchConfig.max_tokens_per_rank = ", c.max_tokens_per_rank, " must be in [1, 2^20]");
  auto& m = *impl_;
  m.group = &group;
  m.config = c;
  m.overlap = kernels::detail::env_switch("MEGAMOE_EP_OVERLAP", true);
  m.overlap_dispatch = kernels::detail::env_switch("MEGAMOE_EP_OVERLAP_DISPATCH", m.overlap);
  const int piece_groups = m.overlap_dispatch ? dispatch_piece_groups() : 0;  // checked before any allocation
  const int send_warps = m.overlap_dispatch ? dispatch_send_warps() : 0;
  m.layout = kernels::make_dispatch_layout(c, R);
  m.window = group.allocate(m.layout.total);

  const int local_experts = c.num_experts / R;
  const int64_t C = c.max_tokens_per_rank, k = c.top_k, H = c.hidden;
  const int64_t max_rows = R * C * std::min<int64_t>(k, local_experts);
  const size_t payload = c.payload == EpPayload::kFp8 ? 1 : 2;

  auto& p = m.params;
  p.ctx = group.device_context();
  for (int r = 0; r < R; ++r) p.window[r] = static_cast<char*>(m.window.peers[r]);
  p.layout = m.layout;
  p.hidden = c.hidden;
  p.top_k = c.top_k;
  p.num_experts = c.num_experts;
  p.experts_per_rank = local_experts;
  p.capacity = c.max_tokens_per_rank;
  p.fp8 = c.payload == EpPayload::kFp8;
  p.epoch = static_cast<uint64_t*>(m.device_alloc(sizeof(uint64_t)));
  p.layout_fill = static_cast<int32_t*>(m.device_alloc(sizeof(int32_t) * c.num_experts));
  p.layout_counters = static_cast<uint32_t*>(m.device_alloc(sizeof(uint32_t) * 2));
  p.layout_tile_slots = static_cast<uint64_t*>(m.device_alloc(
      sizeof(uint64_t) * kMaxEpRanks * ((C + kernels::kEpLayoutTileTokens - 1) / kernels::kEpLayoutTileTokens)));
  p.token_dest_slot = static_cast<int32_t*>(m.device_alloc(sizeof(int32_t) * C * R));
  p.send_count = static_cast<int32_t*>(m.device_alloc(sizeof(int32_t) * kMaxEpRanks));
  p.send_expert_counts = static_cast<int32_t*>(m.device_alloc(sizeof(int32_t) * c.num_experts));
  p.slot_pos = static_cast<int32_t*>(m.device_alloc(sizeof(int32_t) * C * k));
  p.saved_ids = static_cast<int32_t*>(m.device_alloc(sizeof(int32_t) * C * k));
  p.saved_weights = static_cast<float*>(m.device_alloc(sizeof(float) * C * k));
  p.expert_offsets = static_cast<int32_t*>(m.device_alloc(sizeof(int32_t) * (local_experts + 1)));
  p.recv_slot_row = static_cast<int32_t*>(m.device_alloc(sizeof(int32_t) * R * C * k));
  p.traffic = static_cast<uint64_t*>(m.device_alloc(sizeof(uint64_t) * 2));
  p.recv_rows = static_cast<int32_t*>(m.device_alloc(sizeof(int32_t) * kMaxEpRanks));
  p.combine_tickets = static_cast<unsigned long long*>(m.device_alloc(sizeof(unsigned long long) * 2));
  p.dispatch_tickets = static_cast<uint32_t*>(m.device_alloc(sizeof(uint32_t) * 4));
  p.dispatch_piece_groups = piece_groups;
  p.dispatch_send_warps = send_warps;
  p.combine_lag = m.overlap ? combine_lag() : 0;
  p.grouped_x = m.device_alloc(max_rows * H * payload);
  p.grouped_scales = p.fp8 ? static_cast<float*>(m.device_alloc(sizeof(float) * max_rows * (H / 128))) : nullptr;
  p.grouped_sources = static_cast<RowSource*>(m.device_alloc(sizeof(RowSource) * max_rows));
  p.grouped_weights = static_cast<float*>(m.device_alloc(sizeof(float) * max_rows));
  p.max_rows = max_rows;

  m.received.num_local_experts = local_experts;
  m.received.first_local_expert = group.rank() * local_experts;
  m.received.max_rows = max_rows;
  m.received.expert_offsets = p.expert_offsets;
  m.received.x = p.grouped_x;
  m.received.x_scales = p.grouped_scales;
  m.received.sources = p.grouped_sources;
  m.received.row_weights = p.grouped_weights;
  MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
}

EpDispatcher::~EpDispatcher() {
  try {
    destroy();
  } catch (...) {
  }
}

const EpDispatchConfig& EpDispatcher::config() const { return impl_->config; }
size_t EpDispatcher::device_bytes() const { return impl_->allocated_bytes; }
size_t EpDispatcher::symmetric_bytes() const { return impl_->window.bytes; }
bool EpDispatcher::overlap() const { return impl_->overlap; }

const ReceivedTokens& EpDispatcher::received() const {
  impl_->require_alive("received");
  return impl_->received;
}

void EpDispatcher::dispatch(const TensorView& hidden, const TensorView& topk_ids, const TensorView& topk_weights,
                            StreamHandle stream) {
  auto& m = *impl_;
  m.require_alive("dispatch");
  m.group->check_errors();
  const auto& c = m.config;
  MEGAMOE_CHECK(hidden.rank == 2, "hidden: expected a 2-D tensor, got rank ", hidden.rank);
  const int64_t T = hidden.shape[0];
  // NOTES: checked before any launch, so an overflowing call writes nothing anywhere.
  MEGAMOE_CHECK(T >= 0 && T <= c.max_tokens_per_rank, "tokens T = ", T, " exceeds the EP capacity max_tokens_per_rank = ",
                c.max_tokens_per_rank, " on rank ", m.group->rank());
  check_tensor("hidden", hidden, DType::kBF16, {T, c.hidden}, Device::kCuda);
  check_tensor("topk_ids", topk_ids, DType::kI32, {T, c.top_k}, Device::kCuda);
  check_tensor("topk_weights", topk_weights, DType::kF32, {T, c.top_k}, Device::kCuda);
  auto p = m.params;
  p.num_tokens = static_cast<int>(T);
  p.hidden_in = static_cast<const __nv_bfloat16*>(hidden.data);
  p.topk_ids = static_cast<const int32_t*>(topk_ids.data);
  p.topk_weights = static_cast<const float*>(topk_weights.data);
  m.group->enter_collective("dispatch");
  kernels::launch_ep_dispatch(p, static_cast<cudaStream_t>(stream), m.timing ? m.marks.data() : nullptr,
                              m.overlap_dispatch);
  m.last_tokens = static_cast<int>(T);
}

void EpDispatcher::combine(const void* expert_out, const TensorView& out, StreamHandle stream, bool apply_weights) {
  auto& m = *impl_;
  m.require_alive("combine");
  m.group->check_errors();
  MEGAMOE_CHECK(m.last_tokens >= 0, "EpDispatcher::combine called before dispatch");
  MEGAMOE_CHECK(expert_out != nullptr || m.params.max_rows == 0, "combine: expert_out is null");
  check_tensor("out", out, DType::kBF16, {m.last_tokens, m.config.hidden}, Device::kCuda);
  auto p = m.params;
  p.num_tokens = m.last_tokens;
  p.expert_out = static_cast<const __nv_bfloat16*>(expert_out);
  p.out = static_cast<__nv_bfloat16*>(out.data);
  p.apply_weights = apply_weights;
  m.group->enter_collective("combine");
  kernels::launch_ep_combine(p, static_cast<cudaStream_t>(stream), m.timing ? m.marks.data() + 4 : nullptr,
                             combine_send_stages(), m.overlap);
}

EpDispatcher::Traffic EpDispatcher::last_remote_traffic(StreamHandle stream) const {
  impl_->require_alive("last_remote_traffic");
  uint64_t counters[2] = {0, 0};
  MEGAMOE_CUDA_CHECK(cudaMemcpyAsync(counters, impl_->params.traffic, sizeof(counters), cudaMemcpyDeviceToHost,
                                     static_cast<cudaStream_t>(stream)));
  MEGAMOE_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  return Traffic{counters[0], counters[1] * static_cast<uint64_t>(impl_->config.hidden) * 2};
}

void EpDispatcher::enable_kernel_timing(bool on) {
  auto& m = *impl_;
  m.require_alive("enable_kernel_timing");
  if (on && !m.marks[0])
    for (auto& e : m.marks) MEGAMOE_CUDA_CHECK(cudaEventCreate(&e));
  m.timing = on;
}

std::array<float, 5> EpDispatcher::last_kernel_times_us() const {
  const auto& m = *impl_;
  m.require_alive("last_kernel_times_us");
  MEGAMOE_CHECK(m.timing, "EpDispatcher::last_kernel_times_us needs enable_kernel_timing(true) before the calls");
  std::array<float, 5> us{};
  const int from[5] = {0, 1, 2, 4, 5};
  for (int i = 0; i < 5; ++i) {
    float ms = 0;
    MEGAMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, m.marks[from[i]], m.marks[from[i] + 1]));
    us[i] = ms * 1000;
  }
  return us;
}

void EpDispatcher::destroy() {
  if (!impl_ || impl_->destroyed) return;
  impl_->destroyed = true;
  for (auto& e : impl_->marks)
    if (e) cudaEventDestroy(e);
  // The symmetric window belongs to the group (freed by EpGroup::destroy, a collective).
  for (void* p : impl_->allocations) cudaFree(p);
  impl_->allocations.clear();
}

}  // namespace megamoe
