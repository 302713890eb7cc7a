// CPU model of what the sm90 FP8 tensor cores do to MegaMulti.*ChangingTokenCountsEveryCall (issue 5:
// W4A8 call 0 rank 1, T = 35, rel-L2 0.0114 on 2 H200s; docs/mega.md "W4A8 rel-L2 of small calls").
// Not built by CMake (analysis only); from the repository root:
//   g++ -O2 -std=c++20 -I include -I src -I tests -I /usr/local/cuda/include scripts/fp8_accumulation_model.cpp
//       src/formats/*.cpp src/common/error.cpp src/common/types.cpp -o /tmp/fp8_accumulation_model -lgtest -lpthread
//   /tmp/fp8_accumulation_model [bits]      (default 13; 0 = exact sums)
// The GEMMs are computed in the kernels' structure (w4a8_tile_mainloop / fp8_tile_mainloop): per 128-K
// block a partial over 4 wgmma k-steps of 32 products, then accumulator = fmaf(partial, a_scale x
// factor, accumulator) in fp32; weights are the decoded E4M3 values w8 and block factors of
// common/w4a8_reference.h (fp8_block: codes and block scales). One k-step is modelled as the tensor
// core's fixed-point add: the 32 exact products and the incoming partial aligned to the largest
// exponent among them, each truncated toward zero to `bits` fraction bits below it, summed, rounded to
// fp32. Everything else (SiLU in fp32, E4M3 requant per 128 with the amax scale, BF16 y, the fp32 slot
// chain, BF16 out) is reference_layer's. rel-L2 and the elementwise bound are then taken against
// reference_layer (fp64 GEMMs) exactly as the GPU tests do.
#include "common/ep_harness.h"

using namespace megamoe;
using namespace megamoe::testing;

