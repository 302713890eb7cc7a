// `megamoe bench attention`: prefill attention (causal, GQA, packed variable-length sequences) on the
// GPU: cuDNN SDPA (the runner's whole-prefill path) and our paged kernel (decode / chunked prefill),
// same random inputs, TFLOP/s counting the causal half only (4 * D * heads per (query, key) pair).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "megamoe/error.h"
#include "tools/megamoe/command.h"

#ifdef MEGAMOE_WITH_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "engine/cudnn_attention.h"
#include "engine/gpu_ops.h"
#include "megamoe/error_cuda.h"
#include "megamoe/formats.h"
#endif

namespace {

struct AttentionBenchOptions {
  std::vector<int> seq_lens{4096};
  int heads = 32, kv_heads = 4, head_dim = 128, block_size = 16;
  int iters = 20, warmup = 3;
  uint64_t seed = 1;
  bool skip_paged = false;
  bool decode = false;  // one query token per sequence at its last position (a decode step)
  std::string json_path;
};

#ifdef MEGAMOE_WITH_CUDA
struct Device {
  void* p = nullptr;
  explicit Device(size_t bytes) { MEGAMOE_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16))); }
  ~Device() { cudaFree(p); }
  template <typename T>
  T* as() const { return static_cast<T*>(p); }
};

// Median milliseconds of `iters` launches of `fn` after `warmup` ones.
template <typename Fn>
double time_ms(int warmup, int iters, Fn&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  MEGAMOE_CUDA_CHECK(cudaEventCreate(&start));
  MEGAMOE_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) {
    MEGAMOE_CUDA_CHECK(cudaEventRecord(start));
    fn();
    MEGAMOE_CUDA_CHECK(cudaEventRecord(stop));
    MEGAMOE_CUDA_CHECK(cudaEventSynchronize(stop));
    MEGAMOE_CUDA_CHECK(cudaEventElapsedTime(&ms[i], start, stop));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::vector<float> download_bf16(const uint16_t* device, size_t count) {
  std::vector<uint16_t> bits(count);
  MEGAMOE_CUDA_CHECK(cudaMemcpy(bits.data(), device, count * 2, cudaMemcpyDeviceToHost));
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = megamoe::formats::bf16_to_f32(bits[i]);
  return out;
}

// Standard normal bf16 values (never zeros: the benchmark times real data).
std::vector<uint16_t> random_bf16(std::mt19937_64& rng, size_t count) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> bits(count);
  for (auto& b : bits) b = megamoe::formats::f32_to_bf16(normal(rng));
  return bits;
}

// The paged kernel's arguments over device buffers (q, caches, block tables, token -> sequence, positions).
megamoe::engine::gpu::PagedAttentionArgs paged_args(const AttentionBenchOptions& o, const Device& q, const Device& k_cache,
                                                    const Device& v_cache, const Device& tables, const Device& seq_of_token,
                                                    const Device& positions, int64_t tokens, int num_seqs, int max_blocks) {
  megamoe::engine::gpu::PagedAttentionArgs a;
  a.q = q.as<uint16_t>();
  a.k_cache = k_cache.as<uint16_t>();
  a.v_cache = v_cache.as<uint16_t>();
  a.block_tables = tables.as<int32_t>();
  a.seq_of_token = seq_of_token.as<int32_t>();
  a.positions = positions.as<int32_t>();
  a.tokens = tokens;
  a.num_seqs = num_seqs;
  a.max_blocks_per_seq = max_blocks;
  a.heads = o.heads;
  a.kv_heads = o.kv_heads;
  a.head_dim = o.head_dim;
  a.block_size = o.block_size;
  return a;
}

