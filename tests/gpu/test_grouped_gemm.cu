// FP8-block grouped GEMMs (src/kernels/grouped_gemm.h) against an fp64 CPU reference computed on the
// same quantized operands.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <numeric>
#include <thread>
#include <random>
#include <utility>
#include <vector>

#include "common/gpu_skip.h"
#include "common/scoped_overrides.h"
#include "gpu/fp8_test_util.h"
#include "kernels/grouped_gemm.h"
#include "kernels/sm90_fp8_grouped_gemm.cuh"  // activate(): the device reference below evaluates it
#include "kernels/swiglu_quant.h"
#include "megamoe/error.h"
#include "megamoe/poison.h"

namespace megamoe {
namespace {

using testing::bf16_decode;
using testing::bf16_round;
using testing::DeviceBuffer;
using testing::ScopedEnv;
using testing::e4m3_decode;
using testing::e4m3_encode;

constexpr int kLeadingPadRows = 5, kTrailingPadRows = 7;
// Padding rows around the experts of make_problem; NoPadding makes offsets[0] = 0 and offsets[E] =
// capacity (a receive buffer filled exactly, as the staged backend's is when every token of a full
// batch lands on one rank).
struct ProblemPadding {
  int leading = kLeadingPadRows, trailing = kTrailingPadRows;
};
ProblemPadding g_padding;
struct NoPadding {
  ProblemPadding saved = g_padding;
  NoPadding() { g_padding = ProblemPadding{0, 0}; }
  ~NoPadding() { g_padding = saved; }
};

// Rows of all experts, contiguous, between poisoned padding rows that belong to no expert.
struct Problem {
  int experts = 0, n = 0, k = 0;
  std::vector<int32_t> offsets;  // [E+1]
  int64_t capacity = 0;
  std::vector<uint8_t> a;        // [capacity, k]
  std::vector<float> a_scales;   // [capacity, k/128]
  std::vector<uint8_t> w;        // canonical [E, n, k]
  std::vector<float> w_scales;   // [E, n/128, k/128]
};

Problem make_problem(const std::vector<int>& counts, int n, int k, uint64_t seed, bool small_integers = false) {
  Problem p;
  p.experts = static_cast<int>(counts.size());
  p.n = n;
  p.k = k;
  p.offsets.push_back(g_padding.leading);
  for (int c : counts) p.offsets.push_back(p.offsets.back() + c);
  p.capacity = p.offsets.back() + g_padding.trailing;
  std::mt19937_64 rng(seed);
  if (small_integers) {
    // Integers in [-4, 4] (exact in E4M3) with power-of-two scales: every product and every partial
    // sum is exact in FP32, so the result must equal bf16_rn(exact value) bit for bit.
    std::uniform_int_distribution<int> value(-4, 4), exponent(-3, 2);
    p.a.resize(p.capacity * k);
    p.w.resize(static_cast<size_t>(p.experts) * n * k);
    uint8_t code_of[9];  // e4m3_encode of -4..4, once (it is a table search per call)
    for (int v = -4; v <= 4; ++v) code_of[v + 4] = e4m3_encode(v);
    for (auto& x : p.a) x = code_of[value(rng) + 4];
    for (auto& x : p.w) x = code_of[value(rng) + 4];
    p.a_scales.resize(p.capacity * (k / 128));
    p.w_scales.resize(static_cast<size_t>(p.experts) * (n / 128) * (k / 128));
    for (auto& s : p.a_scales) s = std::ldexp(1.0f, exponent(rng));
    for (auto& s : p.w_scales) s = std::ldexp(1.0f, exponent(rng));
    return p;
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> a(p.capacity * k), w(static_cast<size_t>(p.experts) * n * k);
  for (auto& x : a) x = normal(rng);
  const float w_std = 1.0f / std::sqrt(static_cast<float>(k));
  for (auto& x : w) x = normal(rng) * w_std;
  testing::quantize_rows(a, p.capacity, k, p.a, p.a_scales);
  testing::quantize_blocks(w, p.experts, n, k, p.w, p.w_scales);
  return p;
}

int expert_of_row(const Problem& p, int64_t r) {
  for (int e = 0; e < p.experts; ++e)
    if (r >= p.offsets[e] && r < p.offsets[e + 1]) return e;
  return -1;
}

// fp64 value and sum of |terms| of out[r, c] (expert e of row r, canonical weight row c < n_cols) for
// every row of an expert, computed once with all host cores and an E4M3 decode table (a serial
// per-element loop made the full-buffer and many-tiles tests take ~100 s each).
struct ReferenceGrid {
  int n = 0;
  std::vector<double> value, magnitude;  // [capacity, n]; rows of no expert stay 0
  double at(int64_t r, int c) const { return value[r * n + c]; }
  double magnitude_at(int64_t r, int c) const { return magnitude[r * n + c]; }
};

ReferenceGrid reference_grid(const Problem& p, int n_cols) {
  ReferenceGrid grid;
  grid.n = n_cols;
  grid.value.assign(p.capacity * n_cols, 0.0);
  grid.magnitude.assign(p.capacity * n_cols, 0.0);
  double decode[256];
  for (int code = 0; code < 256; ++code) decode[code] = e4m3_decode(static_cast<uint8_t>(code));
  const int kb_count = p.k / 128;
  const auto rows_of = [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int e = expert_of_row(p, r);
      if (e < 0) continue;
      for (int c = 0; c < n_cols; ++c) {
        double sum = 0, abs_sum = 0;  // reference_dot's loop, table-decoded
        for (int kb = 0; kb < kb_count; ++kb) {
          const double scale = static_cast<double>(p.a_scales[r * kb_count + kb]) *
                               p.w_scales[(static_cast<size_t>(e) * (p.n / 128) + c / 128) * kb_count + kb];
          const uint8_t* a = &p.a[r * p.k + kb * 128];
          const uint8_t* w = &p.w[(static_cast<size_t>(e) * p.n + c) * p.k + kb * 128];
          double block = 0, abs_block = 0;
          for (int i = 0; i < 128; ++i) {
            const double product = decode[a[i]] * decode[w[i]];
            block += product;
            abs_block += std::fabs(product);
          }
          sum += block * scale;
          abs_sum += abs_block * std::fabs(scale);
        }
        grid.value[r * n_cols + c] = sum;
        grid.magnitude[r * n_cols + c] = abs_sum;
      }
    }
  };
  const int64_t threads = std::max(1u, std::thread::hardware_concurrency());
  const int64_t chunk = (p.capacity + threads - 1) / threads;
  std::vector<std::thread> workers;
  for (int64_t begin = 0; begin < p.capacity; begin += chunk)
    workers.emplace_back(rows_of, begin, std::min(p.capacity, begin + chunk));
  for (auto& worker : workers) worker.join();
  return grid;
}

std::string describe(const Problem& p, uint64_t seed) {
  std::string text = "seed " + std::to_string(seed) + " n " + std::to_string(p.n) + " k " + std::to_string(p.k) +
                     " offsets";
  for (int o : p.offsets) text += " " + std::to_string(o);
  return text;
}

using kernels::Fp8GemmSchedule;

const char* schedule_name(Fp8GemmSchedule schedule) {
  switch (schedule) {
    case Fp8GemmSchedule::kSerial: return "serial";
    case Fp8GemmSchedule::kPingPong: return "pingpong";
    case Fp8GemmSchedule::kOverlap: return "overlap";
    default: return "auto";
  }
}

// A problem's operands on the device and the plain GEMM's arguments over them (out: bf16 [capacity, n]).
struct PlainDeviceProblem {
  DeviceBuffer a, a_scales, w, w_scales, offsets, out;
  explicit PlainDeviceProblem(const Problem& p)
      : a(p.a), a_scales(p.a_scales), w(p.w), w_scales(p.w_scales), offsets(p.offsets),
        out(p.capacity * p.n * sizeof(uint16_t)) {}
  kernels::GroupedGemmFp8Args args(const Problem& p) const {
    kernels::GroupedGemmFp8Args args;
    args.a = a.as<uint8_t>();
    args.a_scales = a_scales.as<float>();
    args.weights = w.as<uint8_t>();
    args.weight_scales = w_scales.as<float>();
    args.expert_offsets = offsets.as<int32_t>();
    args.out = out.as<uint16_t>();
    args.m_capacity = p.capacity;
    args.num_experts = p.experts;
    args.n = p.n;
    args.k = p.k;
    return args;
  }
};


// The v11 A-scale switch (MEGAMOE_FP8_V11_TMA_SCALES): every v11 run below runs with it off and on
// (TMA scales when k % 512 == 0, else the launcher falls back to the cp.async scales) and must give the
// same bits either way.
constexpr const char* kV11TmaScalesEnv = "MEGAMOE_FP8_V11_TMA_SCALES";
// The v11 cluster switch (MEGAMOE_GEMM_CLUSTER; docs/grouped_gemm.md "v11 clusters"): every v11 GEMM-2 run and
// every v11 GEMM-1 run of the 128 x 256 tile below also runs with it off and on (clusters of 2 CTAs sharing each B
// tile by multicast) and must give the same bits either way.
constexpr const char* kGemmClusterEnv = "MEGAMOE_GEMM_CLUSTER";
// v11 GEMM 1's gate / up B scales by TMA with the A-scale boxes (no scale warp; 128 x 256 tiles with TMA A scales).
constexpr const char* kGemm1TmaBScalesEnv = "MEGAMOE_FP8_GEMM1_TMA_BSCALES";
// The same for the plain / GEMM-2 v11 kernel: every v11 run below with TMA A scales also runs with it ("1+b").
constexpr const char* kV11TmaBScalesEnv = "MEGAMOE_FP8_V11_TMA_BSCALES";
// The v11 scale modes of the plain / GEMM-2 tests: A scales by cp.async ("0"), by TMA ("1"), and both A and B
// scales by TMA ("1+b"). ScopedScales sets both switches for one mode.
constexpr const char* kV11ScaleModes[] = {"0", "1", "1+b"};
struct ScopedScales {
  explicit ScopedScales(const char* mode)
      : a_scales(kV11TmaScalesEnv, mode[0] == '1' ? "1" : "0"),
        b_scales(kV11TmaBScalesEnv, std::strcmp(mode, "1+b") == 0 ? "1" : "0") {}
  ScopedEnv a_scales, b_scales;
};

// schedule = kPingPong: also runs kSerial on the same inputs (freshly poisoned outputs) and requires
// bit-identical results: the schedules only reorder wgmma issue between the two math warpgroups, never
// the operations of one output element.
// v11_block_n (128 / 192): also runs the v11 kernel (sm90_fp8_wide_grouped_gemm.cuh) with that tile width on
// the same inputs (freshly poisoned outputs) and requires its outputs bit-identical to the v8-v10 kernel's,
// which are judged against the reference below (0: v11 not run; the main run always has v11 off).
void run_plain(const std::vector<int>& counts, int n, int k, uint64_t seed, int rows_hint, bool exact,
               Fp8GemmSchedule schedule = Fp8GemmSchedule::kAuto, int v11_block_n = 0) {
  const Problem p = make_problem(counts, n, k, seed, exact);
  SCOPED_TRACE(describe(p, seed) + " hint " + std::to_string(rows_hint) + " schedule " + schedule_name(schedule) +
               " v11 " + std::to_string(v11_block_n));
  const PlainDeviceProblem device(p);
  const DeviceBuffer& out = device.out;
  kernels::GroupedGemmFp8Args args = device.args(p);
  args.rows_per_expert_hint = rows_hint;
  const auto run_once = [&](Fp8GemmSchedule which, int v11) {
    poison_device_buffer(out.data, out.bytes);
    args.schedule = which;
    args.v11 = v11 != 0 ? 1 : 0;
    args.v11_block_n = v11;
    kernels::grouped_gemm_fp8_bf16out(args, nullptr);
    MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
    return out.download<uint16_t>();
  };
  const auto result = run_once(schedule, 0);
  if (schedule == Fp8GemmSchedule::kPingPong)
    EXPECT_TRUE(run_once(Fp8GemmSchedule::kSerial, 0) == result) << "pingpong and serial outputs differ";
  if (v11_block_n != 0) {
    for (const char* cluster : {"0", "1"})
      for (const char* tma_scales : kV11ScaleModes) {
        const ScopedEnv cluster_env(kGemmClusterEnv, cluster);
        const ScopedScales env(tma_scales);
        const auto wide = run_once(schedule, v11_block_n);
        int64_t differ = 0;
        for (size_t i = 0; i < wide.size(); ++i)
          if (wide[i] != result[i] && differ++ < 5)
            ADD_FAILURE() << "v11 (" << v11_block_n << ", TMA scales " << tma_scales << ", cluster " << cluster
                          << ") out[" << i / n << ", " << i % n << "] = 0x" << std::hex << wide[i] << " vs 0x"
                          << result[i] << std::dec;
        EXPECT_EQ(differ, 0) << "v11 outputs (TMA scales " << tma_scales << ", cluster " << cluster
                             << ") must be bit-identical to the v8-v10 kernel's";
      }
  }

  const ReferenceGrid grid = reference_grid(p, n);
  double error_sq = 0, ref_sq = 0;
  int64_t bad = 0, mismatched_bits = 0;
  for (int64_t r = 0; r < p.capacity; ++r) {
    const int e = expert_of_row(p, r);
    for (int c = 0; c < n; ++c) {
      const uint16_t got_bits = result[r * n + c];
      if (e < 0) {  // rows of no expert stay poisoned
        if (got_bits != 0xFFFF && bad++ < 5) ADD_FAILURE() << "row " << r << " of no expert was written";
        continue;
      }
      const double ref = grid.at(r, c), magnitude = grid.magnitude_at(r, c);
      const float got = bf16_decode(got_bits);
      if (!std::isfinite(got)) {
        if (bad++ < 5) ADD_FAILURE() << "non-finite out[" << r << ", " << c << "]";
        continue;
      }
      if (exact) {
        if (got_bits != bf16_round(static_cast<float>(ref)) && mismatched_bits++ < 5)
          ADD_FAILURE() << "out[" << r << ", " << c << "] = " << got << " != bf16(" << ref << ")";
        continue;
      }
      const double diff = got - ref;
      const double rounded = bf16_decode(bf16_round(static_cast<float>(ref)));  // rounded like the kernel
      error_sq += (got - rounded) * (got - rounded);
      ref_sq += rounded * rounded;
      // bf16 rounding (2^-8 relative) + the tensor core's reduced-precision FP8 accumulation
      // within each 128-K block (bounded by 2^-12 of the sum of |terms|).
      const double bound = std::ldexp(std::fabs(ref), -8) + std::ldexp(magnitude, -12) + 1e-30;
      if (std::fabs(diff) > bound && bad++ < 5)
        ADD_FAILURE() << "out[" << r << ", " << c << "] = " << got << " ref " << ref << " bound " << bound;
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(mismatched_bits, 0);
  if (!exact) {
    const double rel_l2 = std::sqrt(error_sq / ref_sq);
    EXPECT_LT(rel_l2, 2e-3);
    std::printf("plain grouped GEMM n=%d k=%d hint=%d rel-L2 %.3g\n", n, k, rows_hint, rel_l2);
  }
}

TEST(GroupedGemmFp8, PlainSplitMRandomShapes) {
  MEGAMOE_REQUIRE_GPUS(1);
  run_plain({0, 1, 130, 63, 200, 64, 129}, 384, 512, 1234, 0, false);    // 256 x 128 tiles
  run_plain({0, 1, 130, 63, 200, 64, 129}, 384, 512, 1235, 200, false);  // 128 x 128 tiles
}

TEST(GroupedGemmFp8, PlainSplitNSmallGroups) {
  MEGAMOE_REQUIRE_GPUS(1);
  run_plain({8, 0, 1, 17, 64, 33}, 512, 384, 99, 16, false);
}

// Session 7: MegaMulti.ManyGemm2TilesPerCta hung with the staged rows hint on; its single-rank staged
// reference on rank 0 ran exactly these GEMMs (H 4096, I 128, 16 experts, 2048 rows = the whole receive
// buffer): GEMM 1 in 64 x 256 tiles (hint 128), GEMM 2 in 128 x 128 tiles with ONE k-block. No other
// test fills the buffer to the last row (make_problem pads it). Both hints, several row splits.
std::vector<int> uniform_counts(int experts, int rows, uint64_t seed) {
  std::vector<int> counts(experts, 0);
  std::mt19937_64 rng(seed);
  for (int r = 0; r < rows; ++r) ++counts[rng() % experts];
  return counts;
}

TEST(GroupedGemmFp8, PlainFullBufferOneKBlock) {
  MEGAMOE_REQUIRE_GPUS(1);
  const NoPadding no_padding;
  for (uint64_t seed = 0; seed < 2; ++seed)
    for (int hint : {128, 0}) run_plain(uniform_counts(16, 2048, 70 + seed), 4096, 128, 700 + seed, hint, false);
}

TEST(GroupedGemmFp8, PlainDeepK) {
  MEGAMOE_REQUIRE_GPUS(1);
  run_plain({100, 0, 129}, 256, 7168, 7, 0, false);
}

TEST(GroupedGemmFp8, PlainBitExactSmallIntegers) {
  MEGAMOE_REQUIRE_GPUS(1);
  run_plain({3, 0, 128, 77}, 256, 1024, 5, 0, true);
  run_plain({3, 0, 128, 77}, 256, 1024, 6, 8, true);
  run_plain({3, 0, 128, 77}, 256, 1024, 7, 128, true);
}

// fp64 value of every expert row's out[r, c] computed on the device, one thread per element, from the
// host's E4M3 decode table (no tensor cores, no shared code with the kernel): a fast reference for
// problems whose CPU reference would take minutes. row_expert[r] = -1 for rows of no expert (skipped).
__global__ void plain_gemm_device_reference(const uint8_t* a, const float* a_scales, const uint8_t* w,
                                            const float* w_scales, const int32_t* row_expert, const double* decode,
                                            int64_t rows, int n, int k, double* out) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= rows * n) return;
  const int64_t r = index / n;
  const int c = static_cast<int>(index % n);
  const int e = row_expert[r];
  if (e < 0) return;
  const int kb_count = k / 128;
  double sum = 0;
  for (int kb = 0; kb < kb_count; ++kb) {
    const uint8_t* a_block = a + r * k + kb * 128;
    const uint8_t* w_block = w + (static_cast<int64_t>(e) * n + c) * k + kb * 128;
    double block = 0;
    for (int i = 0; i < 128; ++i) block += decode[a_block[i]] * decode[w_block[i]];
    sum += block * static_cast<double>(a_scales[r * kb_count + kb]) *
           w_scales[(static_cast<int64_t>(e) * (n / 128) + c / 128) * kb_count + kb];
  }
  out[index] = sum;
}

// v8 BF16 bulk-store epilogue on problems with several tiles per CTA (each math warpgroup reuses its
// staging rows across chunks, sub-tiles and tiles) and many expert boundaries inside tiles: exactly
// representable inputs (small integers, power-of-two scales), so every expert row must equal
// bf16_rn(fp64 value) bit for bit, and rows of no expert must keep their poison. Each rows hint picks a
// tile config (0: 256 x 128 / 32-row staging, 200: 128 x 128 / 32-row, 16: 64 x 256 / 64-row) and every
// schedule runs it.
// v11_block_ns non-empty: runs the v11 kernel at each of those tile widths instead of the hints x schedules above.
void run_plain_exact_many_tiles(const std::vector<int>& counts, int n, int k, uint64_t seed, const std::string& what,
                                const std::vector<int>& v11_block_ns = {}) {
  const Problem p = make_problem(counts, n, k, seed, true);
  std::vector<int32_t> row_expert(p.capacity, -1);
  for (int e = 0; e < p.experts; ++e)
    for (int r = p.offsets[e]; r < p.offsets[e + 1]; ++r) row_expert[r] = e;
  std::vector<double> decode(256);
  for (int code = 0; code < 256; ++code) {
    const float value = e4m3_decode(static_cast<uint8_t>(code));
    decode[code] = std::isfinite(value) ? value : 0.0;  // NaN codes never occur in small-integer inputs
  }
  const PlainDeviceProblem device(p);
  DeviceBuffer row_expert_d(row_expert), decode_d(decode), reference_d(p.capacity * n * sizeof(double));
  const int64_t elements = p.capacity * n;
  plain_gemm_device_reference<<<static_cast<unsigned>((elements + 255) / 256), 256>>>(
      device.a.as<uint8_t>(), device.a_scales.as<float>(), device.w.as<uint8_t>(), device.w_scales.as<float>(),
      row_expert_d.as<int32_t>(), decode_d.as<double>(), p.capacity, n, k, reference_d.as<double>());
  MEGAMOE_CUDA_CHECK(cudaGetLastError());
  MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
  const auto reference = reference_d.download<double>();
  std::vector<uint16_t> expected(elements, 0xFFFF);
  int64_t inexact = 0;
  for (int64_t r = 0; r < p.capacity; ++r) {
    if (row_expert[r] < 0) continue;
    for (int c = 0; c < n; ++c) {
      const double value = reference[r * n + c];
      if (static_cast<double>(static_cast<float>(value)) != value) ++inexact;
      expected[r * n + c] = bf16_round(static_cast<float>(value));
    }
  }
  ASSERT_EQ(inexact, 0) << "exact-input sums must be exact in FP32 (seed " << seed << ")";

  const DeviceBuffer& out = device.out;
  kernels::GroupedGemmFp8Args args = device.args(p);
  struct Run {
    int hint;
    Fp8GemmSchedule schedule;
    int v11_block_n;
    const char* tma_scales = "0";  // v11 runs: MEGAMOE_FP8_V11_TMA_SCALES
    const char* cluster = "0";     // v11 runs: MEGAMOE_GEMM_CLUSTER
  };
  std::vector<Run> runs;
  if (v11_block_ns.empty()) {
    for (const int hint : {0, 200, 16})
      for (const Fp8GemmSchedule schedule : {Fp8GemmSchedule::kSerial, Fp8GemmSchedule::kPingPong, Fp8GemmSchedule::kOverlap})
        runs.push_back({hint, schedule, 0});
  } else {
    for (const int block_n : v11_block_ns)
      for (const char* cluster : {"0", "1"})
        for (const char* tma_scales : kV11ScaleModes)
          runs.push_back({0, Fp8GemmSchedule::kAuto, block_n, tma_scales, cluster});
  }
  for (const Run& run : runs) {
      const int hint = run.hint;
      const Fp8GemmSchedule schedule = run.schedule;
      SCOPED_TRACE(what + " seed " + std::to_string(seed) + " experts " + std::to_string(p.experts) + " rows " +
                   std::to_string(p.offsets.back() - p.offsets.front()) + " n " + std::to_string(n) + " k " +
                   std::to_string(k) + " hint " + std::to_string(hint) + " schedule " + schedule_name(schedule) +
                   " v11 " + std::to_string(run.v11_block_n) + " TMA scales " + run.tma_scales + " cluster " +
                   run.cluster);
      const ScopedScales env(run.tma_scales);
      const ScopedEnv cluster_env(kGemmClusterEnv, run.cluster);
      poison_device_buffer(out.data, out.bytes);
      args.rows_per_expert_hint = hint;
      args.schedule = schedule;
      args.v11 = run.v11_block_n != 0 ? 1 : 0;
      args.v11_block_n = run.v11_block_n;
      kernels::grouped_gemm_fp8_bf16out(args, nullptr);
      MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = out.download<uint16_t>();
      int64_t wrong = 0, compared = 0;
      for (int64_t r = 0; r < p.capacity; ++r)
        for (int c = 0; c < n; ++c) {
          ++compared;
          if (got[r * n + c] != expected[r * n + c] && wrong++ < 5)
            ADD_FAILURE() << "out[" << r << ", " << c << "] (expert " << row_expert[r] << ") = 0x" << std::hex
                          << got[r * n + c] << " expected 0x" << expected[r * n + c] << std::dec;
        }
      EXPECT_EQ(wrong, 0) << "of " << compared;
    }
}

// v11 (sm90_fp8_wide_grouped_gemm.cuh): bit-identical to the v8-v10 kernel (run_plain's v11 cross-check),
// which the fp64 reference judges; n = 640 = 3 x 192 + 64 (a partial last 192-wide tile, whose columns
// straddle two B scale blocks) and n = 384 = 2 x 192 (both tile parities: 192-wide tiles starting at a
// block boundary and 64 columns into a block); experts of 0, 1, 63-200 rows.
TEST(GroupedGemmFp8, V11MatchesPlainRandomShapes) {
  MEGAMOE_REQUIRE_GPUS(1);
  for (const int block_n : {128, 192}) {
    run_plain({0, 1, 130, 63, 200, 64, 129}, 640, 512, 1240, 200, false, Fp8GemmSchedule::kAuto, block_n);
    run_plain({0, 1, 130, 63, 200, 64, 129}, 384, 512, 1241, 0, false, Fp8GemmSchedule::kAuto, block_n);
    run_plain({77, 0, 1, 150}, 1152, 1024, 1242, 0, false, Fp8GemmSchedule::kAuto, block_n);
  }
}

// Deep K (7168, the dsv3 GEMM-1 depth: 56 k-blocks, the ring wraps many times per tile) and a 7168-wide
// n (dsv3 hidden: 37 x 192 + 64) with a short K.
TEST(GroupedGemmFp8, V11MatchesPlainDeepKWideN) {
  MEGAMOE_REQUIRE_GPUS(1);
  for (const int block_n : {128, 192}) {
    run_plain({100, 0, 129, 63}, 640, 7168, 1250, 0, false, Fp8GemmSchedule::kAuto, block_n);
    run_plain({1, 63, 130}, 7168, 256, 1251, 0, false, Fp8GemmSchedule::kAuto, block_n);
  }
}

TEST(GroupedGemmFp8, V11BitExactSmallIntegers) {
  MEGAMOE_REQUIRE_GPUS(1);
  for (const int block_n : {128, 192}) {
    run_plain({3, 0, 128, 77}, 640, 1024, 15, 0, true, Fp8GemmSchedule::kAuto, block_n);
    run_plain({3, 0, 128, 77, 1}, 256, 128, 16, 8, true, Fp8GemmSchedule::kAuto, block_n);
  }
}

// v11 with several tiles per CTA (persistent ring, staging rows and phases carried across tiles) and expert
// boundaries inside tiles, exact inputs: every expert row equals bf16_rn(fp64) bit for bit; n = 2176 =
// 11 x 192 + 64; ~30 m-tiles x 12-17 n-tiles: 3-4 tiles per CTA.
TEST(GroupedGemmFp8, V11ManyTilesPerCta) {
  MEGAMOE_REQUIRE_GPUS(1);
  std::vector<int> counts = {0, 1, 8, 16, 24, 31, 32, 33, 64, 65, 100, 127, 128, 129, 255, 256, 257, 520};
  const uint64_t seed = 8111;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> rows(0, 600);
  for (int i = 0; i < 6; ++i) counts.push_back(rows(rng));
  run_plain_exact_many_tiles(counts, 2176, 384, seed, "v11 many tiles", {128, 192});  // TMA scales: fallback
  // k = 1024 (% 512 == 0): the TMA-scale runs take the TMA path, 2 groups of 4 k-blocks per tile.
  run_plain_exact_many_tiles(counts, 2176, 1024, seed + 1, "v11 many tiles, k 1024", {128, 192});
}

// v11 clusters (MEGAMOE_GEMM_CLUSTER=1, docs/grouped_gemm.md "v11 clusters"): the cluster kernel's outputs equal the
// 1-CTA kernel's bit for bit on the same inputs (random, poisoned outputs before each run), both tile orders
// (MEGAMOE_GEMM_M_FASTEST), both A-scale paths and both widths. Shapes: a single expert of 1 m-tile (lone units
// only), odd m-tile counts (1, 3, 5: pairs then lone units of the last m-tile) and even ones, odd n-tile counts
// (n 384 / 640 at width 128: 3 / 5 n-tiles, so the last lone unit's CTA 1 has no tile), row counts off the 64 /
// 128-row boundaries, experts of 0 rows, and enough units for several per cluster (the ring and phases carried
// across units; n 640 = 3 x 192 + 64 at width 192: a partial last n-tile whose second B part starts past the last
// expert's rows, moved back inside the tensor).
void run_cluster_vs_plain_v11(const std::vector<int>& counts, int n, int k, uint64_t seed) {
  const Problem p = make_problem(counts, n, k, seed, false);
  const PlainDeviceProblem device(p);
  const DeviceBuffer& out = device.out;
  kernels::GroupedGemmFp8Args args = device.args(p);
  args.rows_per_expert_hint = 0;
  args.schedule = Fp8GemmSchedule::kAuto;
  args.v11 = 1;
  for (const int block_n : {128, 192})
    for (const char* m_fastest : {"0", "1"})
      for (const char* tma_scales : kV11ScaleModes) {
        SCOPED_TRACE(describe(p, seed) + " v11 " + std::to_string(block_n) + " m-fastest " + m_fastest +
                     " TMA scales " + tma_scales);
        const ScopedEnv order_env("MEGAMOE_GEMM_M_FASTEST", m_fastest);
        const ScopedScales scales_env(tma_scales);
        args.v11_block_n = block_n;
        const auto run_once = [&](const char* cluster) {
          const ScopedEnv cluster_env(kGemmClusterEnv, cluster);
          poison_device_buffer(out.data, out.bytes);
          kernels::grouped_gemm_fp8_bf16out(args, nullptr);
          MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
          return out.download<uint16_t>();
        };
        const auto plain = run_once("0");
        const auto clustered = run_once("1");
        int64_t differ = 0, written = 0;
        for (size_t i = 0; i < plain.size(); ++i) {
          written += plain[i] != 0xFFFF;
          if (clustered[i] != plain[i] && differ++ < 5)
            ADD_FAILURE() << "cluster out[" << i / n << ", " << i % n << "] = 0x" << std::hex << clustered[i]
                          << " vs 0x" << plain[i] << std::dec;
        }
        EXPECT_EQ(differ, 0) << "cluster 1 outputs must equal cluster 0's bit for bit";
        EXPECT_GT(written, 0);
      }
}

TEST(GroupedGemmFp8, V11ClusterMatchesNoCluster) {
  MEGAMOE_REQUIRE_GPUS(1);
  run_cluster_vs_plain_v11({77}, 640, 512, 1260);   // one expert, 1 m-tile
  run_cluster_vs_plain_v11({300}, 384, 1024, 1261);  // one expert, 3 m-tiles
  run_cluster_vs_plain_v11({0, 1, 129, 256, 257, 640, 0, 383}, 640, 2048, 1262);  // 0, 1, 2, 2, 3, 5, 0, 3 m-tiles
  // Many units per cluster: 48 experts of 0..700 rows (~140 m-tiles, pairs and lone units) at n 2176 (12 / 17 n-tiles):
  // ~12-17 units per cluster.
  std::vector<int> counts;
  std::mt19937_64 rng(1263);
  std::uniform_int_distribution<int> rows(0, 700);
  for (int i = 0; i < 48; ++i) counts.push_back(rows(rng));
  run_cluster_vs_plain_v11(counts, 2176, 512, 1263);
}

// Selection errors: block widths other than 128 / 192.
TEST(GroupedGemmFp8, V11RejectsBadBlockN) {
  MEGAMOE_REQUIRE_GPUS(1);
  const Problem p = make_problem({4}, 256, 128, 3);
  const PlainDeviceProblem device(p);
  kernels::GroupedGemmFp8Args args = device.args(p);
  args.v11 = 1;
  args.v11_block_n = 256;
  EXPECT_THROW(kernels::grouped_gemm_fp8_bf16out(args, nullptr), Error);
}

TEST(GroupedGemmFp8, PlainBulkStoreManyTilesPerCta) {
  MEGAMOE_REQUIRE_GPUS(1);
  // Experts ending on and around every staging boundary (8-row warp halves, 16-row warp slices, 32-row
  // chunks, 64-row sub-tiles, 128 / 256-row tiles), then seeded random ones: 416-624 tiles, 3-5 per CTA.
  std::vector<int> counts = {0, 1, 8, 16, 24, 31, 32, 33, 64, 100, 129, 255, 256, 257, 520};
  const uint64_t seed = 8101;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> rows(0, 600);
  for (int i = 0; i < 6; ++i) counts.push_back(rows(rng));
  run_plain_exact_many_tiles(counts, 2048, 256, seed, "many tiles");
}

// kMaxExperts (the largest ExpertTileTable, so the largest shared-memory carve-up of every config) with
// most experts of 0-5 rows: hundreds of tiles per config, nearly every one mixing two experts' rows.
TEST(GroupedGemmFp8, PlainBulkStoreMaxExperts) {
  MEGAMOE_REQUIRE_GPUS(1);
  const uint64_t seed = 8102;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> rows(0, 5), large(0, 300);
  std::vector<int> counts(1024);
  for (int e = 0; e < 1024; ++e) counts[e] = e % 97 == 3 ? large(rng) : rows(rng);
  run_plain_exact_many_tiles(counts, 256, 128, seed, "1024 experts");
}

double activate(double gate, double up, const Activation& act) {
  if (act.kind == Activation::Kind::kSiluMul) return gate / (1.0 + std::exp(-gate)) * up;
  const double g = std::min<double>(gate, act.limit);
  const double u = std::clamp<double>(up, -act.limit, act.limit);
  return g / (1.0 + std::exp(-static_cast<double>(act.alpha) * g)) * (u + 1.0);
}

double e4m3_ulp(double magnitude) {
  if (magnitude < std::ldexp(1.0, -6)) return std::ldexp(1.0, -9);
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(magnitude))) - 3);
}