namespace {

int g_bits = 13;

float tensor_core_step(float partial, const double* products, int n) {
  if (g_bits <= 0) {
    double sum = partial;
    for (int i = 0; i < n; ++i) sum += products[i];
    return static_cast<float>(sum);
  }
  int top = std::numeric_limits<int>::min();
  if (partial != 0) top = std::ilogb(partial);
  for (int i = 0; i < n; ++i)
    if (products[i] != 0) top = std::max(top, std::ilogb(products[i]));
  if (top == std::numeric_limits<int>::min()) return 0.0f;
  const double quantum = std::ldexp(1.0, top - g_bits);
  double sum = std::trunc(partial / quantum) * quantum;
  for (int i = 0; i < n; ++i) sum += std::trunc(products[i] / quantum) * quantum;
  return static_cast<float>(sum);
}

struct DecodedWeights {  // w8 [rows, cols] and factor [rows/128, cols/128] (fp8_block: codes, block scales)
  std::vector<double> w8, factor;
  int cols = 0;
};

DecodedWeights decode(const formats::QuantizedMatrix& m) {
  DecodedWeights d;
  d.cols = static_cast<int>(m.cols);
  if (m.format == WeightFormat::kFp8Block) {
    d.w8.resize(m.data.size());
    for (size_t i = 0; i < m.data.size(); ++i) d.w8[i] = e4m3_value(m.data[i]);
    d.factor.assign(m.block_scales.begin(), m.block_scales.end());
  } else {
    W4a8Decoded w = decode_w4a8_reference(m);
    d.w8 = std::move(w.w8);
    d.factor = std::move(w.factor);
  }
  return d;
}

// One output element: row `codes` (E4M3 values, K) with per-128 scales times weight row n.
float gemm_element(const std::vector<double>& codes, const float* scales, const DecodedWeights& w, int n) {
  const int K = w.cols;
  float accumulator = 0.0f;
  double products[32];
  for (int kb = 0; kb < K / 128; ++kb) {
    float partial = 0.0f;
    for (int step = 0; step < 4; ++step) {
      for (int i = 0; i < 32; ++i) {
        const int k = kb * 128 + step * 32 + i;
        products[i] = codes[k] * w.w8[static_cast<size_t>(n) * K + k];
      }
      partial = tensor_core_step(partial, products, 32);
    }
    const float scale = scales[kb] * static_cast<float>(w.factor[(n / 128) * (K / 128) + kb]);
    accumulator = std::fmaf(partial, scale, accumulator);
  }
  return accumulator;
}

std::vector<uint16_t> emulated_layer(const MoeConfig& c, const std::vector<DecodedWeights>& w13,
                                     const std::vector<DecodedWeights>& w2, const RankInputs& in) {
  const int H = c.hidden, I = c.intermediate, k = c.top_k;
  std::vector<uint16_t> out(static_cast<size_t>(in.tokens) * H);
  std::vector<float> x(H), act(I), x_scales(H / 128), act_scales(I / 128);
  std::vector<uint8_t> q(std::max(H, I));
  std::vector<double> x_codes(H), act_codes(I);
  for (int t = 0; t < in.tokens; ++t) {
    for (int col = 0; col < H; ++col) x[col] = bf16_value(in.hidden[static_cast<size_t>(t) * H + col]);
    quantize_row_fp8(x.data(), H, q.data(), x_scales.data());
    for (int col = 0; col < H; ++col) x_codes[col] = e4m3_value(q[col]);
    std::vector<float> acc(H, 0.0f);
    for (int j = 0; j < k; ++j) {
      const int id = in.ids[static_cast<size_t>(t) * k + j];
      if (id < 0) continue;
      for (int i = 0; i < I; ++i) {
        const float g = gemm_element(x_codes, x_scales.data(), w13[id], i);
        const float u = gemm_element(x_codes, x_scales.data(), w13[id], I + i);
        act[i] = g / (1.0f + std::exp(-g)) * u;  // SiLU x up, the sequence's activation
      }
      quantize_row_fp8(act.data(), I, q.data(), act_scales.data());
      for (int i = 0; i < I; ++i) act_codes[i] = e4m3_value(q[i]);
      const float w = in.weights[static_cast<size_t>(t) * k + j];
      for (int col = 0; col < H; ++col)
        acc[col] = std::fmaf(w, round_bf16(gemm_element(act_codes, act_scales.data(), w2[id], col)), acc[col]);
    }
    for (int col = 0; col < H; ++col) out[static_cast<size_t>(t) * H + col] = bf16_bits(acc[col]);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_bits = std::atoi(argv[1]);
  std::printf("tensor-core step model: %d fraction bits (0 = exact)\n", g_bits);
  for (WeightFormat f : {WeightFormat::kNvfp4, WeightFormat::kMxfp4, WeightFormat::kFp8Block}) {
    const std::string name(weight_format_name(f));
    // MegaMulti.*MatchesReferenceOnEveryRouting, kUniform / kSkewed (session 8: W4A8 0.001-0.004).
    for (Routing routing : {Routing::kUniform, Routing::kSkewed}) {
      const MoeConfig c{256, 256, 8, 3, f, Activation{}, false, 0, 96};
      const int seed = 41 + static_cast<int>(routing);
      const auto experts = make_experts(c, seed);
      std::vector<DecodedWeights> w13, w2;
      for (const auto& e : experts) {
        w13.push_back(decode(e.weights.w13));
        w2.push_back(decode(e.weights.w2));
      }
      for (int rank = 0; rank < 2; ++rank) {
        const RankInputs in = make_rank_inputs(seed, rank, rank == 0 ? 61 : 83, 256, 8, 3, 2, routing);
        std::vector<double> tolerance;
        const auto ref = reference_layer(c, experts, in, &tolerance);
        std::printf("%s every routing %s rank %d T=%d rel_l2=%.4f\n", name.c_str(), routing_name(routing), rank, in.tokens,
                    compare_outputs(emulated_layer(c, w13, w2, in), ref, 256, tolerance).rel_l2);
      }
    }
    // MegaMulti.*ChangingTokenCountsEveryCall: every call of both ranks.
    const MoeConfig c{256, 256, 8, 4, f, Activation{}, false, 0, 128};
    const auto experts = make_experts(c, 9);
    std::vector<DecodedWeights> w13, w2;
    for (const auto& e : experts) {
      w13.push_back(decode(e.weights.w13));
      w2.push_back(decode(e.weights.w2));
    }
    RelL2Sum all_calls;
    int over = 0, calls = 0;
    for (int call = 0; call < 24; ++call)
      for (int rank = 0; rank < 2; ++rank) {
        const RankInputs in = token_sequence_inputs(c, call, rank, 2);
        if (in.tokens == 0) continue;
        std::vector<double> tolerance;
        const auto ref = reference_layer(c, experts, in, &tolerance);
        const auto got = emulated_layer(c, w13, w2, in);
        const Comparison cmp = compare_outputs(got, ref, 256, tolerance);
        all_calls.add(got, ref);
        ++calls;
        over += cmp.rel_l2 >= rel_l2_budget(f);
        if (call == 0 || cmp.rel_l2 >= 0.008)
          std::printf("%s sequence call %d rank %d T=%d rel_l2=%.7g elementwise failures %lld; %s\n", name.c_str(), call, rank,
                      in.tokens, cmp.rel_l2, static_cast<long long>(cmp.elementwise_failures),
                      token_error_report(got, ref, 256, 2).c_str());
        std::fflush(stdout);
      }
    std::printf("%s sequence: %d of %d calls >= the budget; all calls together %.4f\n", name.c_str(), over, calls,
                all_calls.value());
  }
}
