// CPU model of the rel-L2 that GEMM-2 input code flips give in MegaMulti.*ChangingTokenCountsEveryCall
// (issue 5: W4A8 call 0 rank 1, T = 35, rel-L2 0.0114 on 2 H200s; docs/mega.md "W4A8 rel-L2 of small
// calls"). Not built by CMake (analysis only); from the repository root:
//   g++ -O2 -std=c++20 -I include -I src -I tests -I /usr/local/cuda/include scripts/w4a8_flip_model.cpp
//       src/formats/*.cpp src/common/error.cpp src/common/types.cpp -o /tmp/w4a8_flip_model -lgtest -lpthread
//   /tmp/w4a8_flip_model [trials]
// The model: reference_layer's numerics (ep_harness.h) with every fp64 GEMM-1 sum h (gate and up)
// perturbed by sigma * sum|terms| * N(0, 1) before the fp32 rounding, a stand-in for the GPU's FP8
// tensor-core accumulation (~14 significant bits; sigma = 2^-16 moves h by ~2^-12 of |h|). Everything
// after h (SiLU, E4M3 requant per 128 with its amax scale, GEMM 2, BF16 rounding, the fp32 slot chain)
// is the reference's, so the printed rel-L2 is what act-code flips alone give.
#include "common/ep_harness.h"

using namespace megamoe;
using namespace megamoe::testing;

