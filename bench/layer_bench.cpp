#include "bench/layer_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <memory>
#include <numeric>
#include <thread>

#include "megamoe/ep.h"
#include "megamoe/error.h"
#include "megamoe/formats.h"
#include "megamoe/moe.h"
#include "megamoe/routing.h"

#include "src/backends/registry.h"

#ifdef MEGAMOE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "megamoe/error_cuda.h"
#include "src/moe/mega_backend.h"
#endif
#include "src/moe/mega_path_heuristics.h"

namespace megamoe::bench {
namespace {

std::string lowered(std::string_view name) {
  std::string out(name);
  for (char& c : out) c = c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// splitmix64: fast, seeded, and identical on every platform (std distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }  // (0, 1)
  float normal() {  // Box-Muller
    return static_cast<float>(std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()));
  }

 private:
  uint64_t state_;
};

ExpertWeights make_expert(const LayerShape& shape, WeightFormat format, Rng& rng) {
  auto random_matrix = [&](int64_t rows, int64_t cols) {
    std::vector<float> m(static_cast<size_t>(rows * cols));
    const float scale = 1.0f / std::sqrt(static_cast<float>(cols));
    for (float& v : m) v = rng.normal() * scale;
    return m;
  };
  const int64_t H = shape.hidden, I = shape.intermediate;
  const std::vector<float> w13 = random_matrix(2 * I, H), w2 = random_matrix(H, I);
  ExpertWeights weights;
  weights.w13 = format == WeightFormat::kNvfp4 ? formats::quantize_nvfp4_per_half(w13.data(), 2 * I, H)
                                                : formats::quantize(w13.data(), 2 * I, H, format);
  weights.w2 = formats::quantize(w2.data(), H, I, format);
  return weights;
}

struct Routing {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  int64_t rows = 0;
};

Routing make_routing(const LayerBenchOptions& o, int tokens, Rng& rng) {
  const int E = o.shape.experts;
  std::vector<float> log_p(E, 0.0f);
  if (o.routing == RoutingPattern::kZipf) {
    std::vector<int> permutation(E);
    std::iota(permutation.begin(), permutation.end(), 0);
    for (int i = E - 1; i > 0; --i) std::swap(permutation[i], permutation[rng.next() % (i + 1)]);
    for (int r = 0; r < E; ++r) log_p[permutation[r]] = static_cast<float>(-1.2 * std::log(r + 1.0));
  } else if (o.routing == RoutingPattern::kOneRank) {
    for (int e = E / o.ranks; e < E; ++e) log_p[e] = -std::numeric_limits<float>::infinity();
  }
  std::vector<float> logits(static_cast<size_t>(tokens) * E);
  for (int t = 0; t < tokens; ++t)
    for (int e = 0; e < E; ++e)
      logits[static_cast<size_t>(t) * E + e] = log_p[e] - static_cast<float>(std::log(-std::log(rng.uniform())));
  RouterConfig router;
  router.kind = RouterKind::kSoftmaxTopK;
  router.num_experts = E;
  router.top_k = o.shape.top_k;
  router.renormalize = true;
  RouterInputs in;
  in.logits = logits.data();
  in.num_tokens = tokens;
  Routing r;
  r.ids.resize(static_cast<size_t>(tokens) * o.shape.top_k);
  r.weights.resize(r.ids.size());
  route_reference(router, in, r.ids.data(), r.weights.data());
  r.rows = std::count_if(r.ids.begin(), r.ids.end(), [](int32_t id) { return id >= 0; });
  return r;
}

MoeConfig layer_config(const LayerBenchOptions& o, int num_experts, int max_tokens) {
  MoeConfig c;
  c.hidden = o.shape.hidden;
  c.intermediate = o.shape.intermediate;
  c.num_experts = num_experts;
  c.top_k = o.shape.top_k;
  c.weight_format = o.format;
  c.activation = o.activation;
  c.apply_topk_in_fc1 = o.apply_topk_in_fc1;
  c.max_tokens_per_rank = std::max(max_tokens, 1);
  return c;
}

// A backend ready to run: CPU backends get the pool-compressed expert set (see layer_bench.h).
struct PreparedBackend {
  std::unique_ptr<MoeBackend> backend;
  bool on_gpu = false;
  int expert_modulus = 0;  // ids are taken mod this (the pool size) for CPU backends; 0 = as is
};

// GPU backends join the EP group `ep` (null for one rank); CPU backends always run alone.
bool backend_needs_gpu(const std::string& name) {
  for (const auto& entry : backends::registered_backends())
    if (entry.name == normalize_backend_name(name)) return entry.capabilities().needs_gpu;
  return false;  // unknown: make_backend reports it
}

// One backend to time: its name and, for `mega`, the path mode it runs with.
struct BackendRun {
  std::string name;
  bool mega = false;
  MegaPathMode mega_path = MegaPathMode::kAuto;
};

// o.backends with every `mega` expanded by --mega-path (two runs for "both").
std::vector<BackendRun> backend_runs(const LayerBenchOptions& o) {
  MEGAMOE_CHECK(o.mega_path == "both" || o.mega_path == "auto" || o.mega_path == "fused" || o.mega_path == "split",
                "--mega-path = '", o.mega_path, "' must be one of auto, fused, split, both");
  std::vector<BackendRun> runs;
  for (const std::string& name : o.backends) {
    if (normalize_backend_name(name) != "mega") {
      runs.push_back(BackendRun{name});
      continue;
    }
    if (o.mega_path == "both") {
      runs.push_back(BackendRun{name, true, MegaPathMode::kFused});
      runs.push_back(BackendRun{name, true, MegaPathMode::kSplit});
    } else {
      runs.push_back(BackendRun{name, true, parse_mega_path_mode(o.mega_path, "--mega-path")});
    }
  }
  return runs;
}

PreparedBackend prepare(const BackendRun& run, const LayerBenchOptions& o, const std::vector<ExpertWeights>& pool,
                        int max_tokens, EpGroup* ep = nullptr) {
  const std::string& name = run.name;
  PreparedBackend p;
#ifdef MEGAMOE_WITH_CUDA
  if (run.mega)
    p.backend = make_mega_backend(layer_config(o, o.shape.experts, max_tokens), ep, nullptr, run.mega_path);
#endif
  if (!p.backend)
    p.backend = make_backend(name, layer_config(o, o.shape.experts, max_tokens), backend_needs_gpu(name) ? ep : nullptr);
  p.on_gpu = p.backend->capabilities().needs_gpu;
  const int D = static_cast<int>(pool.size());
  if (!p.on_gpu && D < o.shape.experts) {
    MoeConfig compressed = layer_config(o, o.shape.experts, max_tokens);
    compressed.num_experts = D;
    compressed.top_k = std::min(compressed.top_k, D);
    MEGAMOE_CHECK(compressed.top_k == o.shape.top_k, "--distinct-experts = ", D, " must be >= top_k = ",
                  o.shape.top_k, " for CPU backends");
    p.backend = make_backend(name, compressed, nullptr);
    p.expert_modulus = D;
  }
  for (int e = 0; e < p.backend->num_local_experts(); ++e)
    p.backend->load_expert(e, pool[(p.backend->first_local_expert() + e) % D]);
  p.backend->warmup(nullptr);
  return p;
}

// Runs `iters` timed forwards (after `warmup`); returns per-iteration µs and the output of the last
// run as bf16 bits, host side. With `phases`, GPU backends run with phase timing on and each timed
// forward's MoeBackend::last_phase_times() is appended (an empty entry when the backend has none).
std::vector<double> time_forward(PreparedBackend& p, const LayerBenchOptions& o, const std::vector<uint16_t>& hidden,
                                 const Routing& routing, int tokens, std::vector<uint16_t>& out_host,
                                 std::vector<std::vector<MoeBackend::PhaseTime>>* phases = nullptr,
                                 std::vector<GpuClockSample>* clocks = nullptr) {
  const int H = o.shape.hidden, K = o.shape.top_k;
  std::vector<int32_t> ids = routing.ids;
  if (p.expert_modulus > 0)
    for (int32_t& id : ids) id = id < 0 ? id : id % p.expert_modulus;
  out_host.assign(static_cast<size_t>(tokens) * H, 0xFFFF);  // poison: bf16 NaN
  std::vector<double> us;
  auto timed = [&](auto&& forward_once, auto&& now_us) {
    for (int i = 0; i < o.warmup + o.iters; ++i) {
      const double start = now_us();
      forward_once();
      const double elapsed = now_us() - start;
      if (i >= o.warmup) us.push_back(elapsed);
    }
  };
  if (!p.on_gpu) {
    std::vector<uint16_t> hidden_copy(hidden.begin(), hidden.begin() + static_cast<size_t>(tokens) * H);
    std::vector<float> weights = routing.weights;
    MoeInputs in;
    in.hidden = TensorView::make2d(hidden_copy.data(), DType::kBF16, tokens, H, Device::kCpu);
    in.topk_ids = TensorView::make2d(ids.data(), DType::kI32, tokens, K, Device::kCpu);
    in.topk_weights = TensorView::make2d(weights.data(), DType::kF32, tokens, K, Device::kCpu);
    MoeOutputs out;
    out.out = TensorView::make2d(out_host.data(), DType::kBF16, tokens, H, Device::kCpu);
    timed([&] { p.backend->forward(in, out, nullptr); },
          [] {
            return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch())
                .count();
          });
    return us;
  }
#ifdef MEGAMOE_WITH_CUDA
  // Device path: inputs copied once; each forward timed with events on one stream.
  const size_t hidden_bytes = static_cast<size_t>(tokens) * H * 2, slot_count = static_cast<size_t>(tokens) * K;
  void *d_hidden = nullptr, *d_ids = nullptr, *d_weights = nullptr, *d_out = nullptr;
  MEGAMOE_CUDA_CHECK(cudaMalloc(&d_hidden, std::max<size_t>(hidden_bytes, 16)));
  MEGAMOE_CUDA_CHECK(cudaMalloc(&d_out, std::max<size_t>(hidden_bytes, 16)));
  MEGAMOE_CUDA_CHECK(cudaMalloc(&d_ids, std::max<size_t>(slot_count * 4, 16)));
  MEGAMOE_CUDA_CHECK(cudaMalloc(&d_weights, std::max<size_t>(slot_count * 4, 16)));
  MEGAMOE_CUDA_CHECK(cudaMemcpy(d_hidden, hidden.data(), hidden_bytes, cudaMemcpyHostToDevice));
  MEGAMOE_CUDA_CHECK(cudaMemcpy(d_ids, ids.data(), slot_count * 4, cudaMemcpyHostToDevice));
  MEGAMOE_CUDA_CHECK(cudaMemcpy(d_weights, routing.weights.data(), slot_count * 4, cudaMemcpyHostToDevice));
  MEGAMOE_CUDA_CHECK(cudaMemset(d_out, 0xFF, hidden_bytes));
  cudaStream_t stream = nullptr;
  cudaEvent_t begin = nullptr, end = nullptr;
  MEGAMOE_CUDA_CHECK(cudaStreamCreate(&stream));
  MEGAMOE_CUDA_CHECK(cudaEventCreate(&begin));
  MEGAMOE_CUDA_CHECK(cudaEventCreate(&end));
  MoeInputs in;
  in.hidden = TensorView::make2d(d_hidden, DType::kBF16, tokens, H, Device::kCuda);
  in.topk_ids = TensorView::make2d(d_ids, DType::kI32, tokens, K, Device::kCuda);
  in.topk_weights = TensorView::make2d(d_weights, DType::kF32, tokens, K, Device::kCuda);
  in.max_tokens_any_rank = tokens;  // every rank runs the same tokens
  MoeOutputs out;
  out.out = TensorView::make2d(d_out, DType::kBF16, tokens, H, Device::kCuda);
  // Phase timing adds a few event records inside the forward (each one stream operation, no host
  // synchronisation, ~1 µs): the total between `begin` and `end` stays the same work. The phases are
  // read after the per-iteration synchronisation, outside the timed span.
  p.backend->set_phase_timing(phases != nullptr);
  const GpuClockProbe probe;  // NVML reads after each timed forward (outside the timed span)
  for (int i = 0; i < o.warmup + o.iters; ++i) {
    MEGAMOE_CUDA_CHECK(cudaEventRecord(begin, stream));
    p.backend->forward(in, out, stream);
    MEGAMOE_CUDA_CHECK(cudaEventRecord(end, stream));
    MEGAMOE_CUDA_CHECK(cudaEventSynchronize(end));
    float ms = 0;
    MEGAMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, begin, end));
    if (i >= o.warmup) {
      us.push_back(ms * 1000.0);
      if (phases) phases->push_back(p.backend->last_phase_times());
      if (clocks && probe.available()) clocks->push_back(probe.sample());
    }
  }
  p.backend->set_phase_timing(false);
  MEGAMOE_CUDA_CHECK(cudaMemcpy(out_host.data(), d_out, hidden_bytes, cudaMemcpyDeviceToHost));
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  cudaStreamDestroy(stream);
  for (void* ptr : {d_hidden, d_out, d_ids, d_weights}) cudaFree(ptr);
  return us;
