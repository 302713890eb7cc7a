// The GPU runner's attention kernels against an fp64 reference on the same bf16 inputs:
//   paged_attention: packed variable-length queries over a paged KV cache (shuffled block tables,
//     GQA groups 1..8, head_dim 64/128, queries starting mid-sequence as in chunked prefill and
//     single decode tokens);
//   cuDNN SDPA (CudnnVarlenAttention): packed causal prefill of several sequences, GQA.
// Outputs are poisoned (NaN) before the kernels run. Bounds: inputs are exact (bf16), the kernels
// accumulate in fp32 and round the output once to bf16 (2^-9 relative): rel-L2 < 4e-3 and every
// element within 2^-7 |ref| + 2^-9 max|ref|.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_skip.h"
#include "engine/cudnn_attention.h"
#include "engine/gpu_ops.h"
#include "megamoe/error.h"
#include "megamoe/error_cuda.h"
#include "megamoe/formats.h"

namespace megamoe::engine {
namespace {

template <typename T>
struct DeviceVec {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceVec(const std::vector<T>& host) : n(host.size()) {
    MEGAMOE_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    MEGAMOE_CUDA_CHECK(cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  explicit DeviceVec(size_t count) : n(count) {
    MEGAMOE_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    MEGAMOE_CUDA_CHECK(cudaMemset(p, 0xFF, n * sizeof(T)));  // poison: bf16 0xFFFF is NaN
  }
  ~DeviceVec() { cudaFree(p); }
  std::vector<T> download() const {
    std::vector<T> host(n);
    MEGAMOE_CUDA_CHECK(cudaMemcpy(host.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
};

std::vector<uint16_t> random_bf16(std::mt19937_64& rng, size_t count, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<uint16_t> out(count);
  for (auto& v : out) v = formats::f32_to_bf16(normal(rng));
  return out;
}
float f(uint16_t bits) { return formats::bf16_to_f32(bits); }

// One query row (heads of one token) against keys [0, context) of K/V rows given by `row_of`.
template <typename RowOf>
void reference_token(const std::vector<uint16_t>& q, int64_t t, const std::vector<uint16_t>& k,
                     const std::vector<uint16_t>& v, RowOf row_of, int context, int heads, int kv_heads, int D,
                     std::vector<double>& out) {
  const int group = heads / kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> s(context);
  for (int h = 0; h < heads; ++h) {
    const int kvh = h / group;
    double max_s = -1e300;
    for (int j = 0; j < context; ++j) {
      const int64_t kr = row_of(j) * kv_heads + kvh;
      double dot = 0;
      for (int d = 0; d < D; ++d) dot += double(f(q[(t * heads + h) * D + d])) * f(k[kr * D + d]);
      s[j] = dot * scale;
      max_s = std::max(max_s, s[j]);
    }
    double sum = 0;
    for (int j = 0; j < context; ++j) sum += (s[j] = std::exp(s[j] - max_s));
    for (int d = 0; d < D; ++d) {
      double acc = 0;
      for (int j = 0; j < context; ++j) acc += s[j] * f(v[(row_of(j) * kv_heads + kvh) * D + d]);
      out[(t * heads + h) * D + d] = acc / sum;
    }
  }
}

void expect_matches(const std::vector<uint16_t>& got_bits, const std::vector<double>& want, const char* what,
                    uint64_t seed) {
  double diff = 0, ref = 0, ref_max = 0;
  for (double w : want) ref_max = std::max(ref_max, std::abs(w));
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = f(got_bits[i]);
    ASSERT_TRUE(std::isfinite(g)) << what << ": element " << i << " not written (poison) or not finite; seed " << seed;
    diff += (g - want[i]) * (g - want[i]);
    ref += want[i] * want[i];
    if (std::abs(g - want[i]) > 0x1p-7 * std::abs(want[i]) + 0x1p-9 * ref_max && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " = " << g << ", reference " << want[i] << "; seed " << seed;
  }
  const double rel = std::sqrt(diff / ref);
  std::printf("[%s] rel_l2 %.3g over %zu elements\n", what, rel, want.size());
  EXPECT_LT(rel, 4e-3) << what << "; seed " << seed;
  EXPECT_EQ(bad, 0) << what << "; seed " << seed;
}

struct PagedCase {
  int heads, kv_heads, head_dim, block_size;
  std::vector<int> start_positions, new_tokens;  // per sequence: cached prefix and this step's tokens
};

class PagedAttention : public ::testing::TestWithParam<PagedCase> {};

TEST_P(PagedAttention, MatchesFp64Reference) {
  MEGAMOE_REQUIRE_GPUS(1);
  const PagedCase& c = GetParam();
  const uint64_t seed = 1000 + c.heads * 7 + c.head_dim + c.block_size;
  std::mt19937_64 rng(seed);
  const int S = static_cast<int>(c.start_positions.size());
  const int D = c.head_dim, bs = c.block_size;
  int max_blocks = 0, total_blocks = 0;
  for (int s = 0; s < S; ++s)
    max_blocks = std::max(max_blocks, (c.start_positions[s] + c.new_tokens[s] + bs - 1) / bs);
  total_blocks = S * max_blocks + 3;
  // Every sequence gets distinct blocks in a shuffled order.
  std::vector<int32_t> pool(total_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<int32_t> tables(S * max_blocks);
  for (int i = 0; i < S * max_blocks; ++i) tables[i] = pool[i];
  const int64_t cache_rows = int64_t{total_blocks} * bs;
  const std::vector<uint16_t> k = random_bf16(rng, cache_rows * c.kv_heads * D, 1.0f);
  const std::vector<uint16_t> v = random_bf16(rng, cache_rows * c.kv_heads * D, 1.0f);
  std::vector<int32_t> seq_of_token, positions;
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < c.new_tokens[s]; ++i) {
      seq_of_token.push_back(s);
      positions.push_back(c.start_positions[s] + i);
    }
  const int64_t T = static_cast<int64_t>(positions.size());
  const std::vector<uint16_t> q = random_bf16(rng, T * c.heads * D, 1.0f);
  std::vector<double> want(T * c.heads * D);
  for (int64_t t = 0; t < T; ++t) {
    const int s = seq_of_token[t];
    auto row_of = [&](int j) { return int64_t{tables[s * max_blocks + j / bs]} * bs + j % bs; };
    reference_token(q, t, k, v, row_of, positions[t] + 1, c.heads, c.kv_heads, D, want);
  }
  DeviceVec<uint16_t> dq(q), dk(k), dv(v);
  DeviceVec<int32_t> dtables(tables), dseq(seq_of_token), dpos(positions);
  // Split-KV: never (1), chosen (0) with the runner's workspace size, and forced counts: 3, and 64
  // (more splits than a short context has key tiles, so some splits are empty).
  const int num_sms = gpu::multiprocessor_count();
  for (const int splits : {1, 0, 3, gpu::kPagedAttentionMaxSplits}) {
    const size_t workspace_bytes = splits == 0 ? gpu::paged_attention_decode_workspace_bytes(c.heads, c.kv_heads, D)
                                               : gpu::paged_attention_workspace_bytes(T, c.heads, D, splits);
    DeviceVec<uint8_t> workspace(workspace_bytes);
    DeviceVec<uint16_t> out(T * c.heads * D);
    gpu::PagedAttentionArgs a;
    a.q = dq.p;
    a.k_cache = dk.p;
    a.v_cache = dv.p;
    a.block_tables = dtables.p;
    a.seq_of_token = dseq.p;
    a.positions = dpos.p;
    a.tokens = T;
    a.num_seqs = S;
    a.max_blocks_per_seq = max_blocks;
    a.heads = c.heads;
    a.kv_heads = c.kv_heads;
    a.head_dim = D;
    a.block_size = bs;
    a.out = out.p;
    a.split_workspace = workspace.p;
    a.split_workspace_bytes = workspace_bytes;
    a.num_splits = splits;
    gpu::paged_attention(a, nullptr);
    MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::string what = "paged, num_splits " + std::to_string(splits) +
        (splits == 0 ? " (chosen: " + std::to_string(gpu::choose_paged_attention_splits(T, c.kv_heads, max_blocks * bs, num_sms)) + ")" : "");
    expect_matches(out.download(), want, what.c_str(), seed);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PagedAttention,
    ::testing::Values(PagedCase{32, 4, 128, 16, {0, 0, 0}, {70, 1, 33}},        // prefills, GQA 8
                      PagedCase{8, 8, 64, 16, {100, 37, 0}, {1, 1, 1}},         // decode tokens, MHA
                      PagedCase{16, 2, 128, 4, {45, 0, 130}, {20, 50, 3}},      // chunked prefill, GQA 8
                      PagedCase{8, 2, 16, 4, {5, 0}, {17, 9}},                  // the tiny fixture's shape
                      PagedCase{32, 4, 128, 16, {4095}, {1}},                   // Qwen3-30B decode, 4096 context
                      PagedCase{32, 4, 128, 16, {1000, 2999, 16, 0}, {1, 1, 1, 1}}));  // decode batch, mixed

TEST(PagedAttention, RejectsBadShapes) {
  gpu::PagedAttentionArgs a;
  a.heads = 12;
  a.kv_heads = 5;
  a.head_dim = 128;
  a.block_size = 16;
  a.tokens = 1;
  EXPECT_THROW(gpu::paged_attention(a, nullptr), Error);  // 12 % 5 != 0
  a.kv_heads = 4;
  a.head_dim = 512;
  EXPECT_THROW(gpu::paged_attention(a, nullptr), Error);  // head_dim > 256
  a.head_dim = 128;
  a.num_splits = gpu::kPagedAttentionMaxSplits + 1;
  EXPECT_THROW(gpu::paged_attention(a, nullptr), Error);  // num_splits > 64
}

TEST(PagedAttention, SplitChoiceFillsTheGpuOnlyWhenIdle) {  // no GPU needed
  EXPECT_EQ(gpu::choose_paged_attention_splits(1, 4, 40960, 132), 64);    // decode of one sequence
  EXPECT_EQ(gpu::choose_paged_attention_splits(1, 4, 512, 132), 4);       // short context: >= 128 keys each
  EXPECT_EQ(gpu::choose_paged_attention_splits(8, 4, 40960, 132), 9);     // 32 pairs -> ~2 waves
  EXPECT_EQ(gpu::choose_paged_attention_splits(33, 4, 40960, 132), 1);    // 132 pairs fill the GPU
  EXPECT_EQ(gpu::choose_paged_attention_splits(4096, 4, 4096, 132), 1);   // prefill chunk
}

struct CudnnCase {
  int heads, kv_heads, head_dim;
  std::vector<int32_t> seq_lens;
};
class CudnnAttention : public ::testing::TestWithParam<CudnnCase> {};

TEST_P(CudnnAttention, PackedCausalPrefillMatchesFp64Reference) {
  MEGAMOE_REQUIRE_GPUS(1);
  std::string why;
  if (!gpu::cudnn_attention_available(&why)) GTEST_SKIP() << "cuDNN attention unavailable: " << why;
  const CudnnCase& c = GetParam();
  const uint64_t seed = 77 + c.seq_lens.size();
  std::mt19937_64 rng(seed);
  const int D = c.head_dim;
  const int64_t T = std::accumulate(c.seq_lens.begin(), c.seq_lens.end(), int64_t{0});
  const std::vector<uint16_t> q = random_bf16(rng, T * c.heads * D, 1.0f);
  const std::vector<uint16_t> k = random_bf16(rng, T * c.kv_heads * D, 1.0f);
  const std::vector<uint16_t> v = random_bf16(rng, T * c.kv_heads * D, 1.0f);
  std::vector<double> want(T * c.heads * D);
  int64_t first = 0;
  for (int32_t len : c.seq_lens) {
    for (int i = 0; i < len; ++i) {
      reference_token(q, first + i, k, v, [&](int j) { return first + j; }, i + 1, c.heads, c.kv_heads, D, want);
    }
    first += len;
  }
  DeviceVec<uint16_t> dq(q), dk(k), dv(v), out(T * c.heads * D);
  gpu::CudnnVarlenAttention attention(c.heads, c.kv_heads, D);
  attention.run(dq.p, dk.p, dv.p, out.p, c.seq_lens, nullptr);
  MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
  expect_matches(out.download(), want, "cudnn", seed);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnAttention,
                         ::testing::Values(CudnnCase{32, 4, 128, {300, 1, 77, 129}}, CudnnCase{8, 8, 64, {64}},
                                           CudnnCase{8, 2, 16, {21, 5, 26, 1}}));

}  // namespace
}  // namespace megamoe::engine