// The GEMM-1 epilogue's arithmetic evaluated row by row: activate() of the kernel header, the row amax
// (fmaxf of |value|), then the top-k weight and the requantization in the formats rule's order (IEEE
// divisions, RNE, saturating), from FP32 gate / up values. For exactly representable inputs those are
// the kernel's accumulators bit for bit, so the kernel's codes and scales must equal these exactly,
// whichever of its math warpgroups finishes which element (v7 splits the rows between them, v6 ran
// everything on the up warpgroup: both must pass).
__global__ void swiglu_quant_device_reference(const float* gate, const float* up, const float* topk, int rows,
                                              int intermediate, int kind, float limit, float alpha, uint8_t* codes,
                                              float* scales) {
  const int groups = intermediate / 128;
  const int index = blockIdx.x * blockDim.x + threadIdx.x;
  if (index >= rows * groups) return;
  const int64_t r = index / groups;
  const int g = index % groups;
  const float* gate_row = gate + r * intermediate + g * 128;
  const float* up_row = up + r * intermediate + g * 128;
  float amax = 0.0f;
  for (int i = 0; i < 128; ++i)
    amax = fmaxf(amax, fabsf(kernels::sm90::activate(gate_row[i], up_row[i], kind, limit, alpha)));
  const float weight = topk ? topk[r] : 1.0f;
  const float scale = __fdiv_rn(fmaxf(__fmul_rn(amax, fabsf(weight)), 1e-10f), 448.0f);
  for (int i = 0; i < 128; i += 2) {
    const float v0 = kernels::sm90::activate(gate_row[i], up_row[i], kind, limit, alpha);
    const float v1 = kernels::sm90::activate(gate_row[i + 1], up_row[i + 1], kind, limit, alpha);
    const float2 pair = make_float2(__fdiv_rn(__fmul_rn(v0, weight), scale), __fdiv_rn(__fmul_rn(v1, weight), scale));
    *reinterpret_cast<__nv_fp8x2_storage_t*>(codes + r * intermediate + g * 128 + i) =
        __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3);
  }
  scales[r * groups + g] = scale;
}