namespace {

struct ForcedFlip {  // move one act code by one E4M3 step (dir -1 / +1); t < 0: none
  int t = -1, slot = -1, i = -1, dir = 0;
};

std::vector<float> perturbed_layer(const MoeConfig& c, const std::vector<HostExpert>& experts, const RankInputs& in,
                                   double sigma, std::mt19937_64& rng, ForcedFlip flip = {}) {
  const int H = c.hidden, I = c.intermediate, k = c.top_k;
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<float> out(static_cast<size_t>(in.tokens) * H), x(H), act(I);
  std::vector<uint8_t> q(std::max(H, I));
  std::vector<float> sc(std::max(H, I) / 128 + 1);
  for (int t = 0; t < in.tokens; ++t) {
    for (int col = 0; col < H; ++col) x[col] = bf16_value(in.hidden[static_cast<size_t>(t) * H + col]);
    quantize_row_fp8(x.data(), H, q.data(), sc.data());
    for (int col = 0; col < H; ++col) x[col] = e4m3_value(q[col]) * sc[col / 128];
    std::vector<float> acc(H, 0.0f);
    for (int j = 0; j < k; ++j) {
      const int id = in.ids[static_cast<size_t>(t) * k + j];
      if (id < 0) continue;
      const HostExpert& ex = experts[id];
      for (int i = 0; i < I; ++i) {
        double g = 0, u = 0, g_abs = 0, u_abs = 0;
        for (int col = 0; col < H; ++col) {
          const double wg = ex.w13[static_cast<size_t>(i) * H + col], wu = ex.w13[static_cast<size_t>(I + i) * H + col];
          g += wg * x[col];
          u += wu * x[col];
          g_abs += std::fabs(wg * x[col]);
          u_abs += std::fabs(wu * x[col]);
        }
        if (sigma > 0) {
          g += sigma * g_abs * normal(rng);
          u += sigma * u_abs * normal(rng);
        }
        const float gf = static_cast<float>(g), uf = static_cast<float>(u);
        act[i] = gf / (1.0f + std::exp(-gf)) * uf;  // SiLU x up (the sequence's activation)
      }
      quantize_row_fp8(act.data(), I, q.data(), sc.data());
      for (int i = 0; i < I; ++i) act[i] = e4m3_value(q[i]) * sc[i / 128];
      if (flip.t == t && flip.slot == j) {
        const double scaled = act[flip.i] / sc[flip.i / 128];
        act[flip.i] = static_cast<float>((scaled + flip.dir * e4m3_step(scaled)) * sc[flip.i / 128]);
      }
      const float w = in.weights[static_cast<size_t>(t) * k + j];
      for (int col = 0; col < H; ++col) {
        double s = 0;
        for (int i = 0; i < I; ++i) s += ex.w2[static_cast<size_t>(col) * I + i] * act[i];
        acc[col] = std::fmaf(w, round_bf16(static_cast<float>(s)), acc[col]);
      }
    }
    for (int col = 0; col < H; ++col) out[static_cast<size_t>(t) * H + col] = round_bf16(acc[col]);
  }
  return out;
}

std::vector<uint16_t> to_bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = bf16_bits(v[i]);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  const int trials = argc > 1 ? std::atoi(argv[1]) : 40;
  const MoeConfig nv{256, 256, 8, 4, WeightFormat::kNvfp4, Activation{}, false, 0, 128};
  const auto nv_experts = make_experts(nv, 9);
  const RankInputs failing = token_sequence_inputs(nv, 0, 1, 2);  // call 0, rank 1 of 2: T = 35
  std::vector<double> tolerance;
  const auto ref = reference_layer(nv, nv_experts, failing, &tolerance);
  std::mt19937_64 none(0);
  std::printf("nvfp4 call 0 rank 1 T=%d; model without noise == reference_layer: rel-L2 %.3g; %s\n", failing.tokens,
              compare_outputs(to_bits(perturbed_layer(nv, nv_experts, failing, 0.0, none)), ref, 256, tolerance).rel_l2,
              token_error_report(to_bits(ref), ref, 256, 0).c_str());
  // The discrete event of this call: token 0, slot 0, act 226 lies at scaled -271.991, 0.009 (3.3e-5
  // relative) from the E4M3 midpoint -272 between codes -256 and -288.
  const auto flipped = to_bits(perturbed_layer(nv, nv_experts, failing, 0.0, none, ForcedFlip{0, 0, 226, -1}));
  const Comparison one = compare_outputs(flipped, ref, 256, tolerance);
  std::printf("that one code flipped (-256 -> -288), nothing else: rel-L2 %.4f, elementwise failures %lld; %s\n", one.rel_l2,
              static_cast<long long>(one.elementwise_failures), token_error_report(flipped, ref, 256, 1).c_str());
  for (int e : {-18, -17, -16, -15}) {
    std::vector<double> r;
    for (int trial = 0; trial < trials; ++trial) {
      std::mt19937_64 rng(7000 + trial);
      r.push_back(compare_outputs(to_bits(perturbed_layer(nv, nv_experts, failing, std::ldexp(1.0, e), rng)), ref, 256,
                                  tolerance).rel_l2);
    }
    std::sort(r.begin(), r.end());
    std::printf("  sigma 2^%d: rel-L2 min %.4f median %.4f p90 %.4f max %.4f over %d trials\n", e, r.front(),
                r[r.size() / 2], r[r.size() * 9 / 10], r.back(), trials);
  }
  // The whole sequence (24 calls x 2 ranks), per format: the aggregate and the worst single call.
  for (WeightFormat f : {WeightFormat::kNvfp4, WeightFormat::kMxfp4, WeightFormat::kFp8Block}) {
    const MoeConfig c{256, 256, 8, 4, f, Activation{}, false, 0, 128};
    const auto experts = make_experts(c, 9);
    for (int e : {-17, -16}) {
      std::mt19937_64 rng(9000);
      RelL2Sum sum;
      double worst = 0;
      int worst_call = 0, worst_rank = 0, over = 0, calls = 0;
      for (int call = 0; call < 24; ++call)
        for (int rank = 0; rank < 2; ++rank) {
          const RankInputs in = token_sequence_inputs(c, call, rank, 2);
          if (in.tokens == 0) continue;
          const auto want = reference_layer(c, experts, in);
          const auto got = to_bits(perturbed_layer(c, experts, in, std::ldexp(1.0, e), rng));
          RelL2Sum one_call;
          one_call.add(got, want);
          sum.add(got, want);
          ++calls;
          over += one_call.value() >= 0.01;
          if (one_call.value() > worst) {
            worst = one_call.value();
            worst_call = call;
            worst_rank = rank;
          }
        }
      std::printf("%s sigma 2^%d: all calls together %.4f; worst call %.4f (call %d rank %d); calls >= 0.01: %d of %d\n",
                  std::string(weight_format_name(f)).c_str(), e, sum.value(), worst, worst_call, worst_rank, over, calls);
      std::fflush(stdout);
    }
  }
}
