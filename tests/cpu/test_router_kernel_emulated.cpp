// The CUDA router kernel (src/kernels/sm90_router.cuh) compiled as host C++ and run by a lockstep warp
// emulator, against route_reference. With the host's expf/log1pf on both sides the results must be
// bit-identical, so this checks the kernel's logic and order of operations (lane-strided sums, group
// scores, tie-breaking, NaN/padding handling, error words) in CI, where no GPU exists. The real GPU
// run (tests/gpu/test_router_cuda.cu) then only has device libm differences left to tolerate.
//
// Emulator: the 32 lanes of a warp are ucontext fibers scheduled round-robin; every warp collective
// (__shfl*_sync, __any_sync, __syncwarp) is a barrier at which each lane yields until all 32 arrive.
// A lane that returns while others wait at a barrier, or lanes arriving at different collectives'
// counts, is divergence (undefined with a full mask on the GPU) and fails the test.
#include <gtest/gtest.h>
#include <ucontext.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/router_cases.h"
#include "megamoe/routing.h"
#include "megamoe/routing_cuda.h"

// ---- emulated CUDA device features (global namespace, as in CUDA) ----------------------------------
namespace router_emulation {

struct Index {
  unsigned x = 0;
};

struct Warp {
  std::array<ucontext_t, 32> lanes{};
  std::array<std::vector<char>, 32> stacks;
  std::array<int, 32> barriers{};  // collectives each lane has reached
  std::array<bool, 32> done{};
  std::array<uint64_t, 32> slots{};
  std::array<Index, 32> thread_index{}, block_index{};  // per fiber: they share one OS thread
  ucontext_t scheduler{};
  int current = 0;
  bool diverged = false;
};

inline Warp* warp = nullptr;

inline void barrier() {
  Warp& w = *warp;
  ++w.barriers[w.current];
  swapcontext(&w.lanes[w.current], &w.scheduler);
}

template <typename T>
uint64_t to_bits(T value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  return bits;
}
template <typename T>
T from_bits(uint64_t bits) {
  T value;
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}
template <typename T>
T exchange(T value, int source) {
  warp->slots[warp->current] = to_bits(value);
  barrier();
  const T result = from_bits<T>(warp->slots[source]);
  barrier();
  return result;
}

}  // namespace router_emulation

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(threads)
#define __shared__ static
#define threadIdx (::router_emulation::warp->thread_index[::router_emulation::warp->current])
#define blockIdx (::router_emulation::warp->block_index[::router_emulation::warp->current])