// MEGAMOE_TEST_GEMM1_DUMP=DIR: run_gemm1 also writes each launch's codes + scales to DIR/<seed>_<hint>_
// <schedule>.bin, so two builds (e.g. this test binary against an older libmegamoe.so through
// LD_LIBRARY_PATH) can be compared byte for byte on random inputs (cmp); the test asserts nothing more.
void dump_gemm1_outputs(uint64_t seed, int rows_hint, const char* schedule, const std::vector<uint8_t>& codes,
                        const std::vector<float>& scales) {
  const char* dir = std::getenv("MEGAMOE_TEST_GEMM1_DUMP");
  if (!dir || !*dir) return;
  const std::string path =
      std::string(dir) + "/" + std::to_string(seed) + "_" + std::to_string(rows_hint) + "_" + schedule + ".bin";
  std::FILE* file = std::fopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << "cannot write " << path;
  std::fwrite(codes.data(), 1, codes.size(), file);
  std::fwrite(scales.data(), sizeof(float), scales.size(), file);
  std::fclose(file);
}

// Exact inputs only: gate / up in fp64 (exact in FP32, checked), the device reference above, then codes
// and scales of every expert row compared bit for bit with the kernel's.
void expect_gemm1_matches_device_arithmetic(const Problem& p, const ReferenceGrid& grid, int intermediate,
                                            const Activation& act,
                                            const std::vector<float>* topk, const std::vector<uint8_t>& q,
                                            const std::vector<float>& scales) {
  std::vector<float> gate(p.capacity * intermediate, 0.0f), up(p.capacity * intermediate, 0.0f);
  int64_t inexact = 0;
  for (int64_t r = 0; r < p.capacity; ++r) {
    const int e = expert_of_row(p, r);
    if (e < 0) continue;
    for (int c = 0; c < intermediate; ++c) {
      const double g = grid.at(r, c), u = grid.at(r, intermediate + c);
      gate[r * intermediate + c] = static_cast<float>(g);
      up[r * intermediate + c] = static_cast<float>(u);
      if (static_cast<double>(static_cast<float>(g)) != g || static_cast<double>(static_cast<float>(u)) != u) ++inexact;
    }
  }
  ASSERT_EQ(inexact, 0) << "exact-input gate/up values must be exact in FP32";
  const int groups = intermediate / 128;
  DeviceBuffer gate_d(gate), up_d(up), codes_d(p.capacity * intermediate), scales_d(p.capacity * groups * sizeof(float));
  std::vector<float> no_topk;
  DeviceBuffer topk_d(topk ? *topk : no_topk);
  poison_device_buffer(codes_d.data, codes_d.bytes);
  poison_device_buffer(scales_d.data, scales_d.bytes);
  const int kind = act.kind == Activation::Kind::kSiluMul ? 0 : 1;
  const int threads = static_cast<int>(p.capacity) * groups;
  swiglu_quant_device_reference<<<(threads + 127) / 128, 128>>>(gate_d.as<float>(), up_d.as<float>(),
                                                                 topk ? topk_d.as<float>() : nullptr,
                                                                 static_cast<int>(p.capacity), intermediate, kind,
                                                                 act.limit, act.alpha, codes_d.as<uint8_t>(),
                                                                 scales_d.as<float>());
  MEGAMOE_CUDA_CHECK(cudaGetLastError());
  MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
  const auto ref_codes = codes_d.download<uint8_t>();
  const auto ref_scales = scales_d.download<float>();
  int64_t code_diffs = 0, scale_diffs = 0, compared = 0;
  for (int64_t r = 0; r < p.capacity; ++r) {
    if (expert_of_row(p, r) < 0) continue;
    for (int g = 0; g < groups; ++g) {
      if (std::memcmp(&ref_scales[r * groups + g], &scales[r * groups + g], sizeof(float)) != 0 && scale_diffs++ < 5)
        ADD_FAILURE() << "scale[" << r << ", " << g << "] = " << scales[r * groups + g] << " device reference "
                      << ref_scales[r * groups + g];
      for (int i = 0; i < 128; ++i) {
        const int64_t at = r * intermediate + g * 128 + i;
        ++compared;
        if (ref_codes[at] != q[at] && code_diffs++ < 5)
          ADD_FAILURE() << "code[" << r << ", " << g * 128 + i << "] = " << int{q[at]} << " device reference "
                        << int{ref_codes[at]};
      }
    }
  }
  EXPECT_EQ(code_diffs, 0);
  EXPECT_EQ(scale_diffs, 0);
  EXPECT_GT(compared, 0);
  std::printf("gemm1 exact inputs: %lld codes, %lld / %lld differ from the device arithmetic\n",
              static_cast<long long>(compared), static_cast<long long>(code_diffs), static_cast<long long>(compared));
}

