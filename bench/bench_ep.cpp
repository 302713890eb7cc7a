// `megamoe bench ep`: EP dispatch/combine bandwidth and the staged layer, one process per GPU.
//   megamoe bench ep --ranks 2 --tokens 4096 --hidden 7168            (dispatch + combine GB/s)
//   megamoe bench ep --ranks 2 --staged --preset qwen3-30b --tokens 512  (staged forward time)
//   megamoe bench ep --ranks 2 --loopback --tokens 4096 --hidden 7168  (in-process ranks of GPU 0)
// Rank 0 prints the table (and --json). Timing: median over --iters of per-phase CUDA events on
// rank 0, each iteration after a device barrier.
// --loopback: the ranks are threads of this process on one GPU (EpGroup::loopback), each on its own SM
// partition (src/common/sm_partition.h); every "remote" store lands in the same HBM, so the GB/s say nothing
// about NVLink: the ranks share one GPU's SMs and HBM (what a one-GPU machine can measure of dispatch / combine
// changes on the HBM side; docs/ep.md "Benchmarks").
#include <cstdio>
#include <string>
#include <vector>

#include "tools/megamoe/command.h"

#ifdef MEGAMOE_WITH_CUDA
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "megamoe/ep.h"
#include "megamoe/ep_dispatch.h"
#include "megamoe/error_cuda.h"
#include "src/common/sm_partition.h"
#include "src/moe/staged_backend.h"