#else
  MEGAMOE_FAIL("backend ", p.backend->name(), " needs a GPU but this megamoe was built without CUDA");
#endif
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

float bf16_value(uint16_t bits) { return formats::bf16_to_f32(bits); }

// Per-phase medians over the timed forwards, in the backend's phase order; empty when any forward
// reported no phases (timing off or a backend without separable phases).
std::vector<MoeBackend::PhaseTime> median_phases(const std::vector<std::vector<MoeBackend::PhaseTime>>& runs) {
  if (runs.empty() || runs.front().empty()) return {};
  std::vector<MoeBackend::PhaseTime> medians;
  for (size_t p = 0; p < runs.front().size(); ++p) {
    std::vector<double> us, cta_mean_us;
    for (const auto& run : runs) {
      MEGAMOE_CHECK(run.size() == runs.front().size() && run[p].phase == runs.front()[p].phase,
                    "last_phase_times(): the phases changed between forwards");
      us.push_back(run[p].us);
      cta_mean_us.push_back(run[p].cta_mean_us);
    }
    medians.push_back({runs.front()[p].phase, median(us), runs.front()[p].cta_mean_us < 0 ? -1 : median(cta_mean_us)});
  }
  return medians;
}

double phase_us(const std::vector<MoeBackend::PhaseTime>& phases, std::string_view name) {
  for (const MoeBackend::PhaseTime& p : phases)
    if (p.phase == name) return p.us;
  return 0;
}

}  // namespace