// GEMM-1 arguments over a Problem's device buffers (owned by the caller); topk = nullptr: no top-k weight.
kernels::GroupedGemm1Fp8Args gemm1_args(const Problem& p, int hidden, int intermediate, DeviceBuffer& a,
                                        DeviceBuffer& a_scales, DeviceBuffer& w, DeviceBuffer& w_scales,
                                        DeviceBuffer& offsets, DeviceBuffer* topk, DeviceBuffer& out,
                                        DeviceBuffer& out_scales, Activation act, int rows_hint) {
  kernels::GroupedGemm1Fp8Args args;
  args.a = a.as<uint8_t>();
  args.a_scales = a_scales.as<float>();
  args.weights = w.as<uint8_t>();
  args.weight_scales = w_scales.as<float>();
  args.expert_offsets = offsets.as<int32_t>();
  args.topk_weights = topk != nullptr ? topk->as<float>() : nullptr;
  args.out = out.as<uint8_t>();
  args.out_scales = out_scales.as<float>();
  args.m_capacity = p.capacity;
  args.num_experts = p.experts;
  args.hidden = hidden;
  args.intermediate = intermediate;
  args.activation = act;
  args.rows_per_expert_hint = rows_hint;
  return args;
}

void run_gemm1(const std::vector<int>& counts, int hidden, int intermediate, uint64_t seed, const Activation& act,
               bool use_topk, bool exact_inputs = false, int rows_hint = 0,
               Fp8GemmSchedule schedule = Fp8GemmSchedule::kAuto, bool fp64_bounds = true) {
  Problem p = make_problem(counts, 2 * intermediate, hidden, seed, exact_inputs);
  // Make the clamp bite: scale activations up (exact inputs are integers of up to |16 x 128| per block
  // already, and x6 would cost the FP32 accumulation its exactness).
  if (act.kind == Activation::Kind::kSwigluClamped && !exact_inputs)
    for (auto& s : p.a_scales) s *= 6.0f;
  SCOPED_TRACE(describe(p, seed) + " schedule " + schedule_name(schedule));
  std::vector<float> topk(p.capacity);
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  for (auto& t : topk) t = weight(rng);
  // Pack each expert into the kernel layout through the public transform: the split-N layout (kGateUp)
  // and the v9 one (kGateUpInterleaved8).
  const auto size = kernels::packed_weight_bytes(WeightFormat::kFp8Block, 2 * intermediate, hidden);
  std::vector<uint8_t> packed(size.data_bytes * p.experts), packed_v9(size.data_bytes * p.experts);
  std::vector<float> packed_scales(size.scale_count * p.experts), packed_scales_v9(size.scale_count * p.experts);
  for (int e = 0; e < p.experts; ++e) {
    formats::QuantizedMatrix m;
    m.format = WeightFormat::kFp8Block;
    m.rows = 2 * intermediate;
    m.cols = hidden;
    m.data.assign(p.w.begin() + e * size.data_bytes, p.w.begin() + (e + 1) * size.data_bytes);
    m.block_scales.assign(p.w_scales.begin() + e * size.scale_count, p.w_scales.begin() + (e + 1) * size.scale_count);
    kernels::pack_expert_weights(m, kernels::GemmRole::kGateUp, packed.data() + e * size.data_bytes,
                                 packed_scales.data() + e * size.scale_count);
    kernels::pack_expert_weights(m, kernels::GemmRole::kGateUpInterleaved8, packed_v9.data() + e * size.data_bytes,
                                 packed_scales_v9.data() + e * size.scale_count);
  }
  DeviceBuffer a(p.a), a_scales(p.a_scales), w(packed), w_scales(packed_scales), offsets(p.offsets), topk_d(topk);
  DeviceBuffer w_v9(packed_v9), w_scales_v9(packed_scales_v9);
  DeviceBuffer out(p.capacity * intermediate), out_scales(p.capacity * (intermediate / 128) * sizeof(float));
  poison_device_buffer(out.data, out.bytes);
  poison_device_buffer(out_scales.data, out_scales.bytes);
  kernels::GroupedGemm1Fp8Args args = gemm1_args(p, hidden, intermediate, a, a_scales, w, w_scales, offsets,
                                                 use_topk ? &topk_d : nullptr, out, out_scales, act, rows_hint);
  const auto run_once = [&](Fp8GemmSchedule which) {
    poison_device_buffer(out.data, out.bytes);
    poison_device_buffer(out_scales.data, out_scales.bytes);
    args.schedule = which;
    kernels::grouped_gemm1_fp8(args, nullptr);
    MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
    return std::make_pair(out.download<uint8_t>(), out_scales.download<float>());
  };
  const auto [q, scales] = run_once(schedule);
  dump_gemm1_outputs(seed, rows_hint, schedule_name(schedule), q, scales);
  if (schedule == Fp8GemmSchedule::kPingPong) {
    const auto serial = run_once(Fp8GemmSchedule::kSerial);
    EXPECT_TRUE(serial.first == q) << "pingpong and serial codes differ";
    EXPECT_EQ(std::memcmp(serial.second.data(), scales.data(), scales.size() * sizeof(float)), 0)
        << "pingpong and serial scales differ";
  }
  // v9 (split-M 128 x 256 on the interleaved weights, every rows hint): the same FP32 accumulators
  // (same wgmma per element, same promotion) and the same epilogue arithmetic, so codes and scales must
  // equal the split-N kernel's bit for bit; the split-N outputs are judged against the references
  // below, so v9's are too. kOverlap has no v9 form (rejected: RejectsBadGemm1Packing).
  if (schedule != Fp8GemmSchedule::kOverlap) {
    args.weights = w_v9.as<uint8_t>();
    args.weight_scales = w_scales_v9.as<float>();
    args.packing = kernels::GemmRole::kGateUpInterleaved8;
    args.v11 = 0;
    const auto v9 = run_once(schedule);
    dump_gemm1_outputs(seed, rows_hint, (std::string(schedule_name(schedule)) + "_v9").c_str(), v9.first, v9.second);
    int64_t code_diffs = 0;
    for (size_t i = 0; i < q.size(); ++i)
      if (v9.first[i] != q[i] && code_diffs++ < 5)
        ADD_FAILURE() << "v9 code [" << i / intermediate << ", " << i % intermediate << "] = " << int{v9.first[i]}
                      << ", split-N " << int{q[i]};
    EXPECT_EQ(code_diffs, 0) << "v9 vs split-N codes";
    EXPECT_EQ(std::memcmp(v9.second.data(), scales.data(), scales.size() * sizeof(float)), 0)
        << "v9 and split-N scales differ";
    std::printf("gemm1 v9 vs split-N: %lld / %zu codes differ\n", static_cast<long long>(code_diffs), q.size());
    // v11 GEMM 1 (sm90_fp8_wide_gemm1.cuh) on the same v9 weights: v9's partials, promotion order and epilogue
    // under v11's mainloop, A scales by cp.async (switch 0) and by TMA (switch 1; used where hidden % 512 == 0,
    // else the launcher falls back): codes and scales bit-identical to v9 (and so to split-N). The v11 kernel
    // has one schedule and ignores the v9 skew. small = 1: the v11 GEMM-1 small tile (64 x 256, the math
    // warpgroups split N, per-row amax exchange; docs/grouped_gemm.md "v11 GEMM 1 small"), same requirement.
    // The 128 x 256 tile also in clusters of 2 (MEGAMOE_GEMM_CLUSTER=1, docs/grouped_gemm.md "v11 clusters"), and
    // both with the B scales by TMA (MEGAMOE_FP8_GEMM1_TMA_BSCALES=1: with TMA A scales; the launcher keeps the scale
    // warp under TMA scales 0, so that pair repeats the plain run).
    struct V11Variant {
      int small;
      const char* cluster;
      const char* b_scales;
    };
    for (const char* tma_scales : {"0", "1"}) {
      const ScopedEnv env(kV11TmaScalesEnv, tma_scales);
      for (const V11Variant variant : {V11Variant{0, "0", "0"}, V11Variant{0, "1", "0"}, V11Variant{1, "0", "0"},
                                       V11Variant{0, "0", "1"}, V11Variant{0, "1", "1"}}) {
        const ScopedEnv cluster_env(kGemmClusterEnv, variant.cluster);
        const ScopedEnv b_scales_env(kGemm1TmaBScalesEnv, variant.b_scales);
        const int small = variant.small;
        const bool cluster = variant.cluster[0] == '1', b_scales = variant.b_scales[0] == '1';
        const char* what = small      ? "v11 small"
                           : b_scales ? (cluster ? "v11 cluster tma-b" : "v11 tma-b")
                           : cluster  ? "v11 cluster"
                                      : "v11";
        args.v11 = 1;
        args.v11_small = small;
        const auto v11 = run_once(schedule);
        args.v11 = 0;
        args.v11_small = -1;
        int64_t v11_diffs = 0;
        for (size_t i = 0; i < q.size(); ++i)
          if (v11.first[i] != v9.first[i] && v11_diffs++ < 5)
            ADD_FAILURE() << what << " GEMM-1 (TMA scales " << tma_scales << ") code [" << i / intermediate << ", "
                          << i % intermediate << "] = " << int{v11.first[i]} << ", v9 " << int{v9.first[i]};
        EXPECT_EQ(v11_diffs, 0) << what << " GEMM-1 vs v9 codes (TMA scales " << tma_scales << ")";
        EXPECT_EQ(std::memcmp(v11.second.data(), v9.second.data(), v9.second.size() * sizeof(float)), 0)
            << what << " GEMM-1 and v9 scales differ (TMA scales " << tma_scales << ")";
        std::printf("gemm1 %s (TMA scales %s) vs v9: %lld / %zu codes differ\n", what, tma_scales,
                    static_cast<long long>(v11_diffs), q.size());
      }
    }
    args.v11 = -1;
    args.weights = w.as<uint8_t>();
    args.weight_scales = w_scales.as<float>();
    args.packing = kernels::GemmRole::kGateUp;
  }

  const int groups = intermediate / 128;
  const ReferenceGrid grid = reference_grid(p, 2 * intermediate);
  double error_sq = 0, ref_sq = 0;
  int64_t bad = 0, flips = 0, values = 0;
  std::vector<double> h(128), h_error(128);
  const double alpha = act.kind == Activation::Kind::kSiluMul ? 1.0 : act.alpha;
  for (int64_t r = 0; r < p.capacity; ++r) {
    const int e = expert_of_row(p, r);
    for (int g = 0; g < groups; ++g) {
      const float got_scale = scales[r * groups + g];
      if (e < 0) {
        uint32_t bits;
        std::memcpy(&bits, &got_scale, 4);
        if (bits != 0xFFFFFFFFu && bad++ < 5) ADD_FAILURE() << "scale of row " << r << " (no expert) written";
        for (int i = 0; i < 128; ++i)
          if (q[r * intermediate + g * 128 + i] != 0xFF && bad++ < 5) ADD_FAILURE() << "row " << r << " written";
        continue;
      }
      double amax = 0;
      for (int i = 0; i < 128; ++i) {
        const int c = g * 128 + i;
        const double gate = grid.at(r, c), gate_magnitude = grid.magnitude_at(r, c);
        const double up = grid.at(r, intermediate + c), up_magnitude = grid.magnitude_at(r, intermediate + c);
        const double weight = use_topk ? topk[r] : 1.0;
        h[i] = activate(gate, up, act) * weight;
        // Error of h from the GEMM's accumulation error (2^-12 of the sum of |terms|, as in the plain
        // test) through the activation: |d act/d gate| <= (1 + alpha|g|/4) * (|u| + 1), |d act/d up| <= |g|.
        const double gate_error = exact_inputs ? 0.0 : std::ldexp(gate_magnitude, -12);
        const double up_error = exact_inputs ? 0.0 : std::ldexp(up_magnitude, -12);
        h_error[i] = weight * ((1.0 + alpha * std::fabs(gate) / 4) * (std::fabs(up) + 1.0) * gate_error +
                               (std::fabs(gate) + gate_error) * up_error);
        amax = std::max(amax, std::fabs(h[i]));
      }
      const float ref_scale = std::max(static_cast<float>(amax), 1e-10f) / 448.0f;
      if (!(std::fabs(got_scale - ref_scale) <= 1e-3 * ref_scale) && bad++ < 5)
        ADD_FAILURE() << "scale[" << r << ", " << g << "] = " << got_scale << " ref " << ref_scale;
      for (int i = 0; i < 128; ++i) {
        const uint8_t code = q[r * intermediate + g * 128 + i];
        const double got = e4m3_decode(code);
        const double x = h[i] / got_scale;  // the value the kernel should have rounded
        ++values;
        if (!std::isfinite(got)) {
          if (bad++ < 5) ADD_FAILURE() << "NaN code at [" << r << ", " << g * 128 + i << "]";
          continue;
        }
        // Round-to-nearest: within half an E4M3 ulp of h / scale, widened by h's accumulation error.
        const double bound = 0.5 * e4m3_ulp(std::fabs(x)) * (1 + 1e-6) + h_error[i] / got_scale + 1e-6 * std::fabs(x);
        if (std::fabs(got - x) > bound && bad++ < 5)
          ADD_FAILURE() << "q[" << r << ", " << g * 128 + i << "] = " << got << " want ~" << x;
        const uint8_t ref_code = e4m3_encode(h[i] / ref_scale);
        if (ref_code != code) ++flips;
        const double ref_value = e4m3_decode(ref_code) * static_cast<double>(ref_scale);
        const double diff = got * got_scale - ref_value;
        error_sq += diff * diff;
        ref_sq += ref_value * ref_value;
      }
    }
  }
  EXPECT_EQ(bad, 0);
  const double rel_l2 = std::sqrt(error_sq / ref_sq);
  std::printf("gemm1 %s topk=%d: rel-L2 vs fp64-then-quantized %.3g, code flips %lld / %lld\n",
              act.kind == Activation::Kind::kSiluMul ? "silu" : "swiglu_clamped", use_topk,
              rel_l2, static_cast<long long>(flips), static_cast<long long>(values));
  // A code differs from the fp64 reference's only where h is within its accumulation error of a
  // rounding midpoint; each flip costs one E4M3 ulp (1/16..1/8 relative), so ~1% flips give a rel-L2
  // of a few 1e-3 against the quantized reference. With exactly representable inputs the GEMM is
  // exact and only expf/division ulps remain: flips must be (nearly) absent.
  if (exact_inputs) {
    if (fp64_bounds) {
      EXPECT_LT(rel_l2, 2e-3);
      EXPECT_LE(flips, values / 1000);
    }
    expect_gemm1_matches_device_arithmetic(p, grid, intermediate, act, use_topk ? &topk : nullptr, q, scales);
  } else {
    EXPECT_LT(rel_l2, 1e-2);
  }
}

