// Router test problems shared by the GPU test (tests/gpu/test_router_cuda.cu) and the CPU emulation
// of the kernel (tests/cpu/test_router_kernel_emulated.cpp): configurations, seeded random inputs with
// planted edge cases, and the CPU reference run on them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "megamoe/routing.h"

namespace megamoe::testing {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInf = std::numeric_limits<float>::infinity();

struct Case {
  std::string name;
  RouterConfig config;
  int64_t tokens = 0;
  bool bias = false;
  bool periodic_bias = false;  // bias[e] depends on e % group_size only (lets whole groups tie)
  int64_t hash_vocab = 0;
  uint64_t seed = 0;
};

inline RouterConfig make_config(RouterKind kind, int experts, int top_k, int groups = 1, int top_k_groups = 1,
                         bool renormalize = true, float scaling = 1.0f,
                         ScoreFunction hash_score = ScoreFunction::kSqrtSoftplus) {
  RouterConfig c;
  c.kind = kind;
  c.num_experts = experts;
  c.top_k = top_k;
  c.num_groups = groups;
  c.top_k_groups = top_k_groups;
  c.renormalize = renormalize;
  c.routed_scaling_factor = scaling;
  c.hash_score = hash_score;
  return c;
}

// Host copies of every input of one call.
struct Problem {
  std::vector<float> logits, bias;
  std::vector<uint8_t> padding;
  std::vector<int32_t> token_ids, table;
};

// Random logits N(0, 2) with planted padding rows (holding garbage, even +inf, that must be ignored),
// NaN and -inf entries, rows with too few valid experts, all-NaN and all--inf rows, saturated logits,
// exact expert ties (a copy of the row maximum at an expert with the same bias) and exact group ties.
inline Problem make_problem(const Case& c) {
  const RouterConfig& cfg = c.config;
  const int E = cfg.num_experts, group_size = E / cfg.num_groups;
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  std::uniform_int_distribution<int> expert(0, E - 1), quarter(-8, 8);
  Problem p;
  if (c.bias) {
    p.bias.resize(E);
    for (int e = 0; e < E; ++e)
      p.bias[e] = c.periodic_bias && e >= group_size ? p.bias[e % group_size] : static_cast<float>(quarter(rng)) / 32.0f;
  }
  const auto same_bias = [&](int a, int b) { return p.bias.empty() || p.bias[a] == p.bias[b]; };
  p.logits.resize(c.tokens * E);
  p.padding.assign(c.tokens, 0);
  for (int64_t t = 0; t < c.tokens; ++t) {
    float* row = p.logits.data() + t * E;
    for (int e = 0; e < E; ++e) row[e] = normal(rng);
    if (coin(rng) < 0.1) {
      p.padding[t] = 1;
      row[expert(rng)] = kInf;  // a padded row is never read for routing, so this is not an error
      continue;
    }
    for (int e = 0; e < E; ++e) {
      const double u = coin(rng);
      if (u < 0.03) row[e] = kNaN;
      else if (u < 0.04) row[e] = -kInf;
    }
    const double shape = coin(rng);
    if (shape < 0.02) {
      std::fill(row, row + E, kNaN);
    } else if (shape < 0.03) {
      std::fill(row, row + E, -kInf);
    } else if (shape < 0.06) {  // fewer valid experts than top_k
      const int keep = cfg.top_k / 2;
      for (int e = keep; e < E; ++e) row[e] = kNaN;
    } else if (shape < 0.10) {  // saturated: sigmoid == 1.0f, softplus takes the l > 20 branch
      row[expert(rng)] = 25.0f;
      row[expert(rng)] = 21.5f;
    }
    if (coin(rng) < 0.4) {  // exact tie with the row maximum
      int best = -1;
      for (int e = 0; e < E; ++e)
        if (!std::isnan(row[e]) && (best < 0 || row[e] > row[best])) best = e;
      for (int tries = 0; best >= 0 && tries < 4 * E; ++tries) {
        const int other = expert(rng);
        if (other != best && same_bias(other, best)) {
          row[other] = row[best];
          break;
        }
      }
    }
    if (cfg.num_groups > 1 && (c.periodic_bias || !c.bias) && coin(rng) < 0.25) {  // exact group tie
      std::uniform_int_distribution<int> group(0, cfg.num_groups - 1);
      const int from = group(rng), to = group(rng);
      std::copy(row + from * group_size, row + (from + 1) * group_size, row + to * group_size);
    }
  }
  if (cfg.kind == RouterKind::kHash) {
    std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(c.hash_vocab - 1));
    p.token_ids.resize(c.tokens);
    for (auto& id : p.token_ids) id = token(rng);
    p.table.resize(c.hash_vocab * cfg.top_k);
    for (auto& id : p.table) id = expert(rng);
  }
  return p;
}

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