std::string phase_split_text(const std::vector<MoeBackend::PhaseTime>& phases) {
  if (phases.empty()) return "-";
  auto short_name = [](const std::string& phase) -> std::string {
    if (phase == "dispatch") return "disp";
    if (phase == "gemm1") return "g1";
    if (phase == "gemm2") return "g2";
    if (phase == "combine") return "comb";
    if (phase == "stage") return "stg";  // `mega` (legend under the table)
    if (phase == "offsets") return "ofs";
    if (phase == "combine_wait") return "cw";
    if (phase == "reduce") return "red";
    return phase;
  };
  std::string text;
  for (const MoeBackend::PhaseTime& p : phases) {
    char us[32];
    std::snprintf(us, sizeof(us), "%.0f", p.us);
    text += (text.empty() ? "" : " / ") + short_name(p.phase) + " " + us;
  }
  return text;
}

namespace {

// The routing's own stream (see the NOTES in layer_bench.h): token counts draw from it in order.
Rng routing_stream(uint64_t seed) { return Rng(seed * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull); }

// Measured H200 ceilings (docs/perf.md).
constexpr double kFp8TensorTflops = 1420.0, kBf16TensorTflops = 780.0, kHbmBytesPerS = 4.2e12;
constexpr double kNvlinkBytesPerS = 370e9;  // per direction per GPU

double compute_floor_us(const LayerShape& shape, WeightFormat format, int64_t rows) {
  const double flop = 2.0 * static_cast<double>(rows) * shape.hidden * shape.intermediate * 3.0;
  return flop / ((format == WeightFormat::kBf16 ? kBf16TensorTflops : kFp8TensorTflops) * 1e12) * 1e6;
}

double weights_floor_us(const LayerShape& shape, WeightFormat format, int touched_experts) {
  const double H = shape.hidden, I = shape.intermediate;
  double bytes_per_expert = 0;
  switch (format) {
    case WeightFormat::kBf16: bytes_per_expert = 3 * H * I * 2; break;
    case WeightFormat::kFp8Block: bytes_per_expert = 3 * H * I * (1.0 + 4.0 / (128 * 128)); break;
    default: bytes_per_expert = 3 * H * I * (0.5 + 1.0 / 16); break;  // FP4 + one E4M3 scale per 16
  }
  return touched_experts * bytes_per_expert / kHbmBytesPerS * 1e6;
}

}  // namespace