TEST(GroupedGemmFp8, Gemm1ExactInputsMatchQuantizedReference) {
  MEGAMOE_REQUIRE_GPUS(1);
  run_gemm1({0, 1, 70, 63, 130}, 512, 256, 31, Activation{}, true, true);
  run_gemm1({0, 1, 70, 63, 130}, 512, 256, 32, Activation{}, true, true, 8);
}

// v7 epilogue (each math warpgroup finishes half of every sub-tile's rows): for exactly representable
// inputs run_gemm1 also requires codes and scales bit-identical to the row-by-row device evaluation of
// the same arithmetic (expect_gemm1_matches_device_arithmetic): both tile shapes, both activations,
// with and without the top-k weight, experts of 0 / 1 / non-multiple-of-tile rows.
TEST(GroupedGemmFp8, Gemm1ExactInputsMatchDeviceArithmetic) {
  MEGAMOE_REQUIRE_GPUS(1);
  const Activation clamped{Activation::Kind::kSwigluClamped, 7.0f, 1.702f};
  // Only the device-arithmetic equality is asserted here (fp64_bounds = false): the first device run
  // failed the fp64 reference's flip / rel-L2 bounds of the exact-input tests on these shapes with the
  // OLD kernel as well (0 codes differed from the device arithmetic), so those bounds are the other
  // tests' business (Gemm1ExactInputsMatchQuantizedReference keeps them on its shapes).
  run_gemm1({0, 1, 70, 63, 130, 129}, 512, 384, 41, Activation{}, false, true, 0, Fp8GemmSchedule::kAuto, false);
  run_gemm1({0, 1, 70, 63, 130, 129}, 512, 384, 42, Activation{}, true, true, 8, Fp8GemmSchedule::kAuto, false);
  run_gemm1({64, 1, 0, 257, 5}, 384, 256, 43, clamped, true, true, 0, Fp8GemmSchedule::kAuto, false);
  run_gemm1({64, 1, 0, 257, 5}, 384, 256, 44, clamped, false, true, 8, Fp8GemmSchedule::kAuto, false);
}

TEST(GroupedGemmFp8, Gemm1FullBufferSmallTiles) {
  MEGAMOE_REQUIRE_GPUS(1);
  const NoPadding no_padding;
  for (uint64_t seed = 0; seed < 1; ++seed)
    for (int hint : {128, 0})
      run_gemm1(uniform_counts(16, 2048, 80 + seed), 4096, 128, 800 + seed, Activation{}, false, false, hint,
                Fp8GemmSchedule::kAuto, false);
}

TEST(GroupedGemmFp8, Gemm1SiluTopk) {
  MEGAMOE_REQUIRE_GPUS(1);
  run_gemm1({0, 1, 70, 63, 65, 130}, 512, 256, 21, Activation{}, true);                // 128 x 256 tiles
  run_gemm1({0, 1, 70, 63, 65, 130}, 512, 256, 24, Activation{}, true, false, 16);     //  64 x 256 tiles
}

