// CUDA routers (routing_cuda.h) against the CPU reference route_reference, plus an independent fp64
// oracle for the weights.
//
// How ids are compared: the kernels run the reference's fp32 operations in the same order, but CUDA's
// expf/log1pf may differ from glibc's by 1-2 ulp. Ids must therefore be identical, except in a row
// where a CPU-selected expert (or a kept group) has a competitor whose fp64 selection score lies
// within the fp32 error bound of its own (an "ambiguous" row; never for softmax without a bias, where
// the logits themselves select). Planted exact ties (identical logit and bias) are NOT ambiguous:
// both sides compute identical scores there, so the lowest id must win on both. A row whose ids
// differ must be ambiguous, must hold distinct valid near-top experts, and its weights must still
// match the fp64 oracle; such rows are counted and bounded.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_stream.h"
#include "common/gpu_skip.h"
#include "megamoe/error.h"
#include "megamoe/error_cuda.h"
#include "megamoe/poison.h"
#include "megamoe/routing.h"
#include "megamoe/routing_cuda.h"
#include "common/router_cases.h"

namespace megamoe {
namespace {

using testing::all_router_cases;
using testing::Case;
using testing::make_config;
using testing::make_problem;
using testing::Problem;
using testing::Routed;
using testing::run_reference;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kUlp = 0x1p-23;  // one fp32 ulp, relative (upper bound)

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t count) : count_(count) {
    if (count_ > 0) MEGAMOE_CUDA_CHECK(cudaMalloc(&data_, count_ * sizeof(T)));
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (data_ != nullptr) cudaFree(data_);
  }
  // NOTES: the tests run on a non-blocking stream, which cudaMemcpy's legacy stream does not order
  // against (and a pageable upload may return before its DMA lands): both sides synchronize the device.
  void upload(const std::vector<T>& host) {
    MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
    if (count_ > 0) MEGAMOE_CUDA_CHECK(cudaMemcpy(data_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice));
    MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<T> download() const {
    MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> host(count_);
    if (count_ > 0) MEGAMOE_CUDA_CHECK(cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  T* get() const { return data_; }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
};


// Device copies of a Problem plus poisoned outputs and a status word.
struct DeviceProblem {
  DeviceArray<float> logits, bias;
  DeviceArray<uint8_t> padding;
  DeviceArray<int32_t> token_ids, table, ids;
  DeviceArray<float> weights;
  DeviceArray<uint64_t> status{1};
  RouterDeviceInputs inputs;

  DeviceProblem(const Case& c, const Problem& p)
      : logits(p.logits), bias(p.bias), padding(p.padding), token_ids(p.token_ids), table(p.table),
        ids(c.tokens * c.config.top_k), weights(c.tokens * c.config.top_k) {
    inputs.logits = logits.get();
    inputs.num_tokens = c.tokens;
    inputs.correction_bias = bias.get();
    inputs.padding = padding.get();
    inputs.token_ids = token_ids.get();
    inputs.hash_table = table.get();
    inputs.hash_vocab = c.hash_vocab;
    inputs.status = status.get();
  }
  void poison_outputs(size_t count, cudaStream_t stream) {
    poison_device_buffer(ids.get(), count * sizeof(int32_t), 0x5a, stream);  // 0x5a5a5a5a: no valid id
    poison_device_buffer(weights.get(), count * sizeof(float), 0xff, stream);  // NaN
  }
  void route(const Case& c, cudaStream_t stream) {
    poison_outputs(c.tokens * c.config.top_k, stream);
    reset_router_status(status.get(), stream);
    route_cuda(c.config, inputs, ids.get(), weights.get(), stream);
  }
  Routed outputs() const { return {ids.download(), weights.download()}; }
};

// ---- fp64 oracle -------------------------------------------------------------------------------------

// Scores of one row in fp64, the selection scores derived from them and, per expert, bounds on how far
// an fp32 evaluation can be from the fp64 values: `relative` for the score, `error` (absolute) for the
// selection score.
struct RowOracle {
  std::vector<double> score, selection, relative, error;
  std::vector<char> valid;
  bool exact_selection = false;  // softmax without bias: the fp32 logits select, no rounding involved
};

RowOracle oracle_row(const RouterConfig& cfg, const float* logits, const std::vector<float>& bias) {
  const int E = cfg.num_experts;
  const ScoreFunction function = cfg.kind == RouterKind::kHash            ? cfg.hash_score
                                 : cfg.kind == RouterKind::kSoftmaxTopK   ? ScoreFunction::kSoftmax
                                 : cfg.kind == RouterKind::kSigmoidGrouped ? ScoreFunction::kSigmoid
                                                                          : ScoreFunction::kSqrtSoftplus;
  RowOracle o;
  o.score.assign(E, 0.0);
  o.selection.assign(E, 0.0);
  o.error.assign(E, 0.0);
  o.relative.assign(E, 0.0);
  o.valid.assign(E, 0);
  double max_logit = -INFINITY;
  for (int e = 0; e < E; ++e)
    if (!std::isnan(logits[e])) max_logit = std::max(max_logit, static_cast<double>(logits[e]));
  double sum = 0;
  for (int e = 0; e < E; ++e)
    if (!std::isnan(logits[e]) && logits[e] != -kInf) sum += std::exp(logits[e] - max_logit);
  for (int e = 0; e < E; ++e) {
    const double l = logits[e];
    o.valid[e] = !std::isnan(logits[e]);
    double relative_error = 16 * kUlp;  // expf/log1pf/div/sqrt in fp32, either library
    switch (function) {
      case ScoreFunction::kSoftmax:
        o.score[e] = l == -INFINITY ? 0.0 : std::exp(l - max_logit) / (sum == 0 ? 1.0 : sum);
        // the fp32 subtraction l - max loses |l - max| * 2^-24 absolutely, which exp turns relative;
        // the lane-strided sum adds <= 21 roundings
        if (l != -INFINITY) relative_error = (std::fabs(l - max_logit) + 48) * kUlp;
        break;
      case ScoreFunction::kSigmoid: o.score[e] = 1.0 / (1.0 + std::exp(-l)); break;
      case ScoreFunction::kSqrtSoftplus: o.score[e] = std::sqrt(std::log1p(std::exp(l))); break;
    }
    const double b = bias.empty() ? 0.0 : bias[e];
    o.selection[e] = bias.empty() && function == ScoreFunction::kSoftmax ? l : o.score[e] + b;
    o.relative[e] = relative_error;
    o.error[e] = relative_error * std::fabs(o.score[e]) + kUlp * (std::fabs(o.score[e]) + std::fabs(b));
  }
  o.exact_selection = bias.empty() && function == ScoreFunction::kSoftmax;
  return o;
}

// Weights the fp64 oracle gives to `ids` (renormalised, scaled).
std::vector<double> oracle_weights(const RouterConfig& cfg, const RowOracle& o, const int32_t* ids) {
  std::vector<double> w(cfg.top_k, 0.0);
  double sum = 0;
  for (int j = 0; j < cfg.top_k; ++j) {
    if (ids[j] >= 0) w[j] = o.score[ids[j]];
    sum += w[j];
  }
  for (double& x : w) x = (cfg.renormalize ? x / (sum == 0 ? 1.0 : sum) : x) * cfg.routed_scaling_factor;
  return w;
}

bool same_inputs(const float* logits, const std::vector<float>& bias, int a, int b) {
  return std::bit_cast<uint32_t>(logits[a]) == std::bit_cast<uint32_t>(logits[b]) &&
         (bias.empty() || std::bit_cast<uint32_t>(bias[a]) == std::bit_cast<uint32_t>(bias[b]));
}

// Which groups the fp64 oracle keeps, and whether that choice is within rounding of another one.
struct GroupChoice {
  std::vector<char> kept;
  bool ambiguous = false;
};

GroupChoice oracle_groups(const RouterConfig& cfg, const RowOracle& o, const float* logits,
                          const std::vector<float>& bias) {
  const int G = cfg.num_groups, size = cfg.num_experts / G;
  GroupChoice choice{std::vector<char>(G, 1), false};
  if (G == 1) return choice;
  struct Group {
    int id, valid = 0, first = -1, second = -1;
    double score = 0, error = 0;
  };
  std::vector<Group> groups(G);
  for (int g = 0; g < G; ++g) {
    Group& gr = groups[g];
    gr.id = g;
    for (int e = g * size; e < (g + 1) * size; ++e) {
      if (!o.valid[e]) continue;
      ++gr.valid;
      if (gr.first < 0 || o.selection[e] > o.selection[gr.first]) gr.second = gr.first, gr.first = e;
      else if (gr.second < 0 || o.selection[e] > o.selection[gr.second]) gr.second = e;
    }
    if (gr.valid == 0) continue;
    // 3x: an fp32 near-tie between the second and third expert may swap which one is summed.
    gr.score = o.selection[gr.first];
    gr.error = 3 * o.error[gr.first];
    if (gr.second >= 0) {
      gr.score += o.selection[gr.second];
      gr.error += 3 * o.error[gr.second] + kUlp * (std::fabs(o.selection[gr.first]) + std::fabs(o.selection[gr.second]));
    }
  }
  std::vector<Group> order = groups;
  std::stable_sort(order.begin(), order.end(), [](const Group& a, const Group& b) {
    if ((a.valid > 0) != (b.valid > 0)) return a.valid > 0;
    return a.score > b.score;
  });
  std::fill(choice.kept.begin(), choice.kept.end(), 0);
  for (int r = 0; r < cfg.top_k_groups; ++r)
    if (order[r].valid > 0) choice.kept[order[r].id] = 1;
  // Identical top-2 inputs give identical fp32 sums on both sides: an exact tie, not an ambiguity.
  const auto identical = [&](const Group& a, const Group& b) {
    const auto same = [&](int x, int y) { return (x < 0 && y < 0) || (x >= 0 && y >= 0 && same_inputs(logits, bias, x, y)); };
    return (a.valid > 1) == (b.valid > 1) && same(a.first, b.first) && same(a.second, b.second);
  };
  for (const Group& in : groups)
    for (const Group& out : groups)
      if (in.valid > 0 && out.valid > 0 && choice.kept[in.id] && !choice.kept[out.id] && !identical(in, out) &&
          std::fabs(in.score - out.score) <= in.error + out.error)
        choice.ambiguous = true;
  return choice;
}

struct Comparison {
  int64_t rows = 0, differing_rows = 0, ambiguous_rows = 0;
  double max_weight_ulps = 0, err2 = 0, ref2 = 0;
};

// Compares one call's GPU outputs with the CPU reference (and the fp64 oracle) row by row.
void compare(const Case& c, const Problem& p, const Routed& cpu, const Routed& gpu, Comparison& stats) {
  const RouterConfig& cfg = c.config;
  const int E = cfg.num_experts, K = cfg.top_k;
  ASSERT_EQ(gpu.ids.size(), cpu.ids.size());
  for (int64_t t = 0; t < c.tokens; ++t) {
    SCOPED_TRACE("token " + std::to_string(t));
    const int32_t* cpu_ids = cpu.ids.data() + t * K;
    const int32_t* gpu_ids = gpu.ids.data() + t * K;
    const float* cpu_w = cpu.weights.data() + t * K;
    const float* gpu_w = gpu.weights.data() + t * K;
    ++stats.rows;
    for (int j = 0; j < K; ++j) {
      ASSERT_TRUE(gpu_ids[j] >= -1 && gpu_ids[j] < E) << "slot " << j << " id " << gpu_ids[j] << " (unwritten?)";
      ASSERT_TRUE(std::isfinite(gpu_w[j]) && gpu_w[j] >= 0.0f) << "slot " << j << " weight " << gpu_w[j];
      if (gpu_ids[j] < 0) ASSERT_EQ(gpu_w[j], 0.0f) << "slot " << j;
    }
    if (p.padding[t] != 0) {
      for (int j = 0; j < K; ++j) ASSERT_EQ(gpu_ids[j], -1) << "padded row, slot " << j;
      continue;
    }
    const float* logits = p.logits.data() + t * E;
    const RowOracle o = oracle_row(cfg, logits, p.bias);
    // fp64 weights of the GPU's own ids (independent of the CPU reference).
    // Relative bound: the score's own error, plus the worst selected one through the renormalising sum.
    const std::vector<double> w64 = oracle_weights(cfg, o, gpu_ids);
    double worst_relative = 0;
    for (int j = 0; j < K; ++j)
      if (gpu_ids[j] >= 0) worst_relative = std::max(worst_relative, o.relative[gpu_ids[j]]);
    for (int j = 0; j < K; ++j) {
      const double bound = 2 * ((gpu_ids[j] >= 0 ? o.relative[gpu_ids[j]] : 0) + worst_relative) + 16 * kUlp;
      ASSERT_LE(std::fabs(gpu_w[j] - w64[j]), bound * std::fabs(w64[j]) + 1e-30)
          << "slot " << j << " id " << gpu_ids[j] << ": gpu " << gpu_w[j] << " vs fp64 " << w64[j];
    }

    const bool ids_equal = std::equal(cpu_ids, cpu_ids + K, gpu_ids);
    if (ids_equal) {
      for (int j = 0; j < K; ++j) {
        const double diff = std::fabs(static_cast<double>(gpu_w[j]) - cpu_w[j]);
        ASSERT_LE(diff, 4e-6 * std::fabs(cpu_w[j]) + 1e-35)
            << "slot " << j << " id " << gpu_ids[j] << ": gpu " << gpu_w[j] << " vs cpu " << cpu_w[j];
        if (cpu_w[j] != 0.0f)
          stats.max_weight_ulps =
              std::max(stats.max_weight_ulps, diff / (std::fabs(cpu_w[j]) * std::numeric_limits<float>::epsilon() / 2));
        stats.err2 += diff * diff;
        stats.ref2 += static_cast<double>(cpu_w[j]) * cpu_w[j];
      }
    }
    if (o.exact_selection || cfg.kind == RouterKind::kHash) {
      ASSERT_TRUE(ids_equal) << "ids differ in a row whose selection involves no rounding; slot 0: gpu " << gpu_ids[0]
                             << " cpu " << cpu_ids[0];
      continue;
    }
    // Ambiguity of this row: kept groups within rounding, or a CPU-selected expert with a competitor
    // (another valid expert of a kept group) within rounding.
    const GroupChoice groups = oracle_groups(cfg, o, logits, p.bias);
    const int group_size = E / cfg.num_groups;
    bool ambiguous = groups.ambiguous;
    for (int j = 0; j < K && !ambiguous && cpu_ids[j] >= 0; ++j)
      for (int e = 0; e < E && !ambiguous; ++e)
        if (e != cpu_ids[j] && o.valid[e] && groups.kept[e / group_size] && !same_inputs(logits, p.bias, e, cpu_ids[j]) &&
            std::fabs(o.selection[e] - o.selection[cpu_ids[j]]) <= o.error[e] + o.error[cpu_ids[j]])
          ambiguous = true;
    stats.ambiguous_rows += ambiguous;
    if (ids_equal) continue;
    ++stats.differing_rows;
    ASSERT_TRUE(ambiguous) << "ids differ in a row without near-ties; slot 0: gpu " << gpu_ids[0] << " cpu "
                           << cpu_ids[0];
    // Still a valid routing: distinct valid experts, as many as the CPU found, -1 only at the tail,
    // and (when the kept groups are certain) each at least as good as the CPU's worst pick, in order.
    const int selected = static_cast<int>(std::count_if(cpu_ids, cpu_ids + K, [](int32_t id) { return id >= 0; }));
    double worst_cpu = INFINITY, worst_cpu_error = 0;
    for (int j = 0; j < selected; ++j)
      if (o.selection[cpu_ids[j]] < worst_cpu) worst_cpu = o.selection[cpu_ids[j]], worst_cpu_error = o.error[cpu_ids[j]];
    for (int j = 0; j < K; ++j) {
      ASSERT_EQ(gpu_ids[j] >= 0, j < selected) << "slot " << j;
      if (j >= selected) continue;
      const int id = gpu_ids[j];
      ASSERT_TRUE(o.valid[id]) << "slot " << j << " picked NaN expert " << id;
      for (int i = 0; i < j; ++i) ASSERT_NE(gpu_ids[i], id) << "expert picked twice";
      if (groups.ambiguous) continue;
      ASSERT_TRUE(groups.kept[id / group_size]) << "slot " << j << " expert " << id << " outside the kept groups";
      ASSERT_GE(o.selection[id] + o.error[id] + worst_cpu_error, worst_cpu) << "slot " << j << " expert " << id;
      if (j > 0)
        ASSERT_LE(o.selection[id] - o.error[id] - o.error[gpu_ids[j - 1]], o.selection[gpu_ids[j - 1]])
            << "slot " << j << " out of order";
    }
  }
}

class RouterCuda : public ::megamoe::testing::OneGpuTest<> {};


TEST_F(RouterCuda, MatchesReferenceForEveryKind) {
  Comparison total;
  for (const Case& c : all_router_cases()) {
    SCOPED_TRACE(c.name + " T=" + std::to_string(c.tokens) + " seed=" + std::to_string(c.seed));
    const Problem p = make_problem(c);
    const Routed cpu = run_reference(c, p);
    DeviceProblem d(c, p);
    d.route(c, stream_);
    MEGAMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    check_router_status(c.config, d.inputs, stream_);  // no error recorded for valid inputs
    Comparison stats;
    compare(c, p, cpu, d.outputs(), stats);
    if (::testing::Test::HasFatalFailure()) return;
    // Rows whose ids legitimately differ are rare: a handful per case at most.
    EXPECT_LE(stats.differing_rows, 2 + stats.rows / 50) << "ambiguous rows " << stats.ambiguous_rows;
    printf("[router] %-42s T=%-5lld ambiguous rows %3lld, differing %lld, max weight diff %.1f ulp\n", c.name.c_str(),
           static_cast<long long>(c.tokens), static_cast<long long>(stats.ambiguous_rows),
           static_cast<long long>(stats.differing_rows), stats.max_weight_ulps);
    total.rows += stats.rows;
    total.err2 += stats.err2;
    total.ref2 += stats.ref2;
  }
  ASSERT_GT(total.ref2, 0.0);
  const double rel_l2 = std::sqrt(total.err2 / total.ref2);
  printf("[router] %lld rows, weights rel-L2 vs CPU reference %.3g\n", static_cast<long long>(total.rows), rel_l2);
  EXPECT_LE(rel_l2, 1e-6);
}

// Exact ties planted everywhere: logits from 7 levels and (sqrt-softplus) a bias from 3 levels,
// so most experts share their (logit, bias) with others. Equal inputs give equal fp32 scores on both
// sides, and distinct ones are far apart here (>= 0.01 against an error of ~1e-6), so the ids must be
// identical: the lowest id wins every tie, in descending score order.
TEST_F(RouterCuda, ExactTiesGoToTheLowestId) {
  constexpr int E = 96, K = 7;
  for (RouterKind kind : {RouterKind::kSoftmaxTopK, RouterKind::kSigmoidGrouped, RouterKind::kSqrtSoftplus}) {
    const bool grouped = kind == RouterKind::kSigmoidGrouped;
    // No bias for the grouped kind: with one, two groups could hold the same four components
    // associated differently ((a + 0) + (b + 1/16) vs (a + 1/16) + (b + 0)), a near-tie, not a tie.
    Case c{"ties", make_config(kind, E, K, grouped ? 6 : 1, grouped ? 3 : 1), 64, kind == RouterKind::kSqrtSoftplus};
    c.seed = 99 + static_cast<int>(kind);
    SCOPED_TRACE(std::string(router_kind_name(kind)) + " seed=" + std::to_string(c.seed));
    Problem p = make_problem(c);
    std::mt19937_64 rng(c.seed);
    std::uniform_int_distribution<int> level(-3, 3), bias_level(-1, 1);
    for (float& b : p.bias) b = static_cast<float>(bias_level(rng)) * 0.0625f;
    for (int64_t t = 0; t < c.tokens; ++t) {
      p.padding[t] = 0;
      for (int e = 0; e < E; ++e) p.logits[t * E + e] = t % 8 == 0 ? 0.5f : static_cast<float>(level(rng)) * 0.75f;
    }
    const Routed cpu = run_reference(c, p);
    DeviceProblem d(c, p);
    d.route(c, stream_);
    const Routed gpu = d.outputs();
    EXPECT_EQ(gpu.ids, cpu.ids);
    Comparison stats;
    compare(c, p, cpu, gpu, stats);
    EXPECT_EQ(stats.differing_rows, 0);
    if (grouped) continue;
    // Rows of one repeated logit: the order is by bias (descending), then by id.
    std::vector<int> expected(E);
    for (int e = 0; e < E; ++e) expected[e] = e;
    std::stable_sort(expected.begin(), expected.end(),
                     [&](int a, int b) { return (p.bias.empty() ? 0.0f : p.bias[a]) > (p.bias.empty() ? 0.0f : p.bias[b]); });
    for (int64_t t = 0; t < c.tokens; t += 8)
      for (int j = 0; j < K; ++j) EXPECT_EQ(gpu.ids[t * K + j], expected[j]) << "token " << t << " slot " << j;
  }
}

// A captured graph replays the router bit for bit and reads the current device inputs.
TEST_F(RouterCuda, GraphReplayIsBitIdentical) {
  std::vector<Case> cases = {
      {"dsv3", make_config(RouterKind::kSigmoidGrouped, 256, 8, 8, 4, true, 2.5f), 256, true},
      {"softmax", make_config(RouterKind::kSoftmaxTopK, 128, 8), 100},
  };
  for (Case& c : cases) {
    c.seed = 4242;
    SCOPED_TRACE(c.name);
    const Problem first = make_problem(c);
    c.seed = 4243;
    const Problem second = make_problem(c);
    DeviceProblem d(c, first);
    d.route(c, stream_);
    const Routed direct_first = d.outputs();
    Comparison direct_stats;
    compare(c, first, run_reference(c, first), direct_first, direct_stats);

    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    MEGAMOE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
    route_cuda(c.config, d.inputs, d.ids.get(), d.weights.get(), stream_);
    MEGAMOE_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    MEGAMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 2; ++replay) {
      d.poison_outputs(c.tokens * c.config.top_k, stream_);
      MEGAMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
      MEGAMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
      const Routed replayed = d.outputs();
      EXPECT_EQ(replayed.ids, direct_first.ids);
      EXPECT_EQ(0, std::memcmp(replayed.weights.data(), direct_first.weights.data(), replayed.weights.size() * 4));
    }
    d.logits.upload(second.logits);  // same shapes, new values: the replay must follow them
    d.padding.upload(second.padding);
    d.bias.upload(second.bias);
    d.poison_outputs(c.tokens * c.config.top_k, stream_);
    MEGAMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    MEGAMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const Routed replayed_second = d.outputs();
    Comparison stats;
    compare(c, second, run_reference(c, second), replayed_second, stats);
    EXPECT_GT(stats.rows, 0);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

// Makes row t a routed row: clears its padding flag and the +inf that make_problem plants in padded rows.
void unpad(Problem& p, int num_experts, int64_t t) {
  p.padding[t] = 0;
  for (int e = 0; e < num_experts; ++e)
    if (p.logits[t * num_experts + e] == kInf) p.logits[t * num_experts + e] = 1.0f;
}

std::string status_message(const RouterConfig& config, const RouterDeviceInputs& inputs, cudaStream_t stream) {
  try {
    check_router_status(config, inputs, stream);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Bad device data: the affected rows become ids -1 / weights 0, the others are routed normally, and
// the status names the first bad element like route_reference's exception would.
TEST_F(RouterCuda, BadDeviceDataEmptiesRowsAndReportsTheFirstError) {
  {
    Case c{"inf logits", make_config(RouterKind::kSigmoidGrouped, 64, 4, 8, 4), 40, true};
    c.seed = 7;
    Problem p = make_problem(c);
    for (int64_t t : {7, 20}) unpad(p, 64, t);
    p.logits[20 * 64 + 2] = kInf;
    p.logits[7 * 64 + 13] = kInf;
    p.logits[7 * 64 + 40] = kInf;
    DeviceProblem d(c, p);
    d.route(c, stream_);
    const std::string message = status_message(c.config, d.inputs, stream_);
    EXPECT_NE(message.find("router logits[7, 13] = +inf"), std::string::npos) << message;
    // The CPU reference of the same problem with the bad rows padded.
    Problem padded = p;
    padded.padding[7] = padded.padding[20] = 1;
    Comparison stats;
    compare(c, padded, run_reference(c, padded), d.outputs(), stats);
  }
  {
    Case c{"hash", make_config(RouterKind::kHash, 32, 4, 1, 1, true, 1.0f, ScoreFunction::kSigmoid), 30};
    c.hash_vocab = 10;
    c.seed = 8;
    Problem p = make_problem(c);
    for (int64_t t : {5, 9, 11}) unpad(p, 32, t);
    for (auto& id : p.token_ids) id = id == 3 ? 4 : id;
    p.token_ids[9] = 3;
    p.token_ids[11] = 3;
    p.table[3 * 4 + 2] = 32;  // expert out of range, used by rows 9 and 11
    p.token_ids[5] = 10;      // token id out of range
    p.token_ids[6] = -1;      // also out of range, but a later row...
    p.padding[6] = 1;         // ...and padded, so never looked at
    DeviceProblem d(c, p);
    d.route(c, stream_);
    std::string message = status_message(c.config, d.inputs, stream_);
    EXPECT_NE(message.find("router token_ids[5] must be in [0, hash_vocab = 10)"), std::string::npos) << message;
    Problem padded = p;
    for (int64_t t : {5, 9, 11}) padded.padding[t] = 1;
    Comparison stats;
    compare(c, padded, run_reference(c, padded), d.outputs(), stats);
    // Fix the token id: the next error is the table entry.
    p.token_ids[5] = 4;
    d.token_ids.upload(p.token_ids);
    d.route(c, stream_);
    message = status_message(c.config, d.inputs, stream_);
    EXPECT_NE(message.find("router hash_table[token_ids[9], 2] must be in [0, num_experts = 32)"), std::string::npos)
        << message;
  }
  {
    Case c{"bias", make_config(RouterKind::kSqrtSoftplus, 40, 3), 9, true};
    c.seed = 9;
    Problem p = make_problem(c);
    p.bias[31] = kNaN;
    p.bias[3] = kInf;
    DeviceProblem d(c, p);
    d.route(c, stream_);
    const std::string message = status_message(c.config, d.inputs, stream_);
    EXPECT_NE(message.find("router correction_bias[3] must be finite"), std::string::npos) << message;
    const Routed gpu = d.outputs();
    for (size_t i = 0; i < gpu.ids.size(); ++i) {
      ASSERT_EQ(gpu.ids[i], -1) << i;
      ASSERT_EQ(gpu.weights[i], 0.0f) << i;
    }
    // Without a status word the rows are still emptied, and nothing is reported anywhere.
    d.inputs.status = nullptr;
    d.route(c, stream_);
    EXPECT_EQ(d.outputs().ids, gpu.ids);
  }
}

// Host-side validation: a clear megamoe::Error naming the field and the limit, before any launch.
TEST(RouterCudaArguments, RejectsBadConfigurationsAndPointers) {
  const auto expect_error = [](auto fn, const char* needle) {
    try {
      fn();
      ADD_FAILURE() << "expected megamoe::Error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  float dummy_logits[1] = {0};
  int32_t dummy_ids[1] = {0};
  float dummy_weights[1] = {0};
  RouterDeviceInputs in;
  in.logits = dummy_logits;
  in.num_tokens = 1;
  const auto route = [&](RouterConfig cfg, RouterDeviceInputs inputs) {
    route_cuda(cfg, inputs, dummy_ids, dummy_weights, nullptr);
  };
  expect_error([&] { route(make_config(RouterKind::kSoftmaxTopK, 1024, 8), in); }, "num_experts = 1024 must be <= 512");
  expect_error([&] { route(make_config(RouterKind::kSoftmaxTopK, 64, 17), in); }, "top_k = 17 must be <= 16");
  expect_error([&] { route(make_config(RouterKind::kSoftmaxTopK, 64, 65), in); }, "top_k = 65");
  expect_error([&] { route(make_config(RouterKind::kSigmoidGrouped, 64, 4, 6, 2), in); }, "num_groups = 6");
  RouterDeviceInputs negative = in;
  negative.num_tokens = -1;
  expect_error([&] { route(make_config(RouterKind::kSoftmaxTopK, 64, 4), negative); }, "num_tokens = -1");
  RouterDeviceInputs no_logits = in;
  no_logits.logits = nullptr;
  expect_error([&] { route(make_config(RouterKind::kSoftmaxTopK, 64, 4), no_logits); }, "logits must not be null");
  expect_error([&] { route(make_config(RouterKind::kHash, 64, 4), in); }, "token_ids must be given");
  RouterDeviceInputs no_table = in;
  no_table.token_ids = dummy_ids;
  expect_error([&] { route(make_config(RouterKind::kHash, 64, 4), no_table); }, "hash_vocab > 0");
  expect_error([&] { route_cuda(make_config(RouterKind::kSoftmaxTopK, 64, 4), in, nullptr, dummy_weights, nullptr); },
               "topk_ids/topk_weights must not be null");
  // T == 0 needs no pointers and launches nothing.
  RouterDeviceInputs empty;
  route_cuda(make_config(RouterKind::kSoftmaxTopK, 64, 4), empty, nullptr, nullptr, nullptr);
  // Status decoding names the field and the limit.
  const RouterConfig cfg = make_config(RouterKind::kHash, 64, 4);
  EXPECT_EQ(describe_router_status(kRouterStatusOk, cfg, 5), "");
  EXPECT_NE(describe_router_status((uint64_t{12} << 32) | (uint64_t{4} << 28) | 3, cfg, 5)
                .find("hash_table[token_ids[12], 3] must be in [0, num_experts = 64)"),
            std::string::npos);
}

}  // namespace
}  // namespace megamoe