double LayerFloor::us() const { return std::max({compute_us, weights_us, nvlink_us}); }

const char* LayerFloor::bound() const {
  if (compute_us >= weights_us && compute_us >= nvlink_us) return "compute";
  return weights_us >= nvlink_us ? "weights" : "nvlink";
}

namespace {

// Per rank r, for `ranks` ranks that all route `ids`: slots routed to its experts, its experts that
// were hit, tokens with >= 1 expert on it (each such token of every other rank arrives once and goes
// back as one partial row), and the other ranks each of its own tokens must reach.
struct RouteCounts {
  std::vector<int64_t> slots, hit_tokens, remote_destinations;
  std::vector<std::vector<bool>> touched;
};

RouteCounts count_routes(const LayerShape& shape, int ranks, const std::vector<int32_t>& ids) {
  MEGAMOE_CHECK(ranks >= 1 && shape.experts >= ranks && shape.experts % ranks == 0, "layer_floor: experts = ",
                shape.experts, " must be a positive multiple of ranks = ", ranks);
  MEGAMOE_CHECK(shape.top_k >= 1, "layer_floor: top_k = ", shape.top_k, " must be >= 1");
  const int K = shape.top_k, per_rank = shape.experts / ranks;
  const int64_t tokens = static_cast<int64_t>(ids.size()) / K;
  RouteCounts c;
  c.slots.assign(ranks, 0);
  c.hit_tokens.assign(ranks, 0);
  c.remote_destinations.assign(ranks, 0);
  c.touched.assign(ranks, std::vector<bool>(per_rank, false));
  auto& [slots, hit_tokens, remote_destinations, touched] = c;
  std::vector<bool> hits(ranks);
  for (int64_t t = 0; t < tokens; ++t) {
    std::fill(hits.begin(), hits.end(), false);
    for (int j = 0; j < K; ++j) {
      const int32_t id = ids[static_cast<size_t>(t * K + j)];
      if (id < 0) continue;
      MEGAMOE_CHECK(id < shape.experts, "layer_floor: expert id ", id, " must be < experts = ", shape.experts);
      const int owner = id / per_rank;
      ++slots[owner];
      touched[owner][id % per_rank] = true;
      hits[owner] = true;
    }
    const int destinations = static_cast<int>(std::count(hits.begin(), hits.end(), true));
    for (int r = 0; r < ranks; ++r) {
      hit_tokens[r] += hits[r];
      remote_destinations[r] += destinations - (hits[r] ? 1 : 0);
    }
  }
  return c;
}

// The least bytes rank r sends / receives over NVLink (see the NOTES in layer_bench.h).
LayerNvlinkBytes rank_nvlink_bytes(const LayerShape& shape, WeightFormat format, int ranks, const RouteCounts& c, int r) {
  const double H = shape.hidden;
  const double dispatch_row = format == WeightFormat::kBf16 ? 2 * H : H + 4 * (H / 128);  // activations sent
  const double combine_row = 2 * H;                                                       // BF16 partial back
  const double other_ranks = ranks - 1;
  return LayerNvlinkBytes{
      .out = c.remote_destinations[r] * dispatch_row + other_ranks * c.hit_tokens[r] * combine_row,
      .in = other_ranks * c.hit_tokens[r] * dispatch_row + c.remote_destinations[r] * combine_row};
}

}  // namespace

LayerFloor layer_floor(const LayerShape& shape, WeightFormat format, int ranks, const std::vector<int32_t>& ids) {
  const RouteCounts c = count_routes(shape, ranks, ids);
  LayerFloor floor;
  for (int r = 0; r < ranks; ++r) {
    const LayerNvlinkBytes bytes = rank_nvlink_bytes(shape, format, ranks, c, r);
    floor.compute_us = std::max(floor.compute_us, compute_floor_us(shape, format, ranks * c.slots[r]));
    floor.weights_us = std::max(floor.weights_us, weights_floor_us(shape, format, static_cast<int>(std::count(
                                                                                      c.touched[r].begin(), c.touched[r].end(), true))));
    floor.nvlink_us = std::max(floor.nvlink_us, std::max(bytes.out, bytes.in) / kNvlinkBytesPerS * 1e6);
  }
  return floor;
}