TEST(GroupedGemmFp8, Gemm1SwigluClampedNoTopk) {
  MEGAMOE_REQUIRE_GPUS(1);
  const Activation act{Activation::Kind::kSwigluClamped, 7.0f, 1.702f};
  run_gemm1({5, 0, 129, 1}, 384, 384, 22, act, false);
}

TEST(GroupedGemmFp8, Gemm1DeepHidden) {
  MEGAMOE_REQUIRE_GPUS(1);
  run_gemm1({33, 0, 80}, 7168, 256, 23, Activation{}, true);
}

// v9 with several tiles per CTA (the per-warp staging rows are reused tile after tile: the bulk-read
// wait before each tile's staging writes; the scale ring over many tiles), 300 experts of 0..70 rows
// (0, 1, 64 and 65 forced in), exact inputs: v9 == split-N bit for bit (run_gemm1) and both equal to the
// device evaluation of the epilogue arithmetic; both activations, with and without top-k.
TEST(GroupedGemmFp8, Gemm1V9ManyTilesPerCta) {
  MEGAMOE_REQUIRE_GPUS(1);
  std::mt19937_64 rng(61);
  std::vector<int> counts(300);
  for (auto& c : counts) c = static_cast<int>(rng() % 71);
  counts[0] = 0, counts[1] = 1, counts[2] = 64, counts[3] = 65, counts[299] = 0;
  const Activation clamped{Activation::Kind::kSwigluClamped, 7.0f, 1.702f};
  run_gemm1(counts, 128, 256, 62, Activation{}, true, true, 0, Fp8GemmSchedule::kSerial, false);
  run_gemm1(counts, 128, 384, 63, clamped, false, true, 128, Fp8GemmSchedule::kPingPong, false);
  // The v9 skew (warpgroup 1 that many k-blocks behind; the v9 run inside run_gemm1 reads it from the
  // environment): 3 with one k-block (clamped), 4 (the whole ring) with 8 k-blocks per tile.
  ASSERT_EQ(setenv("MEGAMOE_FP8_GEMM1_V9_SKEW", "3", 1), 0);
  run_gemm1(counts, 128, 256, 64, Activation{}, true, true, 0, Fp8GemmSchedule::kSerial, false);
  ASSERT_EQ(setenv("MEGAMOE_FP8_GEMM1_V9_SKEW", "4", 1), 0);
  run_gemm1({33, 0, 1, 200, 64, 129}, 1024, 256, 65, clamped, true, true, 0, Fp8GemmSchedule::kSerial, false);
  unsetenv("MEGAMOE_FP8_GEMM1_V9_SKEW");
}

// v11 GEMM 1 (sm90_fp8_wide_gemm1.cuh; run_gemm1 runs it with the TMA-scale switch off and on and requires v9's
// bits) with several tiles per CTA where the A scales come by TMA: hidden 512 (one 4-k-block scale group per tile,
// the single ring slot reused tile after tile; 300 experts of 0..70 rows, ~4 tiles per CTA, warpgroup 1 idle on
// most tiles) and hidden 2048 (4 groups per tile; random inputs against the fp64 reference).
TEST(GroupedGemmFp8, Gemm1V11ManyTilesPerCta) {
  MEGAMOE_REQUIRE_GPUS(1);
  std::mt19937_64 rng(66);
  std::vector<int> counts(300);
  for (auto& c : counts) c = static_cast<int>(rng() % 71);
  counts[0] = 0, counts[1] = 1, counts[2] = 64, counts[3] = 65, counts[299] = 0;
  const Activation clamped{Activation::Kind::kSwigluClamped, 7.0f, 1.702f};
  run_gemm1(counts, 512, 256, 66, Activation{}, true, true, 0, Fp8GemmSchedule::kSerial, false);
  std::vector<int> fewer(64);
  for (auto& c : fewer) c = static_cast<int>(rng() % 140);
  fewer[0] = 128, fewer[1] = 0, fewer[2] = 129;
  // Exact inputs (fp64 bounds off, as Gemm1V9ManyTilesPerCta): with random inputs the clamp test scales A by 6, and at
  // K 2048 the FP32 accumulation error near the clamp costs ~1.7% code flips (rel-L2 0.0198 vs fp64, session 13 call 1,
  // every element inside its bound) for v9 as much as v11; this case is about v11 == v9 on TMA-scale shapes.
  run_gemm1(fewer, 2048, 512, 67, clamped, true, true, 0, Fp8GemmSchedule::kAuto, false);
  // kMaxExperts (the largest tile table: v11 GEMM 1's largest shared-memory carve-up), experts of 0-5 rows and a few
  // up to 300: nearly every tile mixes experts; TMA scales at hidden 512.
  std::uniform_int_distribution<int> tiny(0, 5), large(0, 300);
  std::vector<int> most(1024);
  for (int e = 0; e < 1024; ++e) most[e] = e % 97 == 3 ? large(rng) : tiny(rng);
  run_gemm1(most, 512, 128, 68, Activation{}, true, true, 0, Fp8GemmSchedule::kSerial, false);
}

// v11 GEMM 1 small (64 x 256 split-N tile on the interleaved weights; run_gemm1 runs it next to v11 with the
// TMA-scale switch off and on and requires v9's codes and scales bit for bit, outputs poisoned before every launch):
// experts of 0 / 1 / 63 / 64 / 65 / 129 rows (one expert over two and three 64-row tiles, tiles of 1 row), K 384
// (cp.async scales), 2048 and 7168 (TMA scales), SiLU and clamped SwiGLU, with and without the top-k weight, exact
// inputs (also bit-identical to the device arithmetic through split-N) and random ones (fp64 bounds).
TEST(GroupedGemmFp8, Gemm1V11SmallTile) {
  MEGAMOE_REQUIRE_GPUS(1);
  const std::vector<int> counts{0, 1, 63, 64, 65, 129, 8, 0};
  const Activation clamped{Activation::Kind::kSwigluClamped, 7.0f, 1.702f};
  run_gemm1(counts, 384, 256, 91, Activation{}, true, true, 8, Fp8GemmSchedule::kAuto, false);
  run_gemm1(counts, 384, 384, 92, clamped, false, true, 0, Fp8GemmSchedule::kAuto, false);
  run_gemm1(counts, 2048, 256, 93, clamped, true, true, 32, Fp8GemmSchedule::kAuto, false);
  run_gemm1(counts, 2048, 384, 94, Activation{}, false, false, 0);
  run_gemm1(counts, 7168, 256, 95, Activation{}, true, false, 8);
  run_gemm1(counts, 7168, 256, 96, clamped, false, true, 0, Fp8GemmSchedule::kAuto, false);
}

// Tail-trimmed A loads (produce_fp8_tile_trimmed, the default) and whole-box loads
// (MEGAMOE_FP8_A_TAIL_TRIM=0) on experts whose last m-tile holds 1, 63, 64, 65, 129, 191 and 255 rows of
// 256- / 128-row tiles, every tile config and schedule whose mainloop still reads the unloaded chunks
// (pingpong, overlap): exact inputs, so both must equal the reference bit for bit.
TEST(GroupedGemmFp8, ATailTrimOnAndOff) {
  MEGAMOE_REQUIRE_GPUS(1);
  const std::vector<int> counts{1, 0, 63, 64, 65, 129, 191, 255, 257, 300};
  for (const char* trim : {"0", "1"}) {
    SCOPED_TRACE(std::string("MEGAMOE_FP8_A_TAIL_TRIM=") + trim);
    ASSERT_EQ(setenv("MEGAMOE_FP8_A_TAIL_TRIM", trim, 1), 0);
    run_plain(counts, 256, 256, 71, 0, true);                                // 256 x 128
    run_plain(counts, 256, 256, 72, 200, true, Fp8GemmSchedule::kPingPong);  // 128 x 128, all groups issued
    run_plain(counts, 256, 384, 73, 0, true, Fp8GemmSchedule::kOverlap);     // 256 x 128, global scales
    run_plain(counts, 256, 256, 74, 32, true);                               // 64 x 256
    run_gemm1(counts, 256, 256, 75, Activation{}, true, true, 0, Fp8GemmSchedule::kSerial, false);
    run_gemm1(counts, 256, 256, 76, Activation{}, false, true, 0, Fp8GemmSchedule::kPingPong, false);
  }
  ASSERT_EQ(setenv("MEGAMOE_FP8_A_TAIL_TRIM", "2", 1), 0);
  EXPECT_THROW(run_plain({5}, 256, 256, 77, 0, true), Error);
  unsetenv("MEGAMOE_FP8_A_TAIL_TRIM");
}

// Spread SwiGLU epilogue (swiglu_quant_fp8_spread_epilogue: 64 x 256 split-N tiles with <= 32 rows of their
// expert) and the balanced one (MEGAMOE_SWIGLU_SPREAD=0): exact inputs, so both must equal the device
// evaluation of the epilogue arithmetic bit for bit (run_gemm1); experts of 0..64 rows, so tiles take both
// epilogues one after the other (the balanced one's bulk copies, then the spread one's staging writes);
// both activations, with and without top-k; random inputs against the fp64 bounds.
TEST(GroupedGemmFp8, Gemm1SpreadEpilogueOnAndOff) {
  MEGAMOE_REQUIRE_GPUS(1);
  const Activation clamped{Activation::Kind::kSwigluClamped, 7.0f, 1.702f};
  const std::vector<int> counts{1, 0, 5, 8, 9, 15, 16, 17, 31, 32, 33, 64, 2, 16};
  for (const char* spread : {"0", "1"}) {
    SCOPED_TRACE(std::string("MEGAMOE_SWIGLU_SPREAD=") + spread);
    ASSERT_EQ(setenv("MEGAMOE_SWIGLU_SPREAD", spread, 1), 0);
    run_gemm1(counts, 256, 256, 91, Activation{}, true, true, 8, Fp8GemmSchedule::kSerial, false);
    run_gemm1(counts, 384, 384, 92, clamped, false, true, 16, Fp8GemmSchedule::kPingPong, false);
    run_gemm1(counts, 512, 256, 93, clamped, true, true, 32, Fp8GemmSchedule::kSerial, false);
    run_gemm1(counts, 512, 256, 94, Activation{}, true, false, 8);
  }
  ASSERT_EQ(setenv("MEGAMOE_SWIGLU_SPREAD", "2", 1), 0);
  EXPECT_THROW(run_gemm1({5}, 256, 256, 95, Activation{}, true, false, 8), Error);
  unsetenv("MEGAMOE_SWIGLU_SPREAD");
}

// ---- two-pass GEMM 1 (kernels/swiglu_quant.h): plain grouped GEMM -> BF16 gate/up -> swiglu_quant_fp8 ----------
// Inputs whose GEMM-1 gate / up values are exact in BF16 (8 significant bits): activations in {-1, 0, 1} with at
// most 100 non-zeros per row, weights in {-2..2}, and power-of-two scales that are constant along K (per row for
// A, per 128-row block for W), so every gate / up is 2^(e_row + f_block) times an integer of magnitude <= 200.
Problem make_bf16_exact_problem(const std::vector<int>& counts, int n, int k, uint64_t seed) {
  Problem p = make_problem(counts, n, k, seed, true);  // shapes, offsets, padding; values replaced below
  std::mt19937_64 rng(seed ^ 0x5eed);
  std::uniform_int_distribution<int> a_value(-1, 1), w_value(-2, 2), a_exponent(-3, 1), w_exponent(-2, 1);
  std::bernoulli_distribution nonzero(1.0 / 6);
  uint8_t code_of[5];
  for (int v = -2; v <= 2; ++v) code_of[v + 2] = e4m3_encode(v);
  for (int64_t r = 0; r < p.capacity; ++r) {
    int nonzeros = 0;
    for (int c = 0; c < k; ++c) {
      int v = nonzero(rng) ? a_value(rng) : 0;
      if (v != 0 && ++nonzeros > 100) v = 0;
      p.a[r * k + c] = code_of[v + 2];
    }
    const float scale = std::ldexp(1.0f, a_exponent(rng));
    for (int kb = 0; kb < k / 128; ++kb) p.a_scales[r * (k / 128) + kb] = scale;
  }
  for (auto& x : p.w) x = code_of[w_value(rng) + 2];
  for (int64_t block = 0; block < static_cast<int64_t>(p.experts) * (n / 128); ++block) {
    const float scale = std::ldexp(1.0f, w_exponent(rng));
    for (int kb = 0; kb < k / 128; ++kb) p.w_scales[block * (k / 128) + kb] = scale;
  }
  return p;
}