using std::isfinite;
using std::isnan;
inline unsigned __float_as_uint(float f) { return std::bit_cast<unsigned>(f); }
inline float __int_as_float(int i) { return std::bit_cast<float>(i); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
template <typename T>
T __shfl_xor_sync(unsigned, T value, int lane_mask) {
  return router_emulation::exchange(value, router_emulation::warp->current ^ lane_mask);
}
template <typename T>
T __shfl_sync(unsigned, T value, int source) {
  return router_emulation::exchange(value, source);
}
inline bool __any_sync(unsigned, bool predicate) {
  router_emulation::Warp& w = *router_emulation::warp;
  w.slots[w.current] = predicate;
  router_emulation::barrier();
  bool any = false;
  for (int lane = 0; lane < 32; ++lane) any |= w.slots[lane] != 0;
  router_emulation::barrier();
  return any;
}
inline void __syncwarp() { router_emulation::barrier(); }
inline unsigned long long atomicMin(unsigned long long* address, unsigned long long value) {
  const unsigned long long old = *address;  // fibers never interleave between these two lines
  if (value < old) *address = value;
  return old;
}

#define MEGAMOE_ROUTER_HOST_EMULATION 1
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunknown-pragmas"  // the kernel's #pragma unroll
#include "kernels/sm90_router.cuh"
#pragma GCC diagnostic pop
#undef threadIdx
#undef blockIdx
#undef __shared__
#undef __launch_bounds__
#undef __forceinline__
#undef __device__
#undef __global__

namespace megamoe {
namespace {

using kernels::sm90::RouterParams;
using kernels::sm90::kRouterWarpsPerBlock;
using testing::Case;
using testing::kInf;
using testing::kNaN;
using testing::make_config;
using testing::make_problem;
using testing::Problem;
using testing::Routed;
using testing::run_reference;

struct LaunchJob {
  const RouterParams* params;
  void (*kernel)(RouterParams);
  int64_t warps;  // grid * kRouterWarpsPerBlock
};
LaunchJob* job = nullptr;

// One lane's fiber: runs the kernel for every (block, warp) in order, with a barrier between tokens.
void lane_main(int lane) {
  for (int64_t w = 0; w < job->warps; ++w) {
    router_emulation::warp->block_index[lane].x = static_cast<unsigned>(w / kRouterWarpsPerBlock);
    router_emulation::warp->thread_index[lane].x = static_cast<unsigned>((w % kRouterWarpsPerBlock) * 32 + lane);
    job->kernel(*job->params);
    router_emulation::barrier();
  }
  router_emulation::warp->done[lane] = true;
}

template <int kSlots>
void emulate(const RouterParams& params) {
  router_emulation::Warp warp;
  router_emulation::warp = &warp;
  const int64_t blocks = (params.num_tokens + kRouterWarpsPerBlock - 1) / kRouterWarpsPerBlock;
  LaunchJob launch{&params, &kernels::sm90::sm90_router_kernel<kSlots>, blocks * kRouterWarpsPerBlock};
  job = &launch;
  for (int lane = 0; lane < 32; ++lane) {
    warp.stacks[lane].resize(1 << 16);
    getcontext(&warp.lanes[lane]);
    warp.lanes[lane].uc_stack.ss_sp = warp.stacks[lane].data();
    warp.lanes[lane].uc_stack.ss_size = warp.stacks[lane].size();
    warp.lanes[lane].uc_link = &warp.scheduler;
    makecontext(&warp.lanes[lane], reinterpret_cast<void (*)()>(&lane_main), 1, lane);
  }
  // Round-robin: each lane runs to its next collective (or its end); all must agree every round.
  for (bool running = true; running;) {
    for (int lane = 0; lane < 32; ++lane) {
      if (warp.done[lane]) continue;
      warp.current = lane;
      swapcontext(&warp.scheduler, &warp.lanes[lane]);
    }
    running = !warp.done[0];
    for (int lane = 1; lane < 32; ++lane)
      if (warp.done[lane] != warp.done[0] || warp.barriers[lane] != warp.barriers[0]) warp.diverged = true;
    ASSERT_FALSE(warp.diverged) << "warp divergence at a full-mask collective (lane 0 reached "
                                << warp.barriers[0] << " collectives)";
  }
}

void emulate_launch(const RouterParams& params) {
  if (params.num_tokens == 0) return;
  const int slots = (params.num_experts + 31) / 32;
  if (slots <= 1) emulate<1>(params);
  else if (slots <= 2) emulate<2>(params);
  else if (slots <= 4) emulate<4>(params);
  else if (slots <= 8) emulate<8>(params);
  else emulate<16>(params);
}

struct Emulated {
  Routed routed;
  uint64_t status = kRouterStatusOk;
};

Emulated run_emulated(const Case& c, const Problem& p) {
  const size_t n = c.tokens * c.config.top_k;
  Emulated out{{std::vector<int32_t>(n, 0x5a5a5a5a), std::vector<float>(n, kNaN)}, kRouterStatusOk};
  RouterParams params;
  params.logits = p.logits.data();
  params.correction_bias = p.bias.empty() ? nullptr : p.bias.data();
  params.padding = p.padding.data();
  params.token_ids = p.token_ids.empty() ? nullptr : p.token_ids.data();
  params.hash_table = p.table.empty() ? nullptr : p.table.data();
  params.hash_vocab = c.hash_vocab;
  params.topk_ids = out.routed.ids.data();
  params.topk_weights = out.routed.weights.data();
  params.status = reinterpret_cast<unsigned long long*>(&out.status);
  params.num_tokens = static_cast<int>(c.tokens);
  params.num_experts = c.config.num_experts;
  params.top_k = c.config.top_k;
  params.num_groups = c.config.num_groups;
  params.top_k_groups = c.config.top_k_groups;
  params.routed_scaling_factor = c.config.routed_scaling_factor;
  params.renormalize = c.config.renormalize;
  params.hash = c.config.kind == RouterKind::kHash;
  params.score = c.config.kind == RouterKind::kSoftmaxTopK      ? ScoreFunction::kSoftmax
                 : c.config.kind == RouterKind::kSigmoidGrouped ? ScoreFunction::kSigmoid
                 : c.config.kind == RouterKind::kSqrtSoftplus   ? ScoreFunction::kSqrtSoftplus
                                                                : c.config.hash_score;
  emulate_launch(params);
  return out;
}

void expect_bit_identical(const Routed& expected, const Routed& actual, int top_k) {
  ASSERT_EQ(expected.ids.size(), actual.ids.size());
  for (size_t i = 0; i < expected.ids.size(); ++i) {
    ASSERT_EQ(actual.ids[i], expected.ids[i]) << "token " << i / top_k << " slot " << i % top_k;
    ASSERT_EQ(std::bit_cast<uint32_t>(actual.weights[i]), std::bit_cast<uint32_t>(expected.weights[i]))
        << "token " << i / top_k << " slot " << i % top_k << ": " << actual.weights[i] << " vs " << expected.weights[i];
  }
}

TEST(RouterKernelEmulated, BitIdenticalToReferenceForEveryCase) {
  int64_t rows = 0;
  for (Case c : testing::all_router_cases()) {
    c.tokens = std::min<int64_t>(c.tokens, 96);  // the emulator is slow; 96 rows still plant every edge case
    SCOPED_TRACE(c.name + " T=" + std::to_string(c.tokens) + " seed=" + std::to_string(c.seed));
    const Problem p = make_problem(c);
    const Emulated emulated = run_emulated(c, p);
    if (HasFatalFailure()) return;
    EXPECT_EQ(emulated.status, kRouterStatusOk);
    expect_bit_identical(run_reference(c, p), emulated.routed, c.config.top_k);
    if (HasFatalFailure()) return;
    rows += c.tokens;
  }
  EXPECT_GT(rows, 1000);
}

TEST(RouterKernelEmulated, BadInputsEmptyTheirRowsAndRecordTheFirstError) {
  // +inf logits in rows 6 (experts 3 and 7) and 9; row 2 is padded and its +inf ignored.
  Case c{"inf", make_config(RouterKind::kSigmoidGrouped, 40, 3, 4, 2), 12, true};
  c.seed = 3;
  Problem p = make_problem(c);
  std::fill(p.padding.begin(), p.padding.end(), 0);
  p.padding[2] = 1;
  for (float& l : p.logits)
    if (l == kInf) l = 1.0f;
  p.logits[2 * 40 + 5] = p.logits[9 * 40 + 33] = p.logits[6 * 40 + 7] = p.logits[6 * 40 + 3] = kInf;
  Emulated e = run_emulated(c, p);
  EXPECT_EQ(describe_router_status(e.status, c.config, 0),
            "router logits[6, 3] = +inf; logits must be finite, -inf or NaN (the row was routed to ids -1, weights 0)");
  Problem padded = p;
  padded.padding[6] = padded.padding[9] = 1;
  expect_bit_identical(run_reference(c, padded), e.routed, 3);

  // Hash: token 8's id is out of range, token 3's table row holds -3: token 3 is reported first.
  Case h{"hash", make_config(RouterKind::kHash, 40, 3, 1, 1, true, 1.0f, ScoreFunction::kSoftmax), 12};
  h.hash_vocab = 5;
  h.seed = 4;
  p = make_problem(h);
  std::fill(p.padding.begin(), p.padding.end(), 0);
  for (float& l : p.logits)
    if (l == kInf) l = 1.0f;
  std::fill(p.token_ids.begin(), p.token_ids.end(), 1);
  p.token_ids[8] = 5;
  p.token_ids[3] = 2;
  p.table[2 * 3 + 1] = -3;
  e = run_emulated(h, p);
  EXPECT_EQ(describe_router_status(e.status, h.config, 5),
            "router hash_table[token_ids[3], 1] must be in [0, num_experts = 40) (the row was routed to ids -1, weights 0)");
  padded = p;
  padded.padding[3] = padded.padding[8] = 1;
  expect_bit_identical(run_reference(h, padded), e.routed, 3);

  // A non-finite bias empties every row, padded or not; the lowest bad expert is named.
  Case b{"bias", make_config(RouterKind::kSqrtSoftplus, 40, 3), 9, true};
  b.seed = 5;
  p = make_problem(b);
  p.bias[30] = kInf;
  p.bias[17] = kNaN;
  e = run_emulated(b, p);
  EXPECT_NE(describe_router_status(e.status, b.config, 0).find("router correction_bias[17] must be finite"),
            std::string::npos);
  for (size_t i = 0; i < e.routed.ids.size(); ++i) {
    EXPECT_EQ(e.routed.ids[i], -1);
    EXPECT_EQ(e.routed.weights[i], 0.0f);
  }
}

}  // namespace
}  // namespace megamoe