LayerNvlinkBytes layer_nvlink_bytes(const LayerShape& shape, WeightFormat format, int ranks,
                                    const std::vector<int32_t>& ids, int rank) {
  MEGAMOE_CHECK(rank >= 0 && rank < ranks, "layer_nvlink_bytes: rank = ", rank, " must be in [0, ", ranks, ")");
  return rank_nvlink_bytes(shape, format, ranks, count_routes(shape, ranks, ids), rank);
}

void validate_layer_ranks(const LayerBenchOptions& o) {
  MEGAMOE_CHECK(o.ranks >= 1 && o.ranks <= kMaxEpRanks, "--ranks ", o.ranks, " must be in [1, ", kMaxEpRanks,
                "] (one process per GPU, all in one NVLink domain)");
  MEGAMOE_CHECK(o.shape.experts >= 1 && o.shape.experts % o.ranks == 0, "--ranks ", o.ranks, ": experts = ",
                o.shape.experts, " (preset ", o.shape.name, ") must be a multiple of the ranks (each rank holds experts / ranks)");
  MEGAMOE_CHECK(o.routing != RoutingPattern::kOneRank || o.shape.experts / o.ranks >= o.shape.top_k,
                "--routing one-rank on --ranks ", o.ranks, ": experts / ranks = ", o.shape.experts / o.ranks,
                " must be >= top_k = ", o.shape.top_k, " (every token routes only to rank 0's experts)");
}

double layer_floor_us(const LayerShape& shape, WeightFormat format, int64_t rows, int touched_experts) {
  return std::max(compute_floor_us(shape, format, rows), weights_floor_us(shape, format, touched_experts));
}

const std::vector<LayerShape>& layer_presets() {
  static const std::vector<LayerShape> presets = {
      {"tiny", 256, 128, 8, 2},          {"dsv3", 7168, 2048, 256, 8},      {"ml3", 7168, 4096, 128, 4},
      {"ms4", 4096, 2048, 128, 4},       {"dsv4-flash", 4096, 2048, 256, 6}, {"qwen3-30b", 2048, 768, 128, 8},
  };
  return presets;
}

LayerShape find_layer_preset(std::string_view name) {
  std::string known;
  for (const LayerShape& s : layer_presets()) {
    if (s.name == lowered(name)) return s;
    known += (known.empty() ? "" : ", ") + s.name;
  }
  MEGAMOE_FAIL("--preset '", name, "' is unknown; presets: ", known, " (or give --hidden --intermediate --experts --top-k)");
}

RoutingPattern parse_routing_pattern(std::string_view name) {
  const std::string n = lowered(name);
  if (n == "uniform") return RoutingPattern::kUniform;
  if (n == "zipf" || n == "skewed") return RoutingPattern::kZipf;
  if (n == "one-rank" || n == "onerank") return RoutingPattern::kOneRank;
  MEGAMOE_FAIL("--routing '", name, "' is unknown; expected uniform, zipf or one-rank");
}

std::string_view routing_pattern_name(RoutingPattern pattern) {
  switch (pattern) {
    case RoutingPattern::kUniform: return "uniform";
    case RoutingPattern::kZipf: return "zipf";
    case RoutingPattern::kOneRank: return "one-rank";
  }
  return "?";
}