// Packs every expert's canonical W13 of `p` with `role` (pack_expert_weights).
std::pair<std::vector<uint8_t>, std::vector<float>> pack_w13(const Problem& p, int hidden, int intermediate,
                                                              kernels::GemmRole role) {
  const auto size = kernels::packed_weight_bytes(WeightFormat::kFp8Block, 2 * intermediate, hidden);
  std::vector<uint8_t> packed(size.data_bytes * p.experts);
  std::vector<float> scales(size.scale_count * p.experts);
  for (int e = 0; e < p.experts; ++e) {
    formats::QuantizedMatrix m;
    m.format = WeightFormat::kFp8Block;
    m.rows = 2 * intermediate;
    m.cols = hidden;
    m.data.assign(p.w.begin() + e * size.data_bytes, p.w.begin() + (e + 1) * size.data_bytes);
    m.block_scales.assign(p.w_scales.begin() + e * size.scale_count, p.w_scales.begin() + (e + 1) * size.scale_count);
    kernels::pack_expert_weights(m, role, packed.data() + e * size.data_bytes, scales.data() + e * size.scale_count);
  }
  return {std::move(packed), std::move(scales)};
}

struct Gemm1Outputs {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<uint16_t> gate_up;  // two-pass only: the plain GEMM's BF16 output
};

// GEMM 1 of `p` (canonical W13 [E, 2I, hidden]) fused (`two_pass` false; kGateUp or v9 weights) or in two passes
// (kGateUp weights), outputs poisoned first.
Gemm1Outputs run_gemm1_variant(const Problem& p, int hidden, int intermediate, const Activation& act,
                               const std::vector<float>* topk, int rows_hint, bool two_pass,
                               kernels::GemmRole packing = kernels::GemmRole::kGateUp) {
  const auto [packed, packed_scales] = pack_w13(p, hidden, intermediate, packing);
  std::vector<float> no_topk;
  DeviceBuffer a(p.a), a_scales(p.a_scales), w(packed), w_scales(packed_scales), offsets(p.offsets),
      topk_d(topk ? *topk : no_topk);
  DeviceBuffer out(p.capacity * intermediate), out_scales(p.capacity * (intermediate / 128) * sizeof(float));
  DeviceBuffer gate_up(p.capacity * 2 * intermediate * sizeof(uint16_t));
  poison_device_buffer(out.data, out.bytes);
  poison_device_buffer(out_scales.data, out_scales.bytes);
  poison_device_buffer(gate_up.data, gate_up.bytes);
  kernels::GroupedGemm1Fp8Args args = gemm1_args(p, hidden, intermediate, a, a_scales, w, w_scales, offsets,
                                                 topk ? &topk_d : nullptr, out, out_scales, act, rows_hint);
  args.packing = packing;
  if (two_pass)
    kernels::grouped_gemm1_fp8_two_pass(args, gate_up.as<uint16_t>(), nullptr);
  else
    kernels::grouped_gemm1_fp8(args, nullptr);
  MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
  Gemm1Outputs result{out.download<uint8_t>(), out_scales.download<float>(), {}};
  if (two_pass) result.gate_up = gate_up.download<uint16_t>();
  return result;
}

// (b) Exact in BF16: the two-pass outputs must equal the fused kernel's (split-N and v9) bit for bit, rows of no
// expert stay poisoned in both, and the plain GEMM's BF16 gate/up equal the fp64 values (the premise; checked).
void run_two_pass_exact(const std::vector<int>& counts, int hidden, int intermediate, uint64_t seed,
                        const Activation& act, bool use_topk, int rows_hint) {
  const Problem p = make_bf16_exact_problem(counts, 2 * intermediate, hidden, seed);
  SCOPED_TRACE(describe(p, seed) + " two-pass exact, hint " + std::to_string(rows_hint) + " " +
               std::string(activation_name(act.kind)) + " topk " + std::to_string(use_topk));
  std::vector<float> topk(p.capacity);
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  for (auto& t : topk) t = weight(rng);
  const std::vector<float>* topk_ptr = use_topk ? &topk : nullptr;
  const Gemm1Outputs two = run_gemm1_variant(p, hidden, intermediate, act, topk_ptr, rows_hint, true);
  const ReferenceGrid grid = reference_grid(p, 2 * intermediate);
  int64_t not_bf16 = 0, wrong_gate_up = 0;
  for (int64_t r = 0; r < p.capacity; ++r) {
    if (expert_of_row(p, r) < 0) continue;
    for (int c = 0; c < 2 * intermediate; ++c) {
      const double value = grid.at(r, c);
      const uint16_t bits = bf16_round(static_cast<float>(value));
      if (static_cast<double>(bf16_decode(bits)) != value) ++not_bf16;
      // canonical row c (gate c < I, up c - I) sits at packed column 256 (c' / 128) + 128 [up] + c' % 128
      const int j = c % intermediate;
      const int packed = (j / 128) * 256 + (c >= intermediate ? 128 : 0) + j % 128;
      // by value (a zero may come out as -0; the fused kernel's accumulator is the same FP32 value then)
      if (bf16_decode(two.gate_up[r * 2 * intermediate + packed]) != bf16_decode(bits) && wrong_gate_up++ < 5)
        ADD_FAILURE() << "gate_up[" << r << ", " << packed << "] = 0x" << std::hex
                      << two.gate_up[r * 2 * intermediate + packed] << " expected 0x" << bits << std::dec;
    }
  }
  ASSERT_EQ(not_bf16, 0) << "the exact-input generator must give gate / up values exact in BF16";
  EXPECT_EQ(wrong_gate_up, 0);
  for (const kernels::GemmRole packing : {kernels::GemmRole::kGateUp, kernels::GemmRole::kGateUpInterleaved8}) {
    const Gemm1Outputs fused = run_gemm1_variant(p, hidden, intermediate, act, topk_ptr, rows_hint, false, packing);
    int64_t code_diffs = 0;
    for (size_t i = 0; i < fused.codes.size(); ++i)
      if (fused.codes[i] != two.codes[i] && code_diffs++ < 5)
        ADD_FAILURE() << "code [" << i / intermediate << ", " << i % intermediate << "]: two-pass 0x" << std::hex
                      << int{two.codes[i]} << ", fused 0x" << int{fused.codes[i]} << std::dec
                      << (packing == kernels::GemmRole::kGateUp ? " (split-N)" : " (v9)");
    EXPECT_EQ(code_diffs, 0);
    EXPECT_EQ(std::memcmp(fused.scales.data(), two.scales.data(), two.scales.size() * sizeof(float)), 0)
        << "two-pass and fused scales differ" << (packing == kernels::GemmRole::kGateUp ? " (split-N)" : " (v9)");
    std::printf("gemm1 two-pass vs fused (%s), exact in BF16: %lld / %zu codes differ\n",
                packing == kernels::GemmRole::kGateUp ? "split-N" : "v9", static_cast<long long>(code_diffs),
                two.codes.size());
  }
}

// (c) Random inputs: the two-pass outputs against the fp64 reference with run_gemm1's tolerance model, plus the
// BF16 rounding of gate / up (relative <= 2^-8 of the FP32 value) propagated through the activation; rows of no
// expert stay poisoned. The differences from the fused kernel are counted (not asserted).
void run_two_pass_random(const std::vector<int>& counts, int hidden, int intermediate, uint64_t seed,
                         const Activation& act, bool use_topk, int rows_hint) {
  Problem p = make_problem(counts, 2 * intermediate, hidden, seed, false);
  if (act.kind == Activation::Kind::kSwigluClamped)
    for (auto& s : p.a_scales) s *= 6.0f;  // make the clamp bite (as run_gemm1)
  SCOPED_TRACE(describe(p, seed) + " two-pass random, hint " + std::to_string(rows_hint) + " " +
               std::string(activation_name(act.kind)) + " topk " + std::to_string(use_topk));
  std::vector<float> topk(p.capacity);
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  for (auto& t : topk) t = weight(rng);
  const std::vector<float>* topk_ptr = use_topk ? &topk : nullptr;
  const Gemm1Outputs two = run_gemm1_variant(p, hidden, intermediate, act, topk_ptr, rows_hint, true);
  const Gemm1Outputs fused = run_gemm1_variant(p, hidden, intermediate, act, topk_ptr, rows_hint, false);
  const std::vector<uint8_t>& q = two.codes;
  const std::vector<float>& scales = two.scales;
  const int groups = intermediate / 128;
  const ReferenceGrid grid = reference_grid(p, 2 * intermediate);
  double error_sq = 0, ref_sq = 0;
  int64_t bad = 0, flips = 0, values = 0;
  std::vector<double> h(128), h_error(128);
  const double alpha = act.kind == Activation::Kind::kSiluMul ? 1.0 : act.alpha;
  for (int64_t r = 0; r < p.capacity; ++r) {
    const int e = expert_of_row(p, r);
    for (int g = 0; g < groups; ++g) {
      const float got_scale = scales[r * groups + g];
      if (e < 0) {
        uint32_t bits;
        std::memcpy(&bits, &got_scale, 4);
        if (bits != 0xFFFFFFFFu && bad++ < 5) ADD_FAILURE() << "scale of row " << r << " (no expert) written";
        for (int i = 0; i < 128; ++i)
          if (q[r * intermediate + g * 128 + i] != 0xFF && bad++ < 5) ADD_FAILURE() << "row " << r << " written";
        continue;
      }
      double amax = 0, max_error = 0;
      const double weight = use_topk ? topk[r] : 1.0;
      for (int i = 0; i < 128; ++i) {
        const int c = g * 128 + i;
        const double gate = grid.at(r, c), up = grid.at(r, intermediate + c);
        // accumulation error (run_gemm1's 2^-12 of the sum of |terms|), then BF16 rounding of the FP32 value
        const double gate_acc = std::ldexp(grid.magnitude_at(r, c), -12);
        const double up_acc = std::ldexp(grid.magnitude_at(r, intermediate + c), -12);
        const double gate_error = gate_acc + std::ldexp(std::fabs(gate) + gate_acc, -8);
        const double up_error = up_acc + std::ldexp(std::fabs(up) + up_acc, -8);
        h[i] = activate(gate, up, act) * weight;
        h_error[i] = weight * ((1.0 + alpha * (std::fabs(gate) + gate_error) / 4) * (std::fabs(up) + up_error + 1.0) *
                                   gate_error +
                               (std::fabs(gate) + gate_error) * up_error);
        amax = std::max(amax, std::fabs(h[i]));
        max_error = std::max(max_error, h_error[i]);
      }
      const float ref_scale = std::max(static_cast<float>(amax), 1e-10f) / 448.0f;
      // |amax(got) - amax(ref)| <= max_i |h_i(got) - h_i(ref)|
      if (!(std::fabs(got_scale - ref_scale) <= max_error / 448.0 * (1 + 1e-6) + 1e-6 * ref_scale) && bad++ < 5)
        ADD_FAILURE() << "scale[" << r << ", " << g << "] = " << got_scale << " ref " << ref_scale << " bound "
                      << max_error / 448.0;
      for (int i = 0; i < 128; ++i) {
        const uint8_t code = q[r * intermediate + g * 128 + i];
        const double got = e4m3_decode(code);
        const double x = h[i] / got_scale;
        ++values;
        if (!std::isfinite(got)) {
          if (bad++ < 5) ADD_FAILURE() << "NaN code at [" << r << ", " << g * 128 + i << "]";
          continue;
        }
        const double bound = 0.5 * e4m3_ulp(std::fabs(x)) * (1 + 1e-6) + h_error[i] / got_scale + 1e-6 * std::fabs(x);
        if (std::fabs(got - x) > bound && bad++ < 5)
          ADD_FAILURE() << "q[" << r << ", " << g * 128 + i << "] = " << got << " want ~" << x << " bound " << bound;
        const uint8_t ref_code = e4m3_encode(h[i] / ref_scale);
        if (ref_code != code) ++flips;
        const double ref_value = e4m3_decode(ref_code) * static_cast<double>(ref_scale);
        const double diff = got * got_scale - ref_value;
        error_sq += diff * diff;
        ref_sq += ref_value * ref_value;
      }
    }
  }
  EXPECT_EQ(bad, 0);
  const double rel_l2 = std::sqrt(error_sq / ref_sq);
  int64_t vs_fused = 0, scales_vs_fused = 0;
  for (size_t i = 0; i < q.size(); ++i) vs_fused += q[i] != fused.codes[i];
  for (size_t i = 0; i < scales.size(); ++i)
    scales_vs_fused += std::memcmp(&scales[i], &fused.scales[i], sizeof(float)) != 0;
  std::printf("gemm1 two-pass %s topk=%d hint=%d: rel-L2 vs fp64-then-quantized %.3g, code flips %lld / %lld; vs fused: "
              "%lld codes, %lld scales differ\n",
              std::string(activation_name(act.kind)).c_str(), use_topk, rows_hint, rel_l2, static_cast<long long>(flips),
              static_cast<long long>(values), static_cast<long long>(vs_fused), static_cast<long long>(scales_vs_fused));
  // BF16 rounding of gate / up moves ~3% of the codes by one E4M3 ulp against the fp64 reference (a numpy model of
  // SiLU-mul on normal inputs: rel-L2 1.4e-2 from BF16 alone; the fused kernel's is a few 1e-3).
  EXPECT_LT(rel_l2, 3e-2);
}