// --decode: one query token per sequence at position len - 1 over a paged cache of len tokens; our
// paged kernel without split-KV and with the runner's split choice, side by side. The figure of merit
// is the K/V bytes read per second (decode attention is a stream over the cache).
int run_decode(const AttentionBenchOptions& o) {
  using namespace megamoe::engine;
  const int S = static_cast<int>(o.seq_lens.size()), D = o.head_dim, bs = o.block_size;
  const int64_t Q = int64_t{o.heads} * D, KV = int64_t{o.kv_heads} * D;
  int max_blocks = 0, total_blocks = 0;
  double kv_bytes = 0;
  for (int len : o.seq_lens) {
    MEGAMOE_CHECK(len > 0, "--seq-lens: ", len, " must be positive");
    max_blocks = std::max(max_blocks, (len + bs - 1) / bs);
    kv_bytes += 2.0 * len * KV * 2;  // K and V, bf16
  }
  std::vector<int32_t> tables(int64_t{S} * max_blocks, 0), seq_of_token(S), positions(S);
  for (int s = 0; s < S; ++s) {
    const int blocks = (o.seq_lens[s] + bs - 1) / bs;
    for (int b = 0; b < blocks; ++b) tables[int64_t{s} * max_blocks + b] = total_blocks + b;
    total_blocks += blocks;
    seq_of_token[s] = s;
    positions[s] = o.seq_lens[s] - 1;
  }
  std::mt19937_64 rng(o.seed);
  const int64_t cache_elems = int64_t{total_blocks} * bs * KV;
  const std::vector<uint16_t> q = random_bf16(rng, S * Q), k = random_bf16(rng, cache_elems),
                              v = random_bf16(rng, cache_elems);
  Device dq(q.size() * 2), kc(cache_elems * 2), vc(cache_elems * 2), out_whole(S * Q * 2), out_split(S * Q * 2);
  Device dtables(tables.size() * 4), dseq(S * 4), dpos(S * 4);
  MEGAMOE_CUDA_CHECK(cudaMemcpy(dq.p, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
  MEGAMOE_CUDA_CHECK(cudaMemcpy(kc.p, k.data(), cache_elems * 2, cudaMemcpyHostToDevice));
  MEGAMOE_CUDA_CHECK(cudaMemcpy(vc.p, v.data(), cache_elems * 2, cudaMemcpyHostToDevice));
  MEGAMOE_CUDA_CHECK(cudaMemcpy(dtables.p, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
  MEGAMOE_CUDA_CHECK(cudaMemcpy(dseq.p, seq_of_token.data(), S * 4, cudaMemcpyHostToDevice));
  MEGAMOE_CUDA_CHECK(cudaMemcpy(dpos.p, positions.data(), S * 4, cudaMemcpyHostToDevice));
  MEGAMOE_CUDA_CHECK(cudaMemset(out_whole.p, 0xFF, S * Q * 2));  // NaN poison
  MEGAMOE_CUDA_CHECK(cudaMemset(out_split.p, 0xFF, S * Q * 2));
  const int num_sms = gpu::multiprocessor_count();
  const size_t workspace_bytes = gpu::paged_attention_decode_workspace_bytes(o.heads, o.kv_heads, D);
  Device workspace(workspace_bytes);
  gpu::PagedAttentionArgs a = paged_args(o, dq, kc, vc, dtables, dseq, dpos, S, S, max_blocks);
  a.split_workspace = workspace.p;
  a.split_workspace_bytes = workspace_bytes;
  nlohmann::json results = nlohmann::json::array();
  std::printf("%-12s %6s %8s %6s %10s %10s\n", "kernel", "seqs", "max ctx", "splits", "us", "KV GB/s");
  double whole_us = 0;
  for (const bool split : {false, true}) {
    a.num_splits = split ? 0 : 1;
    a.out = (split ? out_split : out_whole).as<uint16_t>();
    const int splits = split ? gpu::choose_paged_attention_splits(S, o.kv_heads, max_blocks * bs, num_sms) : 1;
    const double us = 1e3 * time_ms(o.warmup, o.iters, [&] { gpu::paged_attention(a, nullptr); });
    if (!split) whole_us = us;
    const char* kernel = split ? "paged-split" : "paged";
    std::printf("%-12s %6d %8d %6d %10.1f %10.1f%s\n", kernel, S, max_blocks * bs, splits, us, kv_bytes / us * 1e-3,
                split ? (" (" + std::to_string(whole_us / us).substr(0, 5) + "x)").c_str() : "");
    results.push_back({{"kernel", kernel}, {"decode", true}, {"seq_lens", o.seq_lens}, {"heads", o.heads},
                       {"kv_heads", o.kv_heads}, {"head_dim", D}, {"splits", splits}, {"us", us},
                       {"kv_gbps", kv_bytes / us * 1e-3}});
  }
  const std::vector<float> x = download_bf16(out_whole.as<uint16_t>(), S * Q);
  const std::vector<float> y = download_bf16(out_split.as<uint16_t>(), S * Q);
  double diff = 0, ref = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    ref += double(x[i]) * x[i];
  }
  const double rel = std::sqrt(diff / ref);
  std::printf("split vs whole: rel-L2 %.2e (bf16 outputs)\n", rel);
  results.push_back({{"check", "split_vs_whole"}, {"rel_l2", rel}});
  MEGAMOE_CHECK(std::isfinite(rel) && rel < 1e-2, "split and whole paged attention disagree: rel-L2 ", rel);
  if (!o.json_path.empty())
    std::ofstream(o.json_path) << nlohmann::json{{"bench", "attention-decode"}, {"results", results}}.dump(2) << "\n";
  return 0;
}

int run(const AttentionBenchOptions& o) {
  using namespace megamoe::engine;
  MEGAMOE_CHECK(!o.seq_lens.empty() && o.iters > 0, "--seq-lens and --iters must be non-empty / positive");
  if (o.decode) return run_decode(o);
  int64_t T = 0;
  double pairs = 0;  // (query, key) pairs under the causal mask
  for (int len : o.seq_lens) {
    MEGAMOE_CHECK(len > 0, "--seq-lens: ", len, " must be positive");
    T += len;
    pairs += 0.5 * static_cast<double>(len) * (len + 1);
  }
  const double flops = 4.0 * o.head_dim * o.heads * pairs;
  const int64_t Q = int64_t{o.heads} * o.head_dim, KV = int64_t{o.kv_heads} * o.head_dim;
  std::mt19937_64 rng(o.seed);
  const std::vector<uint16_t> q = random_bf16(rng, T * Q), k = random_bf16(rng, T * KV),
                              v = random_bf16(rng, T * KV);
  Device dq(q.size() * 2), dk(k.size() * 2), dv(v.size() * 2), dout_cudnn(T * Q * 2), dout_paged(T * Q * 2);
  MEGAMOE_CUDA_CHECK(cudaMemcpy(dq.p, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
  MEGAMOE_CUDA_CHECK(cudaMemcpy(dk.p, k.data(), k.size() * 2, cudaMemcpyHostToDevice));
  MEGAMOE_CUDA_CHECK(cudaMemcpy(dv.p, v.data(), v.size() * 2, cudaMemcpyHostToDevice));
  MEGAMOE_CUDA_CHECK(cudaMemset(dout_cudnn.p, 0xFF, T * Q * 2));  // NaN poison
  MEGAMOE_CUDA_CHECK(cudaMemset(dout_paged.p, 0xFF, T * Q * 2));

  nlohmann::json results = nlohmann::json::array();
  std::printf("%-8s %8s %6s %6s %4s %10s %10s\n", "kernel", "tokens", "seqs", "heads", "D", "ms", "TFLOP/s");
  auto report = [&](const char* kernel, double ms) {
    const double tflops = flops / (ms * 1e-3) / 1e12;
    std::printf("%-8s %8lld %6zu %3d/%-2d %4d %10.3f %10.1f\n", kernel, static_cast<long long>(T), o.seq_lens.size(),
                o.heads, o.kv_heads, o.head_dim, ms, tflops);
    results.push_back({{"kernel", kernel}, {"tokens", T}, {"seq_lens", o.seq_lens}, {"heads", o.heads},
                       {"kv_heads", o.kv_heads}, {"head_dim", o.head_dim}, {"causal", true}, {"ms", ms},
                       {"tflops", tflops}});
  };

  std::string why;
  const bool have_cudnn = gpu::cudnn_attention_available(&why);
  if (have_cudnn) {
    std::printf("cuDNN %lld from %s\n", static_cast<long long>(gpu::cudnn_loaded_version()),
                gpu::cudnn_loaded_path().c_str());
    gpu::CudnnVarlenAttention attention(o.heads, o.kv_heads, o.head_dim);
    const double ms = time_ms(o.warmup, o.iters, [&] {
      attention.run(dq.as<uint16_t>(), dk.as<uint16_t>(), dv.as<uint16_t>(), dout_cudnn.as<uint16_t>(), o.seq_lens,
                    nullptr);
    });
    report("cudnn", ms);
  } else {
    std::printf("cudnn    skipped: %s\n", why.c_str());
  }
  if (!o.skip_paged) {
    // The step's K/V in a paged cache: sequence s owns consecutive blocks; positions restart per sequence.
    const int bs = o.block_size;
    std::vector<int32_t> seq_of_token, positions;
    int max_blocks = 0, total_blocks = 0;
    for (size_t s = 0; s < o.seq_lens.size(); ++s) max_blocks = std::max(max_blocks, (o.seq_lens[s] + bs - 1) / bs);
    std::vector<int32_t> tables(o.seq_lens.size() * max_blocks, 0);
    std::vector<int64_t> slots;
    for (size_t s = 0; s < o.seq_lens.size(); ++s) {
      const int blocks = (o.seq_lens[s] + bs - 1) / bs;
      for (int b = 0; b < blocks; ++b) tables[s * max_blocks + b] = total_blocks + b;
      for (int p = 0; p < o.seq_lens[s]; ++p) {
        seq_of_token.push_back(static_cast<int32_t>(s));
        positions.push_back(p);
        slots.push_back(static_cast<int64_t>(total_blocks) * bs + p);
      }
      total_blocks += blocks;
    }
    Device kc(int64_t{total_blocks} * bs * KV * 2), vc(int64_t{total_blocks} * bs * KV * 2);
    std::vector<uint16_t> k_cache(int64_t{total_blocks} * bs * KV, 0), v_cache(k_cache.size(), 0);
    for (int64_t t = 0; t < T; ++t) {
      std::copy_n(k.begin() + t * KV, KV, k_cache.begin() + slots[t] * KV);
      std::copy_n(v.begin() + t * KV, KV, v_cache.begin() + slots[t] * KV);
    }
    MEGAMOE_CUDA_CHECK(cudaMemcpy(kc.p, k_cache.data(), k_cache.size() * 2, cudaMemcpyHostToDevice));
    MEGAMOE_CUDA_CHECK(cudaMemcpy(vc.p, v_cache.data(), v_cache.size() * 2, cudaMemcpyHostToDevice));
    Device dtables(tables.size() * 4), dseq(T * 4), dpos(T * 4);
    MEGAMOE_CUDA_CHECK(cudaMemcpy(dtables.p, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
    MEGAMOE_CUDA_CHECK(cudaMemcpy(dseq.p, seq_of_token.data(), T * 4, cudaMemcpyHostToDevice));
    MEGAMOE_CUDA_CHECK(cudaMemcpy(dpos.p, positions.data(), T * 4, cudaMemcpyHostToDevice));
    gpu::PagedAttentionArgs a =
        paged_args(o, dq, kc, vc, dtables, dseq, dpos, T, static_cast<int>(o.seq_lens.size()), max_blocks);
    a.out = dout_paged.as<uint16_t>();
    const double ms = time_ms(1, std::max(1, o.iters / 4), [&] { gpu::paged_attention(a, nullptr); });
    report("paged", ms);
    if (have_cudnn) {
      const std::vector<float> x = download_bf16(dout_cudnn.as<uint16_t>(), T * Q);
      const std::vector<float> y = download_bf16(dout_paged.as<uint16_t>(), T * Q);
      double diff = 0, ref = 0, max_abs = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        diff += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
        ref += double(y[i]) * y[i];
        max_abs = std::max(max_abs, std::abs(double(x[i]) - y[i]));
      }
      const double rel = std::sqrt(diff / ref);
      std::printf("cudnn vs paged: rel-L2 %.2e, max |diff| %.3e (both bf16 outputs)\n", rel, max_abs);
      results.push_back({{"check", "cudnn_vs_paged"}, {"rel_l2", rel}, {"max_abs", max_abs}});
      MEGAMOE_CHECK(std::isfinite(rel) && rel < 1e-2, "cuDNN and paged attention disagree: rel-L2 ", rel);
    }
  }
  if (!o.json_path.empty()) {
    std::ofstream(o.json_path) << nlohmann::json{{"bench", "attention"},
                                                 {"cudnn_version", gpu::cudnn_loaded_version()},
                                                 {"results", results}}
                                      .dump(2)
                               << "\n";
  }
  return 0;
}
#else
int run(const AttentionBenchOptions&) { MEGAMOE_FAIL("bench attention needs a CUDA build"); }
#endif

}  // namespace

MEGAMOE_SUBCOMMAND("bench", "attention", "prefill attention (causal, GQA, varlen): cuDNN SDPA and our paged kernel",
                   [](CLI::App& app) -> std::function<int()> {
                     auto o = std::make_shared<AttentionBenchOptions>();
                     app.add_option("--seq-lens", o->seq_lens, "packed sequence lengths")->capture_default_str();
                     app.add_option("--heads", o->heads, "query heads")->capture_default_str();
                     app.add_option("--kv-heads", o->kv_heads, "KV heads")->capture_default_str();
                     app.add_option("--head-dim", o->head_dim, "head dim")->capture_default_str();
                     app.add_option("--block-size", o->block_size, "KV block size (paged)")->capture_default_str();
                     app.add_option("--iters", o->iters, "timed launches (median)")->capture_default_str();
                     app.add_option("--seed", o->seed, "input seed")->capture_default_str();
                     app.add_flag("--skip-paged", o->skip_paged, "time cuDNN only");
                     app.add_flag("--decode", o->decode,
                                  "decode step: one query per sequence at its last position (paged kernel, split-KV vs not)");
                     app.add_option("--json", o->json_path, "write results as JSON here");
                     return [o] { return run(*o); };
                   });