std::vector<LayerCaseResult> run_layer_bench(const LayerBenchOptions& o) {
  validate_layer_ranks(o);
  // --ranks N > 1: this process is one rank started by launch_ranks (cmd_bench_layer relaunches
  // itself); GPU backends share one EpGroup, every rank runs the same tokens, rank 0 reports.
#ifdef MEGAMOE_WITH_CUDA
  std::unique_ptr<EpGroup> group;
  if (o.ranks > 1) {
    LaunchedRank lr;
    MEGAMOE_CHECK(launched_rank_from_env(&lr) && lr.ranks == o.ranks, "--ranks ", o.ranks,
                  ": run_layer_bench must run in a process started by launch_ranks with ", o.ranks, " ranks");
    group = EpGroup::bootstrap(lr.rank, lr.ranks, lr.rendezvous);
  }
  EpGroup* const ep = group.get();
  const bool speak = !group || group->rank() == 0;
#else
  MEGAMOE_CHECK(o.ranks == 1, "--ranks ", o.ranks, ": multi-rank runs need a CUDA build");
  EpGroup* const ep = nullptr;
  const bool speak = true;
#endif
  MEGAMOE_CHECK(!o.backends.empty(), "--backend: give at least one backend (known: reference, staged, mega)");
  MEGAMOE_CHECK(!o.tokens.empty(), "--tokens: give at least one token count");
  for (int t : o.tokens) MEGAMOE_CHECK(t >= 0, "--tokens ", t, " must be >= 0");
  MEGAMOE_CHECK(o.iters >= 1, "--iters ", o.iters, " must be >= 1");
  MEGAMOE_CHECK(o.warmup >= 0, "--warmup ", o.warmup, " must be >= 0");
  MEGAMOE_CHECK(o.check_tokens >= 1, "--check-tokens ", o.check_tokens, " must be >= 1");
  MEGAMOE_CHECK(o.distinct_experts >= 1, "--distinct-experts ", o.distinct_experts, " must be >= 1");
  layer_config(o, o.shape.experts, 1).validate();  // shape/format errors before any work
  backend_runs(o);                                 // --mega-path errors too

  const int max_tokens = *std::max_element(o.tokens.begin(), o.tokens.end());
  Rng rng(o.seed);
  const int pool_size = std::min(o.distinct_experts, o.shape.experts);
  // Each pool expert comes from its own seeded stream and they are built in parallel: a dsv3 expert is
  // 44M normals + quantization (~1-2 s on one core; nvfp4 the slowest), and every rank builds the same pool.
  std::vector<ExpertWeights> pool(pool_size);
  {
    std::vector<std::exception_ptr> errors(pool_size);
    std::vector<std::thread> workers;
    for (int e = 0; e < pool_size; ++e)
      workers.emplace_back([&, e] {
        try {
          Rng expert_rng(o.seed ^ (0xD1B54A32D192ED03ull * static_cast<uint64_t>(e + 1)));
          pool[e] = make_expert(o.shape, o.format, expert_rng);
        } catch (...) {
          errors[e] = std::current_exception();
        }
      });
    for (auto& worker : workers) worker.join();
    for (const auto& error : errors)
      if (error) std::rethrow_exception(error);
  }
  std::vector<uint16_t> hidden(static_cast<size_t>(max_tokens) * o.shape.hidden);
  for (uint16_t& v : hidden) v = formats::f32_to_bf16(rng.normal());

  const std::vector<BackendRun> runs = backend_runs(o);
  std::vector<PreparedBackend> prepared;
  for (const BackendRun& run : runs) prepared.push_back(prepare(run, o, pool, max_tokens, ep));
  PreparedBackend checker;
  if (o.check) checker = prepare(BackendRun{"reference"}, o, pool, o.check_tokens);

  std::vector<LayerCaseResult> results;
  Rng routing_rng = routing_stream(o.seed);
  for (int tokens : o.tokens) {
    const Routing routing = make_routing(o, tokens, routing_rng);
    const double flop = 2.0 * static_cast<double>(routing.rows) * o.shape.hidden * o.shape.intermediate * 3.0;
    const LayerFloor floor = layer_floor(o.shape, o.format, o.ranks, routing.ids);
    const double floor_us = floor.us();
    const LayerNvlinkBytes nvlink_bytes = layer_nvlink_bytes(o.shape, o.format, o.ranks, routing.ids, /*rank=*/0);
    std::vector<uint16_t> expected;
    const int checked_tokens = std::min(tokens, o.check_tokens);
    if (o.check && checked_tokens > 0) {
      Routing head = routing;
      head.ids.resize(static_cast<size_t>(checked_tokens) * o.shape.top_k);
      head.weights.resize(head.ids.size());
      LayerBenchOptions once = o;
      once.iters = 1;
      once.warmup = 0;
      time_forward(checker, once, hidden, head, checked_tokens, expected);
    }
    double first_us = 0;
    for (size_t b = 0; b < prepared.size(); ++b) {
      if (speak && !prepared[b].on_gpu && flop > 5e10)
        std::printf("note: %s on the CPU at %d tokens: %.0f GFLOP per forward, expect minutes\n", runs[b].name.c_str(),
                    tokens, flop * 1e-9);
      std::vector<uint16_t> out;
      std::vector<std::vector<MoeBackend::PhaseTime>> phase_runs;
      std::vector<GpuClockSample> clocks;
      const std::vector<double> us = time_forward(prepared[b], o, hidden, routing, tokens, out,
                                                  prepared[b].on_gpu ? &phase_runs : nullptr, &clocks);
      LayerCaseResult r;
      r.backend = std::string(prepared[b].backend->name());
      r.path = prepared[b].backend->last_forward_path();
      if (!r.path.empty())  // e.g. mega[split], mega[auto:fused]
        r.backend.append("[")
            .append(runs[b].mega && runs[b].mega_path == MegaPathMode::kAuto ? "auto:" : "")
            .append(r.path)
            .append("]");
      r.tokens = tokens;
      r.rows = routing.rows;
      r.median_us = median(us);
      r.min_us = *std::min_element(us.begin(), us.end());
      r.iter_us = us;
      r.iter_clocks = clocks;
      {
        std::vector<double> sorted = us;
        std::sort(sorted.begin(), sorted.end());
        r.p90_us = sorted[std::min(sorted.size() - 1, (sorted.size() * 9) / 10)];
      }
      r.tflops = r.median_us > 0 ? flop / (r.median_us * 1e-6) * 1e-12 : 0;
      if (b == 0) first_us = r.median_us;
      r.ratio_to_first = first_us > 0 ? r.median_us / first_us : 0;
      r.floor_us = floor_us;
      r.floor = floor;
      r.ratio_to_floor = floor_us > 0 ? r.median_us / floor_us : 0;
      r.phases = median_phases(phase_runs);
      r.nvlink_bytes_out = nvlink_bytes.out;
      r.nvlink_bytes_in = nvlink_bytes.in;
      // NVLink GB/s (NOTES in layer_bench.h): over the dispatch + combine phases when the backend
      // reports them, else over the whole forward (`mega` overlaps its transfers with the GEMMs).
      const double split_comm_us = phase_us(r.phases, "dispatch") + phase_us(r.phases, "combine");
      const double comm_us = split_comm_us > 0 ? split_comm_us : r.median_us;
      r.nvlink_gbps = comm_us > 0 ? (nvlink_bytes.out + nvlink_bytes.in) / (comm_us * 1e-6) * 1e-9 : 0;
      if (o.check && checked_tokens > 0) {
        double diff2 = 0, ref2 = 0, max_abs = 0;
        bool finite = true;
        for (size_t i = 0; i < expected.size(); ++i) {
          const double got = bf16_value(out[i]), want = bf16_value(expected[i]);
          finite = finite && std::isfinite(got);
          diff2 += (got - want) * (got - want);
          ref2 += want * want;
          max_abs = std::max(max_abs, std::abs(got - want));
        }
        r.checked = true;
        r.check_rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
        r.check_max_abs = max_abs;
        // The GPU backends round where the reference does (src/backends/reference.cpp NOTES); what
        // remains is accumulation order, far below this bound.
        r.check_passed = finite && r.check_rel_l2 <= 1e-2;
      }
      if (speak)
        std::printf("%-12s tokens %6d  rows %7lld  median %12.1f us  %8.3f TFLOP/s  %6.2fx  %5.2fx floor (%s)  "
                    "NVLink %.1f GB/s  split %s%s\n",
                    r.backend.c_str(), tokens, static_cast<long long>(r.rows), r.median_us, r.tflops, r.ratio_to_first,
                    r.ratio_to_floor, floor.bound(), r.nvlink_gbps, phase_split_text(r.phases).c_str(),
                    r.checked ? (r.check_passed ? "  check ok" : "  CHECK FAILED") : "");
      std::fflush(stdout);
      results.push_back(r);
    }
  }
  return results;
}