namespace megamoe::tool {
namespace {

struct BenchEpOptions {
  int ranks = 2, tokens = 4096, hidden = 7168, top_k = 8, experts = 256, intermediate = 2048, iters = 20;
  bool staged = false, loopback = false;
  std::string preset, format = "fp8", json;
  uint64_t seed = 1234;
};

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0f : v[v.size() / 2];
}

void apply_preset(BenchEpOptions& o) {
  struct P { const char* name; int h, i, e, k; };
  static const P presets[] = {{"dsv3", 7168, 2048, 256, 8}, {"ml3", 7168, 4096, 128, 4}, {"ms4", 4096, 2048, 128, 4},
                              {"dsv4-flash", 4096, 2048, 256, 6}, {"qwen3-30b", 2048, 768, 128, 8}};
  if (o.preset.empty()) return;
  for (const auto& p : presets)
    if (o.preset == p.name) {
      o.hidden = p.h; o.intermediate = p.i; o.experts = p.e; o.top_k = p.k;
      return;
    }
  MEGAMOE_FAIL("--preset '", o.preset, "' is not one of dsv3, ml3, ms4, dsv4-flash, qwen3-30b");
}

struct Inputs {
  void *hidden = nullptr, *ids = nullptr, *weights = nullptr, *out = nullptr;
  Inputs(const BenchEpOptions& o, int rank) {
    std::mt19937 rng(static_cast<uint32_t>(o.seed + rank));
    std::normal_distribution<float> normal;
    std::vector<uint16_t> h(static_cast<size_t>(o.tokens) * o.hidden);
    for (auto& v : h) {
      const float f = normal(rng);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      v = static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
    }
    std::vector<int32_t> topk(static_cast<size_t>(o.tokens) * o.top_k);
    std::vector<float> w(topk.size());
    for (int t = 0; t < o.tokens; ++t) {
      std::vector<int> perm(o.experts);
      for (int e = 0; e < o.experts; ++e) perm[e] = e;
      for (int j = 0; j < o.top_k; ++j) {
        std::swap(perm[j], perm[j + rng() % (o.experts - j)]);
        topk[static_cast<size_t>(t) * o.top_k + j] = perm[j];
        w[static_cast<size_t>(t) * o.top_k + j] = 0.1f + 0.9f * (rng() % 1000) / 1000.0f;
      }
    }
    MEGAMOE_CUDA_CHECK(cudaMalloc(&hidden, h.size() * 2));
    MEGAMOE_CUDA_CHECK(cudaMalloc(&out, h.size() * 2));
    MEGAMOE_CUDA_CHECK(cudaMalloc(&ids, topk.size() * 4));
    MEGAMOE_CUDA_CHECK(cudaMalloc(&weights, w.size() * 4));
    MEGAMOE_CUDA_CHECK(cudaMemcpy(hidden, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    MEGAMOE_CUDA_CHECK(cudaMemcpy(ids, topk.data(), topk.size() * 4, cudaMemcpyHostToDevice));
    MEGAMOE_CUDA_CHECK(cudaMemcpy(weights, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
    MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~Inputs() { cudaFree(hidden); cudaFree(out); cudaFree(ids); cudaFree(weights); }
};

void time_dispatch_combine(const BenchEpOptions& o, EpGroup& group, const TensorView& hidden, const TensorView& ids,
                           const TensorView& weights, const TensorView& out, cudaStream_t stream, cudaEvent_t* ev,
                           nlohmann::json& result) {
    EpDispatcher io(group, EpDispatchConfig{o.hidden, o.top_k, o.experts, o.tokens, EpPayload::kFp8});
    void* y = nullptr;
    const size_t y_bytes = static_cast<size_t>(io.received().max_rows) * o.hidden * 2;
    MEGAMOE_CUDA_CHECK(cudaMalloc(&y, y_bytes));
    MEGAMOE_CUDA_CHECK(cudaMemset(y, 0x3C, y_bytes));  // bf16 0x3C3C ~ 0.0115, not zero
    MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
    io.enable_kernel_timing(true);
    std::vector<float> dispatch_us, combine_us;
    std::array<std::vector<float>, 5> kernel_us;
    for (int it = 0; it < o.iters + 3; ++it) {
      group.barrier(stream);
      MEGAMOE_CUDA_CHECK(cudaEventRecord(ev[0], stream));
      io.dispatch(hidden, ids, weights, stream);
      MEGAMOE_CUDA_CHECK(cudaEventRecord(ev[1], stream));
      io.combine(y, out, stream);
      MEGAMOE_CUDA_CHECK(cudaEventRecord(ev[2], stream));
      group.synchronize(stream);
      float a = 0, b = 0;
      MEGAMOE_CUDA_CHECK(cudaEventElapsedTime(&a, ev[0], ev[1]));
      MEGAMOE_CUDA_CHECK(cudaEventElapsedTime(&b, ev[1], ev[2]));
      if (it >= 3) {
        dispatch_us.push_back(a * 1000);
        combine_us.push_back(b * 1000);
        const auto split = io.last_kernel_times_us();
        for (size_t i = 0; i < split.size(); ++i) kernel_us[i].push_back(split[i]);
      }
    }
    // Bytes a per-(token, slot) combine would move off this rank's tokens' remote experts (what the
    // combine sent before it reduced per rank): this rank's (token, slot) pairs owned by another rank.
    std::vector<int32_t> topk(static_cast<size_t>(o.tokens) * o.top_k);
    MEGAMOE_CUDA_CHECK(cudaMemcpy(topk.data(), ids.data, topk.size() * 4, cudaMemcpyDeviceToHost));
    uint64_t remote_slots = 0;
    for (const int32_t id : topk) remote_slots += id >= 0 && id / (o.experts / group.size()) != group.rank();
    static const char* kKernelNames[5] = {"layout", "send", "receive", "combine_send", "combine_reduce"};
    for (size_t i = 0; i < kernel_us.size(); ++i) result["kernel_us"][kKernelNames[i]] = median(kernel_us[i]);
    const auto traffic = io.last_remote_traffic(stream);
    const float d = median(dispatch_us), c = median(combine_us);
    result["dispatch_us"] = d;
    result["combine_us"] = c;
    result["dispatch_remote_bytes"] = traffic.dispatch_bytes;
    result["combine_remote_bytes"] = traffic.combine_bytes;
    result["dispatch_GBps"] = traffic.dispatch_bytes / (d * 1e3);
    result["combine_GBps"] = traffic.combine_bytes / (c * 1e3);
    result["combine_per_slot_equiv_GBps"] = remote_slots * o.hidden * 2.0 / (c * 1e3);
    result["ep_overlap"] = io.overlap();  // MEGAMOE_EP_OVERLAP: fused dispatch / combine kernels
    cudaFree(y);
    io.destroy();
}

// One rank's measurements on its group and stream (both launch modes); rank 0 prints and writes --json.
void run_on_group(const BenchEpOptions& o, EpGroup& group, cudaStream_t stream, const std::string& mode) {
  const int rank = group.rank(), ranks = group.size();
  group.warmup(stream);
  Inputs in(o, rank);
  const auto hidden = TensorView::make2d(in.hidden, DType::kBF16, o.tokens, o.hidden, Device::kCuda);
  const auto ids = TensorView::make2d(in.ids, DType::kI32, o.tokens, o.top_k, Device::kCuda);
  const auto weights = TensorView::make2d(in.weights, DType::kF32, o.tokens, o.top_k, Device::kCuda);
  const auto out = TensorView::make2d(in.out, DType::kBF16, o.tokens, o.hidden, Device::kCuda);
  cudaEvent_t ev[3];
  for (auto& e : ev) MEGAMOE_CUDA_CHECK(cudaEventCreate(&e));
  nlohmann::json result = {{"ranks", ranks}, {"staged", false}, {"tokens_per_rank", o.tokens}, {"hidden", o.hidden},
                           {"top_k", o.top_k}, {"experts", o.experts}, {"mode", mode}};
  time_dispatch_combine(o, group, hidden, ids, weights, out, stream, ev, result);
  if (o.staged) {
    MoeConfig config;
    config.hidden = o.hidden;
    config.intermediate = o.intermediate;
    config.num_experts = o.experts;
    config.top_k = o.top_k;
    config.weight_format = parse_weight_format(o.format);
    config.max_tokens_per_rank = o.tokens;
    auto backend = make_staged_backend(config, &group);
    const bool fp8 = config.weight_format == WeightFormat::kFp8Block;
    std::mt19937 rng(static_cast<uint32_t>(o.seed));
    auto fill = [&](formats::QuantizedMatrix& m, int64_t rows, int64_t cols) {
      m.format = config.weight_format;
      m.rows = rows;
      m.cols = cols;
      m.data.resize(rows * cols * (fp8 ? 1 : 2));
      // fp8: random finite e4m3 codes with |v| <= 2; bf16: random values in [-1/16, 1/16).
      for (size_t i = 0; i < m.data.size(); ++i) m.data[i] = fp8 ? static_cast<uint8_t>(rng() % 0x40 | (rng() & 0x80)) : 0;
      if (!fp8)
        for (size_t i = 0; i < m.data.size(); i += 2) {
          const uint16_t b = static_cast<uint16_t>(0x3D00 + rng() % 0x100) | static_cast<uint16_t>((rng() & 1) << 15);
          std::memcpy(&m.data[i], &b, 2);
        }
      if (fp8) m.block_scales.assign(((rows + 127) / 128) * ((cols + 127) / 128), 1.0f / 256);
    };
    ExpertWeights w;
    fill(w.w13, 2 * o.intermediate, o.hidden);
    fill(w.w2, o.hidden, o.intermediate);
    for (int e = 0; e < backend->num_local_experts(); ++e) backend->load_expert(e, w);
    backend->warmup(stream);
    MoeInputs inputs{hidden, ids, weights};
    MoeOutputs outputs{out};
    std::vector<float> forward_us;
    for (int it = 0; it < o.iters + 2; ++it) {
      group.barrier(stream);
      MEGAMOE_CUDA_CHECK(cudaEventRecord(ev[0], stream));
      backend->forward(inputs, outputs, stream);
      MEGAMOE_CUDA_CHECK(cudaEventRecord(ev[1], stream));
      group.synchronize(stream);
      float a = 0;
      MEGAMOE_CUDA_CHECK(cudaEventElapsedTime(&a, ev[0], ev[1]));
      if (it >= 2) forward_us.push_back(a * 1000);
    }
    const float t = median(forward_us);
    const double flops = 2.0 * o.tokens * o.top_k * 3.0 * o.hidden * o.intermediate;
    result["staged"] = true;
    result["format"] = o.format;
    result["preset"] = o.preset;
    result["intermediate"] = o.intermediate;
    result["forward_us"] = t;
    result["TFLOPs"] = flops / (t * 1e6);
    result["expert_gemm"] = fp8 ? "sm90 wgmma grouped GEMM (fp8)" : "sm90 wgmma grouped GEMM (bf16)";
    result["gemm_and_rest_us"] = t - result["dispatch_us"].get<float>() - result["combine_us"].get<float>();
    backend->destroy();
  }
  for (auto& e : ev) cudaEventDestroy(e);
  if (rank == 0) {
    {
      if (o.loopback) std::printf("%s: in-process ranks on one GPU, the GB/s are not NVLink's\n", mode.c_str());
      std::printf("| mode | ranks | tokens/rank | H | k | E | dispatch us | dispatch GB/s | combine us | combine GB/s | "
                  "combine per-slot equiv GB/s |\n");
      std::printf("| dispatch+combine | %d | %d | %d | %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f |\n", ranks, o.tokens,
                  o.hidden, o.top_k, o.experts, result["dispatch_us"].get<float>(), result["dispatch_GBps"].get<double>(),
                  result["combine_us"].get<float>(), result["combine_GBps"].get<double>(),
                  result["combine_per_slot_equiv_GBps"].get<double>());
      const auto& ku = result["kernel_us"];
      // overlap 1: "send" is the fused send + receive kernel and "combine send" the fused combine (receive
      // and combine reduce read ~0)
      std::printf("| kernels us | layout %.1f | send %.1f | receive %.1f | combine send %.1f | combine reduce %.1f | overlap %d |\n",
                  ku["layout"].get<float>(), ku["send"].get<float>(), ku["receive"].get<float>(),
                  ku["combine_send"].get<float>(), ku["combine_reduce"].get<float>(),
                  result.value("ep_overlap", false) ? 1 : 0);
    }
    if (o.staged) {
      std::printf("| mode | ranks | tokens/rank | H | I | E | k | format | forward us | TFLOP/s | forward - dispatch - combine us | expert GEMM |\n");
      std::printf("| staged | %d | %d | %d | %d | %d | %d | %s | %.1f | %.2f | %.1f | %s |\n", ranks, o.tokens,
                  o.hidden, o.intermediate, o.experts, o.top_k, o.format.c_str(), result["forward_us"].get<float>(),
                  result["TFLOPs"].get<double>(), result["gemm_and_rest_us"].get<float>(),
                  result["expert_gemm"].get<std::string>().c_str());
    }
    if (!o.json.empty()) std::ofstream(o.json) << result.dump(2) << "\n";
  }
}

int run_rank(const BenchEpOptions& o, const LaunchedRank& lr) {
  auto group = EpGroup::bootstrap(lr.rank, lr.ranks, lr.rendezvous);
  cudaStream_t stream;
  MEGAMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  run_on_group(o, *group, stream, "nccl");
  group->destroy();
  cudaStreamDestroy(stream);
  return 0;
}

// --loopback: one host thread per rank (megamoe/ep.h, EpLoopbackFabric NOTES: each rank launches its own part,
// on its own stream and SM partition; eager module loading and a hardware queue per stream, set here before the
// first CUDA call of the process).
int run_loopback(const BenchEpOptions& o) {
  MEGAMOE_CHECK(o.ranks >= 1 && o.ranks <= kMaxEpRanks, "--ranks ", o.ranks, " with --loopback: 1..", kMaxEpRanks);
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
  detail::SmPartitionStreams partitions(0, o.ranks);
  const std::string mode = partitions.fallback().empty()
                               ? "loopback, " + std::to_string(partitions.sm_count(0)) + " SMs per rank"
                               : "loopback, the ranks share every SM (" + partitions.fallback() + ")";
  auto fabric = make_ep_loopback_fabric(o.ranks, 0);
  std::mutex failures_mutex;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int r = 0; r < o.ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        MEGAMOE_CUDA_CHECK(cudaSetDevice(0));
        auto group = EpGroup::loopback(fabric, r);
        run_on_group(o, *group, partitions.stream(r), mode);
        group->destroy();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(failures_mutex);
        failures.push_back("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& f : failures) std::fprintf(stderr, "bench ep --loopback: %s\n", f.c_str());
  const std::string overflow = check_ep_loopback_guards(*fabric);
  if (!overflow.empty()) std::fprintf(stderr, "bench ep --loopback: %s\n", overflow.c_str());
  return failures.empty() && overflow.empty() ? 0 : 1;
}

}  // namespace

MEGAMOE_SUBCOMMAND("bench", "ep", "EP dispatch/combine bandwidth and the staged layer (one process per GPU)",
                   [](CLI::App& app) -> std::function<int()> {
  auto o = std::make_shared<BenchEpOptions>();
  app.add_option("--ranks", o->ranks, "processes (GPUs)");
  app.add_option("--tokens", o->tokens, "tokens per rank (also the capacity)");
  app.add_option("--hidden", o->hidden);
  app.add_option("--intermediate", o->intermediate);
  app.add_option("--top-k", o->top_k);
  app.add_option("--experts", o->experts);
  app.add_option("--iters", o->iters);
  app.add_option("--preset", o->preset, "dsv3 | ml3 | ms4 | dsv4-flash | qwen3-30b");
  app.add_option("--format", o->format, "fp8 | bf16 (staged)");
  app.add_flag("--staged", o->staged, "time the staged layer instead of dispatch+combine alone");
  app.add_flag("--loopback", o->loopback,
               "--ranks in-process ranks on GPU 0, one SM partition each (they share its HBM; no NVLink)");
  app.add_option("--json", o->json, "write rank 0's result here");
  return [o]() -> int {
    apply_preset(*o);
    if (o->loopback) return run_loopback(*o);
    LaunchedRank lr;
    if (launched_rank_from_env(&lr)) return run_rank(*o, lr);
    return relaunch_self_on_ranks(o->ranks, 600);
  };
});

}  // namespace megamoe::tool
#endif  // MEGAMOE_WITH_CUDA