inline Routed run_reference(const Case& c, const Problem& p) {
  const size_t n = c.tokens * c.config.top_k;
  Routed r{std::vector<int32_t>(n, 0x5a5a5a5a), std::vector<float>(n, kNaN)};
  RouterInputs in;
  in.logits = p.logits.data();
  in.num_tokens = c.tokens;
  in.correction_bias = p.bias.empty() ? nullptr : p.bias.data();
  in.padding = p.padding.data();
  in.token_ids = p.token_ids.empty() ? nullptr : p.token_ids.data();
  in.hash_table = p.table.empty() ? nullptr : p.table.data();
  in.hash_vocab = c.hash_vocab;
  route_reference(c.config, in, r.ids.data(), r.weights.data());
  return r;
}

// The case list both router tests run (the GPU kernels and their CPU emulation).
inline std::vector<Case> all_router_cases() {
  using K = RouterKind;
  using S = ScoreFunction;
  std::vector<Case> cases = {
      {"softmax E8 k2 T1", make_config(K::kSoftmaxTopK, 8, 2), 1},
      {"softmax E8 k8 (k = E) no renorm", make_config(K::kSoftmaxTopK, 8, 8, 1, 1, false), 33},
      {"softmax E60 k4", make_config(K::kSoftmaxTopK, 60, 4), 257},
      {"softmax E128 k8 no renorm", make_config(K::kSoftmaxTopK, 128, 8, 1, 1, false), 1000},
      {"softmax E512 k16 bias rsf 2", make_config(K::kSoftmaxTopK, 512, 16, 1, 1, true, 2.0f), 129, true},
      {"softmax grouped E64 g8/3 k6", make_config(K::kSoftmaxTopK, 64, 6, 8, 3), 77},
      {"softmax E13 k3 T0", make_config(K::kSoftmaxTopK, 13, 3), 0},
      {"dsv3 sigmoid E256 g8/4 k8 rsf 2.5", make_config(K::kSigmoidGrouped, 256, 8, 8, 4, true, 2.5f), 513, true},
      {"sigmoid E256 g8/4 k8 periodic bias", make_config(K::kSigmoidGrouped, 256, 8, 8, 4), 300, true, true},
      {"sigmoid E72 k5 no bias no renorm", make_config(K::kSigmoidGrouped, 72, 5, 1, 1, false), 31},
      {"sigmoid E512 g16/4 k16 bias", make_config(K::kSigmoidGrouped, 512, 16, 16, 4), 65, true},
      {"sigmoid E9 g3/2 k4 bias", make_config(K::kSigmoidGrouped, 9, 4, 3, 2), 17, true},
      {"sigmoid E32 g32/8 (size 1) k8", make_config(K::kSigmoidGrouped, 32, 8, 32, 8), 40, true, true},
      {"dsv4 sqrt_softplus E256 k6 rsf 1.5", make_config(K::kSqrtSoftplus, 256, 6, 1, 1, true, 1.5f), 400, true},
      {"sqrt_softplus E384 k8 no renorm", make_config(K::kSqrtSoftplus, 384, 8, 1, 1, false), 99},
      {"sqrt_softplus E128 g4/2 k4 bias", make_config(K::kSqrtSoftplus, 128, 4, 4, 2), 50, true},
      {"sqrt_softplus E8 k1 T1", make_config(K::kSqrtSoftplus, 8, 1), 1},
      {"hash sqrt_softplus E256 k6 (bias ignored)", make_config(K::kHash, 256, 6, 1, 1, true, 1.5f), 300, true},
      {"hash softmax E64 k4 no renorm", make_config(K::kHash, 64, 4, 1, 1, false, 1.0f, S::kSoftmax), 31},
      {"hash sigmoid E512 k16", make_config(K::kHash, 512, 16, 1, 1, true, 1.0f, S::kSigmoid), 129},
      {"hash sigmoid E8 k8 T1", make_config(K::kHash, 8, 8, 1, 1, true, 1.0f, S::kSigmoid), 1},
  };
  const int64_t vocab[] = {1000, 50, 7, 3};
  int hash_index = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    cases[i].seed = 0x5eed0000 + 17 * i;
    if (cases[i].config.kind == RouterKind::kHash) cases[i].hash_vocab = vocab[hash_index++];
  }
  return cases;
}

}  // namespace megamoe::testing