void print_layer_table(const LayerBenchOptions& o, const std::vector<LayerCaseResult>& results) {
  std::printf("\nbench layer: %s (H %d, I %d, E %d, top-%d), %s, %s%s, routing %s, ranks %d, %d iters\n",
              o.shape.name.c_str(), o.shape.hidden, o.shape.intermediate, o.shape.experts, o.shape.top_k,
              std::string(weight_format_name(o.format)).c_str(), std::string(activation_name(o.activation.kind)).c_str(),
              o.apply_topk_in_fc1 ? " (top-k in fc1)" : "", std::string(routing_pattern_name(o.routing)).c_str(), o.ranks,
              o.iters);
  // "split µs" pads to 67 bytes: µ takes two bytes and one column.
  std::printf("| %-14s | %7s | %8s | %12s | %12s | %9s | %8s | %10s | %8s | %-8s | %11s | %-67s | %-22s |\n",
              "backend", "tokens", "rows", "median us", "min us", "TFLOP/s", "vs first", "floor us", "vs floor",
              "floor by", "NVLink GB/s", "split µs", "check (rel-L2)");
  std::printf("|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n", std::string(16, '-').c_str(), std::string(9, '-').c_str(),
              std::string(10, '-').c_str(), std::string(14, '-').c_str(), std::string(14, '-').c_str(),
              std::string(11, '-').c_str(), std::string(10, '-').c_str(), std::string(12, '-').c_str(),
              std::string(10, '-').c_str(), std::string(10, '-').c_str(), std::string(13, '-').c_str(),
              std::string(68, '-').c_str(), std::string(24, '-').c_str());
  for (const LayerCaseResult& r : results) {
    char check[64] = "-";
    if (r.checked) std::snprintf(check, sizeof(check), "%s (%.2e)", r.check_passed ? "ok" : "FAILED", r.check_rel_l2);
    std::printf("| %-14s | %7d | %8lld | %12.1f | %12.1f | %9.4f | %7.2fx | %10.1f | %7.2fx | %-8s | %11.1f | %-66s | %-22s |\n",
                r.backend.c_str(), r.tokens, static_cast<long long>(r.rows), r.median_us, r.min_us, r.tflops,
                r.ratio_to_first, r.floor_us, r.ratio_to_floor, r.floor.bound(), r.nvlink_gbps,
                phase_split_text(r.phases).c_str(), check);
  }
  for (const LayerCaseResult& r : results)
    if (phase_us(r.phases, "stage") > 0) {
      std::printf("split (mega): phase = until the LATEST CTA passes its end (they add up to the kernel); stg = stage "
                  "own tokens, ofs = wait for every rank's ready + offsets, pull, g1 / g2 = last GEMM-1 / GEMM-2 tile, "
                  "cw = wait for combine rows, red = top-k reduce; per-CTA means in the JSON (phases_cta_mean_us)\n");
      break;
    }
}

namespace {

// What a layer bench JSON says about its run, beside the cases.
nlohmann::json layer_run_json(const LayerBenchOptions& o) {
  nlohmann::json j;
  j["bench"] = "layer";
  j["shape"] = {{"preset", o.shape.name},
                {"hidden", o.shape.hidden},
                {"intermediate", o.shape.intermediate},
                {"experts", o.shape.experts},
                {"top_k", o.shape.top_k}};
  j["format"] = weight_format_name(o.format);
  j["activation"] = activation_name(o.activation.kind);
  j["apply_topk_in_fc1"] = o.apply_topk_in_fc1;
  j["routing"] = routing_pattern_name(o.routing);
  j["ranks"] = o.ranks;
  j["iters"] = o.iters;
  j["warmup"] = o.warmup;
  j["seed"] = o.seed;
  j["distinct_experts"] = std::min(o.distinct_experts, o.shape.experts);
  return j;
}

}  // namespace