TEST(GroupedGemmFp8, Gemm1TwoPassExactMatchesFused) {
  MEGAMOE_REQUIRE_GPUS(1);
  const Activation clamped{Activation::Kind::kSwigluClamped, 7.0f, 1.702f};
  run_two_pass_exact({0, 1, 70, 63, 130, 129}, 512, 384, 141, Activation{}, true, 0);
  run_two_pass_exact({0, 1, 70, 63, 130, 129}, 512, 384, 142, Activation{}, false, 8);
  run_two_pass_exact({64, 1, 0, 257, 5}, 384, 256, 143, clamped, true, 16);
  run_two_pass_exact({64, 1, 0, 257, 5}, 384, 256, 144, clamped, false, 200);
  run_two_pass_exact({33, 0, 80}, 7168, 256, 145, Activation{}, true, 0);  // deep hidden (the sums stay <= 200)
}

TEST(GroupedGemmFp8, Gemm1TwoPassRandomWithinTolerance) {
  MEGAMOE_REQUIRE_GPUS(1);
  const Activation clamped{Activation::Kind::kSwigluClamped, 7.0f, 1.702f};
  run_two_pass_random({0, 1, 70, 63, 65, 130}, 512, 256, 151, Activation{}, true, 0);
  run_two_pass_random({0, 1, 70, 63, 65, 130}, 512, 256, 152, Activation{}, false, 16);
  run_two_pass_random({5, 0, 129, 1}, 384, 384, 153, clamped, false, 0);
  run_two_pass_random({5, 0, 129, 1}, 384, 384, 154, clamped, true, 8);
  run_two_pass_random({33, 0, 80}, 7168, 256, 155, Activation{}, true, 0);
}

// Runs without a GPU: the GEMM-1 packing is checked before any CUDA call.
TEST(GroupedGemmFp8, RejectsBadGemm1Packing) {
  alignas(16) static uint8_t fake[64];
  kernels::GroupedGemm1Fp8Args args;
  args.a = args.weights = args.out = fake;
  args.a_scales = args.weight_scales = args.out_scales = reinterpret_cast<float*>(fake);
  args.expert_offsets = reinterpret_cast<const int32_t*>(fake);
  args.m_capacity = 16;
  args.num_experts = 1;
  args.hidden = args.intermediate = 128;
  args.schedule = Fp8GemmSchedule::kSerial;
  args.packing = kernels::GemmRole::kDown;
  try {
    kernels::grouped_gemm1_fp8(args, nullptr);
    ADD_FAILURE() << "packing kDown accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("packing = 1"), std::string::npos) << error.what();
  }
  args.packing = kernels::GemmRole::kGateUpInterleaved8;
  args.schedule = Fp8GemmSchedule::kOverlap;
  try {
    kernels::grouped_gemm1_fp8(args, nullptr);
    ADD_FAILURE() << "v9 with the overlap schedule accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("schedule overlap is not available"), std::string::npos) << error.what();
  }
  args.schedule = Fp8GemmSchedule::kSerial;
  args.v9_skew_kblocks = 5;
  try {
    kernels::grouped_gemm1_fp8(args, nullptr);
    ADD_FAILURE() << "v9 skew 5 accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("v9_skew_kblocks (or MEGAMOE_FP8_GEMM1_V9_SKEW) = 5"), std::string::npos)
        << error.what();
  }
  args.schedule = Fp8GemmSchedule::kPingPong;
  args.v9_skew_kblocks = 2;
  try {
    kernels::grouped_gemm1_fp8(args, nullptr);
    ADD_FAILURE() << "v9 skew with pingpong accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("needs the serial schedule"), std::string::npos) << error.what();
  }
  args.schedule = Fp8GemmSchedule::kSerial;
  args.v9_skew_kblocks = 0;
  args.v11 = 2;  // v11 GEMM 1: -1, 0 or 1
  try {
    kernels::grouped_gemm1_fp8(args, nullptr);
    ADD_FAILURE() << "GEMM-1 v11 = 2 accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("GroupedGemm1Fp8Args::v11 = 2"), std::string::npos) << error.what();
  }
  args.v11 = 1;
  args.v11_small = 2;  // v11 GEMM 1 small: -1, 0 or 1
  try {
    kernels::grouped_gemm1_fp8(args, nullptr);
    ADD_FAILURE() << "GEMM-1 v11_small = 2 accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("GroupedGemm1Fp8Args::v11_small = 2"), std::string::npos)
        << error.what();
  }
}

// v5 schedules (docs/grouped_gemm.md): every tile config under kPingPong and kOverlap against the
// references above (bit-exact for exactly representable inputs); kPingPong also bit-identical to
// kSerial on the same inputs (run_plain / run_gemm1 check that).
TEST(GroupedGemmFp8, ScheduleVariantsPlainAllTiles) {
  MEGAMOE_REQUIRE_GPUS(1);
  for (const Fp8GemmSchedule schedule : {Fp8GemmSchedule::kPingPong, Fp8GemmSchedule::kOverlap}) {
    const uint64_t seed = schedule == Fp8GemmSchedule::kPingPong ? 4000 : 5000;
    run_plain({0, 1, 130, 63, 200, 64, 129}, 384, 512, seed + 1, 0, false, schedule);    // 256 x 128 tiles
    run_plain({0, 1, 130, 63, 200, 64, 129}, 384, 512, seed + 2, 200, false, schedule);  // 128 x 128 tiles
    run_plain({8, 0, 1, 17, 64, 33}, 512, 384, seed + 3, 16, false, schedule);           //  64 x 256 tiles
    run_plain({100, 0, 129}, 256, 7168, seed + 4, 0, false, schedule);                   // deep K
    run_plain({3, 0, 128, 77}, 256, 1024, seed + 5, 0, true, schedule);                  // bit-exact vs fp64
    run_plain({3, 0, 128, 77}, 256, 1024, seed + 6, 8, true, schedule);
    run_plain({3, 0, 128, 77}, 256, 1024, seed + 7, 128, true, schedule);
  }
}

TEST(GroupedGemmFp8, ScheduleVariantsGemm1AllTiles) {
  MEGAMOE_REQUIRE_GPUS(1);
  const Activation clamped{Activation::Kind::kSwigluClamped, 7.0f, 1.702f};
  for (const Fp8GemmSchedule schedule : {Fp8GemmSchedule::kPingPong, Fp8GemmSchedule::kOverlap}) {
    const uint64_t seed = schedule == Fp8GemmSchedule::kPingPong ? 4100 : 5100;
    run_gemm1({0, 1, 70, 63, 65, 130}, 512, 256, seed + 1, Activation{}, true, false, 0, schedule);   // 128 x 256
    run_gemm1({0, 1, 70, 63, 65, 130}, 512, 256, seed + 2, Activation{}, true, false, 16, schedule);  //  64 x 256
    run_gemm1({0, 1, 70, 63, 130}, 512, 256, seed + 3, Activation{}, true, true, 0, schedule);        // exact
    run_gemm1({0, 1, 70, 63, 130}, 512, 256, seed + 4, Activation{}, true, true, 8, schedule);
    run_gemm1({33, 0, 80}, 7168, 256, seed + 5, Activation{}, true, false, 0, schedule);              // deep hidden
    run_gemm1({5, 0, 129, 1}, 384, 384, seed + 6, clamped, false, false, 0, schedule);
  }
}

// Runs without a GPU: the schedule is resolved (and rejected) before any CUDA call.
TEST(GroupedGemmFp8, RejectsBadSchedule) {
  alignas(16) static uint8_t fake[64];
  kernels::GroupedGemmFp8Args args;
  args.a = args.weights = fake;
  args.a_scales = args.weight_scales = reinterpret_cast<const float*>(fake);
  args.expert_offsets = reinterpret_cast<const int32_t*>(fake);
  args.out = reinterpret_cast<uint16_t*>(fake);
  args.m_capacity = 16;
  args.num_experts = 1;
  args.n = args.k = 128;
  args.schedule = static_cast<Fp8GemmSchedule>(9);
  try {
    kernels::grouped_gemm_fp8_bf16out(args, nullptr);
    FAIL() << "schedule 9 accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("schedule = 9"), std::string::npos) << error.what();
  }
  args.schedule = Fp8GemmSchedule::kAuto;
  ASSERT_EQ(setenv("MEGAMOE_FP8_GEMM_SCHEDULE", "fastest", 1), 0);
  try {
    kernels::grouped_gemm_fp8_bf16out(args, nullptr);
    ADD_FAILURE() << "MEGAMOE_FP8_GEMM_SCHEDULE=fastest accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("MEGAMOE_FP8_GEMM_SCHEDULE = 'fastest'"), std::string::npos)
        << error.what();
  }
  unsetenv("MEGAMOE_FP8_GEMM_SCHEDULE");
}

TEST(GroupedGemmFp8, RejectsBadShapes) {
  kernels::GroupedGemm2Fp8Args args;
  args.m_capacity = 16;
  args.num_experts = 2;
  args.hidden = 100;
  args.intermediate = 256;
  try {
    kernels::grouped_gemm2_fp8(args, nullptr);
    FAIL() << "hidden = 100 accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("hidden = 100"), std::string::npos) << error.what();
  }
  args.hidden = 256;
  try {
    kernels::grouped_gemm2_fp8(args, nullptr);
    FAIL() << "null a accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("a must be non-null"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace megamoe