nlohmann::json layer_results_json(const LayerBenchOptions& o, const std::vector<LayerCaseResult>& results) {
  nlohmann::json j = layer_run_json(o);
  j["cases"] = nlohmann::json::array();
  for (const LayerCaseResult& r : results) {
    nlohmann::json c = {{"backend", r.backend},     {"path", r.path},       {"tokens", r.tokens},   {"rows", r.rows},
                        {"median_us", r.median_us}, {"min_us", r.min_us},   {"p90_us", r.p90_us},
                        {"iter_us", r.iter_us},     {"tflops", r.tflops},
                        {"ratio_to_first", r.ratio_to_first}, {"floor_us", r.floor_us},
                        {"ratio_to_floor", r.ratio_to_floor}, {"floor_compute_us", r.floor.compute_us},
                        {"floor_weights_us", r.floor.weights_us}, {"floor_nvlink_us", r.floor.nvlink_us},
                        {"floor_bound", r.floor.bound()},
                        {"nvlink_bytes_out", r.nvlink_bytes_out}, {"nvlink_bytes_in", r.nvlink_bytes_in},
                        {"nvlink_gbps", r.nvlink_gbps}};
    // Rank 0's SM clock, power and clock-limit reasons after each timed forward (NVML; empty without it).
    nlohmann::json sm_mhz = nlohmann::json::array(), power_w = nlohmann::json::array(),
                   reasons = nlohmann::json::array();
    for (const GpuClockSample& g : r.iter_clocks) {
      sm_mhz.push_back(g.sm_mhz);
      power_w.push_back(g.power_w);
      reasons.push_back(g.limit_reasons);
    }
    c["iter_sm_mhz"] = sm_mhz;
    c["iter_power_w"] = power_w;
    c["iter_clock_limit_reasons"] = reasons;
    // Per-phase medians (µs) for backends that report phases (`staged`); {} otherwise.
    c["phases_us"] = nlohmann::json::object();
    for (const MoeBackend::PhaseTime& p : r.phases) c["phases_us"][p.phase] = p.us;
    // `mega` only: the mean over CTAs of the time each spent in the phase (src/moe/mega_phase_times.h).
    for (const MoeBackend::PhaseTime& p : r.phases)
      if (p.cta_mean_us >= 0) c["phases_cta_mean_us"][p.phase] = p.cta_mean_us;
    if (r.checked)
      c["check"] = {{"passed", r.check_passed}, {"rel_l2", r.check_rel_l2}, {"max_abs", r.check_max_abs}};
    j["cases"].push_back(c);
  }
  return j;
}

std::vector<LayerFloorRow> layer_floors(const LayerBenchOptions& o) {
  validate_layer_ranks(o);
  MEGAMOE_CHECK(!o.tokens.empty(), "--tokens: give at least one token count");
  for (int t : o.tokens) MEGAMOE_CHECK(t >= 0, "--tokens ", t, " must be >= 0");
  layer_config(o, o.shape.experts, 1).validate();
  std::vector<LayerFloorRow> rows;
  Rng routing_rng = routing_stream(o.seed);  // the same routing as a timed run with these options
  for (int tokens : o.tokens) {
    const Routing routing = make_routing(o, tokens, routing_rng);
    rows.push_back(LayerFloorRow{tokens, routing.rows, layer_floor(o.shape, o.format, o.ranks, routing.ids)});
  }
  return rows;
}

void print_layer_floors(const LayerBenchOptions& o, const std::vector<LayerFloorRow>& rows) {
  std::printf("bench layer floors: %s (H %d, I %d, E %d, top-%d), %s, routing %s, ranks %d (no backend run)\n",
              o.shape.name.c_str(), o.shape.hidden, o.shape.intermediate, o.shape.experts, o.shape.top_k,
              std::string(weight_format_name(o.format)).c_str(), std::string(routing_pattern_name(o.routing)).c_str(),
              o.ranks);
  std::printf("| %7s | %8s | %10s | %10s | %10s | %10s | %-8s |\n", "tokens", "rows", "floor us", "compute", "weights",
              "nvlink", "floor by");
  std::printf("|---------|----------|------------|------------|------------|------------|----------|\n");
  for (const LayerFloorRow& r : rows)
    std::printf("| %7d | %8lld | %10.1f | %10.1f | %10.1f | %10.1f | %-8s |\n", r.tokens, static_cast<long long>(r.rows),
                r.floor.us(), r.floor.compute_us, r.floor.weights_us, r.floor.nvlink_us, r.floor.bound());
}

nlohmann::json layer_floors_json(const LayerBenchOptions& o, const std::vector<LayerFloorRow>& rows) {
  nlohmann::json j = layer_run_json(o);
  j["floors"] = nlohmann::json::array();
  for (const LayerFloorRow& r : rows)
    j["floors"].push_back({{"tokens", r.tokens},
                           {"rows", r.rows},
                           {"floor_us", r.floor.us()},
                           {"floor_compute_us", r.floor.compute_us},
                           {"floor_weights_us", r.floor.weights_us},
                           {"floor_nvlink_us", r.floor.nvlink_us},
                           {"floor_bound", r.floor.bound()}});
  return j;
}

}  // namespace megamoe::bench
