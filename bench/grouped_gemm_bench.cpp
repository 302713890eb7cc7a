// `megamoe bench gemm`: times the FP8-block grouped GEMMs (GEMM 1 with the fused SiLU-mul + requant
// epilogue, GEMM 2 with BF16 out) over `experts` experts of `rows` rows each, and, in the same run,
// cuBLASLt dense FP8 (per-tensor scales, fast accumulation on) and cuBLAS BF16 on the same FLOPs
// (one dense [M_total, K] x [K, N] GEMM) as the ratio's denominator. With format "bf16": the BF16 x BF16
// grouped GEMMs (GEMM 1 with SiLU-mul + top-k weight to BF16), cuBLAS BF16 on the same buffers as the
// denominator (cuBLASLt FP8 is not run). With format "nvfp4" / "mxfp4": the W4A8 grouped GEMMs (same
// epilogues as FP8) on random packed FP4 weights (scale bytes in a range where the decode exponent is
// 5), vs cuBLASLt dense FP8 on the same FLOPs; weight GB/s counts FP4 bytes + group scales + block records.
// --gemm1-two-pass both (FP8): GEMM 1 also as plain grouped GEMM + swiglu_quant_fp8 (kernels/swiglu_quant.h).
// Every timed launch is preceded by a 256 MiB memset so that L2 (50 MiB) holds none of its inputs;
// the figure is the median over `repeats` launches, each timed by its own CUDA events.
#include "bench/grouped_gemm_bench.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#ifdef MEGAMOE_WITH_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "megamoe/error_cuda.h"
#include "src/kernels/grouped_gemm.h"
#include "src/kernels/swiglu_quant.h"
#endif

namespace megamoe::bench {

#ifndef MEGAMOE_WITH_CUDA
int run_gemm_bench(const GemmBenchOptions&) {
  std::fprintf(stderr, "bench gemm needs a CUDA build (MEGAMOE_ENABLE_CUDA=ON)\n");
  return 1;
}
#else
namespace {

struct ExpertShape {
  std::string name;
  int hidden, intermediate;
};

const std::vector<ExpertShape>& known_shapes() {
  static const std::vector<ExpertShape> shapes{
      {"dsv3", 7168, 2048}, {"ml3", 7168, 4096}, {"ms4", 4096, 2048}, {"dsv4-flash", 4096, 2048}, {"qwen3-30b", 2048, 768}};
  return shapes;
}

#define BENCH_CUBLAS_CHECK(call)                                                                   \
  do {                                                                                             \
    const cublasStatus_t bench_status = (call);                                                    \
    MEGAMOE_CHECK(bench_status == CUBLAS_STATUS_SUCCESS, #call, " failed with cuBLAS status ",     \
                  static_cast<int>(bench_status));                                                 \
  } while (0)

struct Device {
  void* data = nullptr;
  size_t bytes = 0;
  explicit Device(size_t size) : bytes(size) { MEGAMOE_CUDA_CHECK(cudaMalloc(&data, std::max<size_t>(size, 256))); }
  ~Device() { cudaFree(data); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
};

// Fills a device buffer by tiling a random host chunk (never zeros).
enum class Fill { kE4M3, kScale, kBf16, kBytes, kNvfp4Scale, kMxfp4Scale, kW4a8Blocks };
void fill_random(const Device& buffer, Fill kind, uint64_t seed) {
  constexpr size_t kChunk = size_t{8} << 20;
  std::vector<uint8_t> chunk(kChunk);
  std::mt19937_64 rng(seed);
  if (kind == Fill::kE4M3) {  // |value| in [2^-9, 1.875]: codes with exponent field <= 7, random sign
    for (auto& b : chunk) b = static_cast<uint8_t>((rng() & 0x3F) | (rng() & 0x80)) | 1;
  } else if (kind == Fill::kBytes) {  // FP4 codes: every byte is two valid codes
    for (auto& b : chunk) b = static_cast<uint8_t>(rng());
  } else if (kind == Fill::kNvfp4Scale) {  // E4M3 0.5 .. 2
    for (auto& b : chunk) b = static_cast<uint8_t>(0x30 + rng() % 17);
  } else if (kind == Fill::kMxfp4Scale) {  // 2^-3 .. 2^1
    for (auto& b : chunk) b = static_cast<uint8_t>(124 + rng() % 5);
  } else if (kind == Fill::kW4a8Blocks) {  // {factor, p = 5}: 6 * 2 * 2^5 = 384 <= 448
    std::uniform_real_distribution<float> scale(0.5e-2f, 1e-2f);
    auto* blocks = reinterpret_cast<kernels::W4a8BlockScale*>(chunk.data());
    for (size_t i = 0; i < kChunk / sizeof(kernels::W4a8BlockScale); ++i) blocks[i] = {scale(rng), 5};
  } else if (kind == Fill::kScale) {
    std::uniform_real_distribution<float> scale(0.5e-2f, 1e-2f);
    auto* floats = reinterpret_cast<float*>(chunk.data());
    for (size_t i = 0; i < kChunk / 4; ++i) floats[i] = scale(rng);
  } else {
    std::normal_distribution<float> normal(0.0f, 0.05f);
    auto* halves = reinterpret_cast<uint16_t*>(chunk.data());
    for (size_t i = 0; i < kChunk / 2; ++i) {
      float v = normal(rng);
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      halves[i] = static_cast<uint16_t>(bits >> 16);
    }
  }
  for (size_t offset = 0; offset < buffer.bytes; offset += kChunk)
    MEGAMOE_CUDA_CHECK(cudaMemcpy(static_cast<uint8_t*>(buffer.data) + offset, chunk.data(),
                                  std::min(kChunk, buffer.bytes - offset), cudaMemcpyHostToDevice));
}

class Timer {
 public:
  explicit Timer(int repeats) : repeats_(repeats), flush_(size_t{256} << 20) {
    MEGAMOE_CUDA_CHECK(cudaEventCreate(&start_));
    MEGAMOE_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  template <typename Launch>
  double median_us(Launch&& launch) {
    launch();  // warm-up (tensor maps, cuBLAS heuristics, lazy module load)
    MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> ms(repeats_);
    for (int i = 0; i < repeats_; ++i) {
      MEGAMOE_CUDA_CHECK(cudaMemsetAsync(flush_.data, i & 0xFF, flush_.bytes));
      MEGAMOE_CUDA_CHECK(cudaEventRecord(start_));
      launch();
      MEGAMOE_CUDA_CHECK(cudaEventRecord(stop_));
      MEGAMOE_CUDA_CHECK(cudaEventSynchronize(stop_));
      MEGAMOE_CUDA_CHECK(cudaEventElapsedTime(&ms[i], start_, stop_));
    }
    std::nth_element(ms.begin(), ms.begin() + repeats_ / 2, ms.end());
    return ms[repeats_ / 2] * 1000.0;
  }

 private:
  int repeats_;
  Device flush_;
  cudaEvent_t start_{}, stop_{};
};

// Dense D[M, N] (bf16, row-major) = X[M, K] * W[N, K]^T with FP8 E4M3 operands through cuBLASLt.
class DenseFp8 {
 public:
  DenseFp8(cublasLtHandle_t handle, int64_t m, int n, int k, void* workspace, size_t workspace_bytes)
      : handle_(handle), workspace_(workspace), workspace_bytes_(workspace_bytes) {
    BENCH_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t transpose = CUBLAS_OP_T, none = CUBLAS_OP_N;
    BENCH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)));
    BENCH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof(none)));
    const int8_t fast_accumulation = 1;
    BENCH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accumulation,
                                                      sizeof(fast_accumulation)));
    BENCH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_, CUDA_R_8F_E4M3, k, n, k));
    BENCH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_, CUDA_R_8F_E4M3, k, m, k));
    BENCH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d_, CUDA_R_16BF, n, m, n));
    cublasLtMatmulPreference_t preference;
    BENCH_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    BENCH_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &workspace_bytes_, sizeof(workspace_bytes_)));
    int found = 0;
    BENCH_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, op_, a_, b_, d_, d_, preference, 1, &heuristic_, &found));
    cublasLtMatmulPreferenceDestroy(preference);
    MEGAMOE_CHECK(found > 0, "cuBLASLt found no FP8 algorithm for M ", m, " N ", n, " K ", k);
  }
  ~DenseFp8() {
    cublasLtMatrixLayoutDestroy(a_);
    cublasLtMatrixLayoutDestroy(b_);
    cublasLtMatrixLayoutDestroy(d_);
    cublasLtMatmulDescDestroy(op_);
  }
  void run(const void* w, const void* x, void* d) const {
    const float alpha = 1.0f, beta = 0.0f;
    BENCH_CUBLAS_CHECK(cublasLtMatmul(handle_, op_, &alpha, w, a_, x, b_, &beta, d, d_, d, d_, &heuristic_.algo,
                                      workspace_, workspace_bytes_, nullptr));
  }

 private:
  cublasLtHandle_t handle_;
  void* workspace_;
  size_t workspace_bytes_;
  cublasLtMatmulDesc_t op_{};
  cublasLtMatrixLayout_t a_{}, b_{}, d_{};
  cublasLtMatmulHeuristicResult_t heuristic_{};
};

struct Point {
  std::string model, gemm;
  int rows = 0, experts = 0;
  int64_t n = 0, k = 0;
  bool bf16 = false;
  int fp4_group = 0;  // W4A8: 16 (nvfp4) or 32 (mxfp4); 0 = FP8 / BF16
  double us = 0, cublas_fp8_us = 0, cublas_bf16_us = 0;
  std::string schedule;  // FP8: the schedule of `us`
  // --schedule all: the FP8 kernel under the other schedules, timed right after `us` (serial).
  std::vector<std::pair<std::string, double>> schedule_us;
  double swiglu_us = 0, swiglu_bytes = 0;  // --gemm1-two-pass both: pass 2 alone and the bytes it moves
  int rows_min = 0, rows_max = 0, tails_le64 = 0;  // --rows-spread multinomial: the drawn counts
  double flops() const { return 2.0 * rows * experts * n * k; }
  double weight_bytes() const {
    const double per_element = bf16              ? 2.0
                               : fp4_group > 0 ? 0.5 + 1.0 / fp4_group + 8.0 / (128.0 * 128.0)
                                               : 1.0 + 4.0 / (128.0 * 128.0);
    return static_cast<double>(experts) * n * k * per_element;
  }
  double denominator_us() const { return bf16 ? cublas_bf16_us : cublas_fp8_us; }
};

}  // namespace

int run_gemm_bench(const GemmBenchOptions& options) {
  MEGAMOE_CHECK(options.experts >= 1 && options.experts <= 1024, "--experts = ", options.experts, " must be in [1, 1024]");
  MEGAMOE_CHECK(options.repeats >= 1, "--repeats must be >= 1");
  MEGAMOE_CHECK(options.format == "fp8" || options.format == "bf16" || options.format == "nvfp4" ||
                    options.format == "mxfp4",
                "--format = '", options.format, "' must be fp8, bf16, nvfp4 or mxfp4");
  MEGAMOE_CHECK(options.schedule == "auto" || options.schedule == "serial" || options.schedule == "pingpong" ||
                    options.schedule == "overlap" || options.schedule == "all",
                "--schedule = '", options.schedule, "' must be auto, serial, pingpong, overlap or all");
  const bool all_schedules = options.schedule == "all";
  MEGAMOE_CHECK(options.fp8_v11 == "auto" || options.fp8_v11 == "off" || options.fp8_v11 == "on" ||
                    options.fp8_v11 == "both",
                "--fp8-v11 = '", options.fp8_v11, "' must be auto, off, on or both");
  MEGAMOE_CHECK(options.v11_bn == 0 || options.v11_bn == 128 || options.v11_bn == 192, "--v11-bn = ", options.v11_bn,
                " must be 0, 128 or 192");
  const int fp8_main_v11 = options.fp8_v11 == "on" ? 1 : options.fp8_v11 == "auto" ? -1 : 0;
  MEGAMOE_CHECK(options.gemm1_v9 == "off" || options.gemm1_v9 == "on" || options.gemm1_v9 == "both",
                "--gemm1-v9 = '", options.gemm1_v9, "' must be off, on or both");
  MEGAMOE_CHECK(!options.v9_skews.empty(), "--v9-skews needs at least one value");
  MEGAMOE_CHECK(options.gemm1_v11 == "off" || options.gemm1_v11 == "on" || options.gemm1_v11 == "both",
                "--gemm1-v11 = '", options.gemm1_v11, "' must be off, on or both");
  MEGAMOE_CHECK(options.gemm1_v11 != "on" || options.gemm1_v9 == "on",
                "--gemm1-v11 on needs --gemm1-v9 on (v11 GEMM 1 runs on the interleaved weights); or use both");
  MEGAMOE_CHECK(options.gemm1_v11_small == "off" || options.gemm1_v11_small == "on" || options.gemm1_v11_small == "both",
                "--gemm1-v11-small = '", options.gemm1_v11_small, "' must be off, on or both");
  MEGAMOE_CHECK(options.gemm1_v11_small == "off" || options.gemm1_v11 != "off",
                "--gemm1-v11-small on / both needs --gemm1-v11 on or both");
  const int gemm1_v11_small = options.gemm1_v11_small == "on" ? 1 : 0;
  MEGAMOE_CHECK(options.rows_spread == "none" || options.rows_spread == "multinomial", "--rows-spread = '",
                options.rows_spread, "' must be none or multinomial");
  const bool spread = options.rows_spread == "multinomial";
  MEGAMOE_CHECK(options.gemm1_two_pass == "off" || options.gemm1_two_pass == "both", "--gemm1-two-pass = '",
                options.gemm1_two_pass, "' must be off or both");
  const bool two_pass = options.gemm1_two_pass == "both" && options.format == "fp8";
  const kernels::GemmRole gemm1_packing =
      options.gemm1_v9 == "on" ? kernels::GemmRole::kGateUpInterleaved8 : kernels::GemmRole::kGateUp;
  const kernels::Fp8GemmSchedule schedule = options.schedule == "pingpong"  ? kernels::Fp8GemmSchedule::kPingPong
                                            : options.schedule == "overlap" ? kernels::Fp8GemmSchedule::kOverlap
                                            : options.schedule == "auto"    ? kernels::Fp8GemmSchedule::kAuto
                                                                           : kernels::Fp8GemmSchedule::kSerial;
  const std::pair<const char*, kernels::Fp8GemmSchedule> other_schedules[] = {
      {"pingpong", kernels::Fp8GemmSchedule::kPingPong}, {"overlap", kernels::Fp8GemmSchedule::kOverlap}};
  const bool bf16 = options.format == "bf16";
  MEGAMOE_CHECK(options.bf16_v2 == "auto" || options.bf16_v2 == "off" || options.bf16_v2 == "on" ||
                    options.bf16_v2 == "both",
                "--bf16-v2 = '", options.bf16_v2, "' must be auto, off, on or both");
  // BF16 main column: v2 = -1 / 0 / 1 (GEMM 2) and the GEMM-1 packing that goes with it.
  const int bf16_main_v2 = options.bf16_v2 == "on" ? 1 : options.bf16_v2 == "auto" ? -1 : 0;
  const bool bf16_main_interleaved = bf16_main_v2 == 1 || (bf16_main_v2 == -1 && bf16 && kernels::bf16_gemm_v2_default());
  const int fp4_group = options.format == "nvfp4" ? 16 : options.format == "mxfp4" ? 32 : 0;
  const WeightFormat w4a8_format = fp4_group == 16 ? WeightFormat::kNvfp4 : WeightFormat::kMxfp4;
  const int max_rows = *std::max_element(options.rows_per_expert.begin(), options.rows_per_expert.end());
  cublasLtHandle_t lt;
  cublasHandle_t blas;
  BENCH_CUBLAS_CHECK(cublasLtCreate(&lt));
  BENCH_CUBLAS_CHECK(cublasCreate(&blas));
  const size_t workspace_bytes = size_t{64} << 20;
  Device workspace(workspace_bytes);
  BENCH_CUBLAS_CHECK(cublasSetWorkspace(blas, workspace.data, workspace_bytes));
  Timer timer(options.repeats);
  std::vector<Point> points;
  std::printf("%-10s %5s %5s | %9s %8s %8s | %9s %8s %6s | %8s\n", "model", "rows", "gemm", "ours_us", "TFLOP/s",
              "wGB/s", bf16 ? "cuBLASbf16" : "cublas_us", "TFLOP/s", "ratio", "bf16TF/s");
  for (const std::string& model : options.models) {
    const auto found = std::find_if(known_shapes().begin(), known_shapes().end(),
                                    [&](const ExpertShape& s) { return s.name == model; });
    MEGAMOE_CHECK(found != known_shapes().end(), "--models: unknown model '", model, "'");
    const int64_t E = options.experts, H = found->hidden, I = found->intermediate;
    const int64_t max_m = static_cast<int64_t>(max_rows) * E;
    const int64_t element_bytes = bf16 ? 2 : 1;
    const Fill operand_fill = bf16 ? Fill::kBf16 : Fill::kE4M3;
    // W4A8: w13 / w2 hold the packed FP4 codes (half the bytes), *_scales the group scales, *_blocks
    // the block records; cuBLAS reads the FP8 dense_w8 instead.
    const int64_t weight_bytes_13 = fp4_group ? E * 2 * I * H / 2 : E * 2 * I * H * element_bytes;
    const int64_t weight_bytes_2 = fp4_group ? E * H * I / 2 : E * H * I * element_bytes;
    const int64_t scale_bytes_13 = fp4_group ? E * 2 * I * H / fp4_group : E * (2 * I / 128) * (H / 128) * 4;
    const int64_t scale_bytes_2 = fp4_group ? E * H * I / fp4_group : E * (H / 128) * (I / 128) * 4;
    Device w13(weight_bytes_13), w13_scales(scale_bytes_13), w2(weight_bytes_2), w2_scales(scale_bytes_2);
    const int64_t block_records = fp4_group ? E * (2 * I / 128) * (H / 128) + E * (H / 128) * (I / 128) : 1;
    Device w4a8_blocks(block_records * sizeof(kernels::W4a8BlockScale));
    Device dense_w8(fp4_group ? std::max(2 * I * H, H * I) : 1);
    Device x(max_m * H * element_bytes), x_scales(max_m * (H / 128) * 4), topk(max_m * 4);
    Device h(max_m * I * element_bytes), h_scales(max_m * (I / 128) * 4), out(max_m * H * 2);
    Device gate_up(two_pass ? max_m * 2 * I * 2 : 16);  // the two-pass GEMM 1's BF16 intermediate
    // FP8 mode: separate bf16 operands for the cuBLAS BF16 column; bf16 mode: cuBLAS reads w/x directly.
    const int64_t max_k = bf16 ? 1 : H, max_n = bf16 ? 1 : std::max(2 * I, H);
    Device dense_x_bf16(max_m * max_k * 2), dense_w_bf16(max_n * max_k * 2), dense_out(max_m * std::max(2 * I, H) * 2);
    fill_random(w13, fp4_group ? Fill::kBytes : operand_fill, 1);
    fill_random(w2, fp4_group ? Fill::kBytes : operand_fill, 2);
    fill_random(x, operand_fill, 3);
    fill_random(h, operand_fill, 4);
    const Fill weight_scale_fill = fp4_group == 16 ? Fill::kNvfp4Scale : fp4_group == 32 ? Fill::kMxfp4Scale : Fill::kScale;
    fill_random(w13_scales, weight_scale_fill, 5);
    fill_random(w2_scales, weight_scale_fill, 6);
    if (fp4_group) {
      fill_random(w4a8_blocks, Fill::kW4a8Blocks, 12);
      fill_random(dense_w8, Fill::kE4M3, 13);
    }
    kernels::W4a8Weights w4a8_13, w4a8_2;
    w4a8_13.format = w4a8_2.format = w4a8_format;
    w4a8_13.data = w13.as<uint8_t>();
    w4a8_13.group_scales = w13_scales.as<uint8_t>();
    w4a8_13.blocks = w4a8_blocks.as<kernels::W4a8BlockScale>();
    // W13's packing as a loader would choose it (MEGAMOE_W4A8_G1_V10: kGateUpInterleaved8 -> W4A8 v10 GEMM 1); the
    // bytes are random, so only the kernel choice follows from it.
    w4a8_13.packing = kernels::w4a8_gemm1_packing();
    w4a8_2.data = w2.as<uint8_t>();
    w4a8_2.group_scales = w2_scales.as<uint8_t>();
    w4a8_2.blocks = w4a8_13.blocks + E * (2 * I / 128) * (H / 128);
    w4a8_2.packing = kernels::GemmRole::kDown;
    fill_random(x_scales, Fill::kScale, 7);
    fill_random(h_scales, Fill::kScale, 8);
    fill_random(topk, Fill::kScale, 9);
    fill_random(dense_x_bf16, Fill::kBf16, 10);
    fill_random(dense_w_bf16, Fill::kBf16, 11);
    if (two_pass) fill_random(gate_up, Fill::kBf16, 14);  // pass 2 alone reads it (values only matter for NaNs)
    for (int rows : options.rows_per_expert) {
      std::vector<int32_t> host_offsets(E + 1);
      for (int64_t e = 0; e <= E; ++e) host_offsets[e] = static_cast<int32_t>(e * rows);
      int rows_min = rows, rows_max = rows, tails_le64 = 0;
      if (spread) {  // rows x E rows, each to a uniformly drawn expert (multinomial counts; same total)
        std::vector<int32_t> counts(E, 0);
        std::mt19937_64 rng(options.spread_seed);
        std::uniform_int_distribution<int64_t> pick(0, E - 1);
        for (int64_t i = 0; i < static_cast<int64_t>(rows) * E; ++i) ++counts[pick(rng)];
        rows_min = *std::min_element(counts.begin(), counts.end());
        rows_max = *std::max_element(counts.begin(), counts.end());
        for (int64_t e = 0; e < E; ++e) {
          host_offsets[e + 1] = host_offsets[e] + counts[e];
          if (counts[e] % 128 != 0 && counts[e] % 128 <= 64) ++tails_le64;
        }
        std::printf("%-10s %5d rows spread multinomial (seed %llu): %lld experts, %d..%d rows, %d end in a tile of "
                    "<= 64 rows\n", model.c_str(), rows, static_cast<unsigned long long>(options.spread_seed),
                    static_cast<long long>(E), rows_min, rows_max, tails_le64);
      }
      Device offsets(host_offsets.size() * 4);
      MEGAMOE_CUDA_CHECK(cudaMemcpy(offsets.data, host_offsets.data(), offsets.bytes, cudaMemcpyHostToDevice));
      const int64_t m = static_cast<int64_t>(rows) * E;
      for (int which = 1; which <= 2; ++which) {
        if (std::find(options.gemms.begin(), options.gemms.end(), which) == options.gemms.end()) continue;
        Point p;
        p.model = model;
        p.gemm = which == 1 ? "gemm1" : "gemm2";
        p.rows = rows;
        p.experts = static_cast<int>(E);
        p.n = which == 1 ? 2 * I : H;
        p.k = which == 1 ? H : I;
        p.bf16 = bf16;
        p.fp4_group = fp4_group;
        p.rows_min = rows_min;
        p.rows_max = rows_max;
        p.tails_le64 = tails_le64;
        const int hint = options.rows_hint > 0 ? options.rows_hint : rows;
        if (fp4_group && which == 1) {
          kernels::GroupedGemm1W4a8Args args;
          args.a = x.as<uint8_t>();
          args.a_scales = x_scales.as<float>();
          args.weights = w4a8_13;
          args.expert_offsets = offsets.as<int32_t>();
          args.topk_weights = topk.as<float>();
          args.out = h.as<uint8_t>();
          args.out_scales = h_scales.as<float>();
          args.m_capacity = m;
          args.num_experts = static_cast<int>(E);
          args.hidden = static_cast<int>(H);
          args.intermediate = static_cast<int>(I);
          args.rows_per_expert_hint = hint;
          p.us = timer.median_us([&] { kernels::grouped_gemm1_w4a8(args, nullptr); });
        } else if (fp4_group) {
          kernels::GroupedGemm2W4a8Args args;
          args.a = h.as<uint8_t>();
          args.a_scales = h_scales.as<float>();
          args.weights = w4a8_2;
          args.expert_offsets = offsets.as<int32_t>();
          args.out = out.as<uint16_t>();
          args.m_capacity = m;
          args.num_experts = static_cast<int>(E);
          args.hidden = static_cast<int>(H);
          args.intermediate = static_cast<int>(I);
          args.rows_per_expert_hint = hint;
          p.us = timer.median_us([&] { kernels::grouped_gemm2_w4a8(args, nullptr); });
        } else if (bf16 && which == 1) {
          kernels::GroupedGemm1Bf16Args args;
          args.a = x.as<uint16_t>();
          args.weights = w13.as<uint16_t>();
          args.expert_offsets = offsets.as<int32_t>();
          args.topk_weights = topk.as<float>();
          args.out = h.as<uint16_t>();
          args.m_capacity = m;
          args.num_experts = static_cast<int>(E);
          args.hidden = static_cast<int>(H);
          args.intermediate = static_cast<int>(I);
          args.rows_per_expert_hint = hint;
          // The random weight bytes are read as either layout: the timing does not depend on their order.
          args.packing = bf16_main_interleaved ? kernels::GemmRole::kGateUpInterleaved8 : kernels::GemmRole::kGateUp;
          p.us = timer.median_us([&] { kernels::grouped_gemm1_bf16(args, nullptr); });
          if (options.bf16_v2 == "both") {
            args.packing = kernels::GemmRole::kGateUpInterleaved8;
            p.schedule_us.emplace_back("v2", timer.median_us([&] { kernels::grouped_gemm1_bf16(args, nullptr); }));
          }
        } else if (bf16) {
          kernels::GroupedGemm2Bf16Args args;
          args.a = h.as<uint16_t>();
          args.weights = w2.as<uint16_t>();
          args.expert_offsets = offsets.as<int32_t>();
          args.out = out.as<uint16_t>();
          args.m_capacity = m;
          args.num_experts = static_cast<int>(E);
          args.hidden = static_cast<int>(H);
          args.intermediate = static_cast<int>(I);
          args.rows_per_expert_hint = hint;
          args.v2 = bf16_main_v2;
          p.us = timer.median_us([&] { kernels::grouped_gemm2_bf16(args, nullptr); });
          if (options.bf16_v2 == "both") {
            args.v2 = 1;
            p.schedule_us.emplace_back("v2", timer.median_us([&] { kernels::grouped_gemm2_bf16(args, nullptr); }));
          }
        } else if (which == 1) {
          kernels::GroupedGemm1Fp8Args args;
          args.a = x.as<uint8_t>();
          args.a_scales = x_scales.as<float>();
          args.weights = w13.as<uint8_t>();
          args.weight_scales = w13_scales.as<float>();
          args.expert_offsets = offsets.as<int32_t>();
          args.topk_weights = topk.as<float>();
          args.out = h.as<uint8_t>();
          args.out_scales = h_scales.as<float>();
          args.m_capacity = m;
          args.num_experts = static_cast<int>(E);
          args.hidden = static_cast<int>(H);
          args.intermediate = static_cast<int>(I);
          args.rows_per_expert_hint = options.rows_hint > 0 ? options.rows_hint : rows;
          args.schedule = schedule;
          args.packing = gemm1_packing;
          args.v9_skew_kblocks = options.v9_skews.front();
          args.v11 = options.gemm1_v11 == "on" ? 1 : 0;
          args.v11_small = gemm1_v11_small;
          p.us = timer.median_us([&] { kernels::grouped_gemm1_fp8(args, nullptr); });
          if (options.gemm1_v9 == "both") {
            args.packing = kernels::GemmRole::kGateUpInterleaved8;
            // v9 has no overlap schedule, and a skew needs serial: run those serial (the main column
            // says which schedule it ran).
            const kernels::Fp8GemmSchedule main_schedule = args.schedule;
            for (const int skew : options.v9_skews) {
              args.v9_skew_kblocks = skew;
              if (skew > 0 || main_schedule == kernels::Fp8GemmSchedule::kOverlap)
                args.schedule = kernels::Fp8GemmSchedule::kSerial;
              p.schedule_us.emplace_back(skew == 0 ? std::string("v9") : "v9_skew" + std::to_string(skew),
                                         timer.median_us([&] { kernels::grouped_gemm1_fp8(args, nullptr); }));
              args.schedule = main_schedule;
            }
            args.packing = gemm1_packing;
            args.v9_skew_kblocks = options.v9_skews.front();
          }
          if (options.gemm1_v11 == "both") {  // v11 GEMM 1 on the interleaved weights (one schedule, no skew)
            const kernels::Fp8GemmSchedule main_schedule = args.schedule;
            args.packing = kernels::GemmRole::kGateUpInterleaved8;
            args.schedule = kernels::Fp8GemmSchedule::kSerial;
            args.v9_skew_kblocks = 0;
            args.v11 = 1;
            p.schedule_us.emplace_back("v11", timer.median_us([&] { kernels::grouped_gemm1_fp8(args, nullptr); }));
            args.v11 = 0;
            args.packing = gemm1_packing;
            args.schedule = main_schedule;
            args.v9_skew_kblocks = options.v9_skews.front();
          }
          if (options.gemm1_v11_small == "both") {  // v11 GEMM 1 small on the interleaved weights, after the v11 row
            const kernels::Fp8GemmSchedule main_schedule = args.schedule;
            const kernels::GemmRole main_packing = args.packing;
            const int main_v11 = args.v11;
            args.packing = kernels::GemmRole::kGateUpInterleaved8;
            args.schedule = kernels::Fp8GemmSchedule::kSerial;
            args.v9_skew_kblocks = 0;
            args.v11 = 1;
            args.v11_small = 1;
            p.schedule_us.emplace_back("v11_small",
                                       timer.median_us([&] { kernels::grouped_gemm1_fp8(args, nullptr); }));
            args.v11_small = gemm1_v11_small;
            args.v11 = main_v11;
            args.packing = main_packing;
            args.schedule = main_schedule;
            args.v9_skew_kblocks = options.v9_skews.front();
          }
          if (two_pass) {  // the same arguments on kGateUp weights; the main column's schedule and rows hint
            const kernels::GemmRole main_packing = args.packing;
            args.packing = kernels::GemmRole::kGateUp;
            uint16_t* bf16_gate_up = gate_up.as<uint16_t>();
            p.schedule_us.emplace_back("two_pass", timer.median_us([&] {
              kernels::grouped_gemm1_fp8_two_pass(args, bf16_gate_up, nullptr);
            }));
            kernels::GroupedGemmFp8Args plain;
            plain.a = args.a;
            plain.a_scales = args.a_scales;
            plain.weights = args.weights;
            plain.weight_scales = args.weight_scales;
            plain.expert_offsets = args.expert_offsets;
            plain.out = bf16_gate_up;
            plain.m_capacity = m;
            plain.num_experts = static_cast<int>(E);
            plain.n = static_cast<int>(2 * I);
            plain.k = static_cast<int>(H);
            plain.rows_per_expert_hint = args.rows_per_expert_hint;
            plain.schedule = args.schedule;
            p.schedule_us.emplace_back("two_pass_gemm", timer.median_us([&] {
              kernels::grouped_gemm_fp8_bf16out(plain, nullptr);
            }));
            kernels::SwigluQuantFp8Args pass2;
            pass2.in = bf16_gate_up;
            pass2.expert_offsets = args.expert_offsets;
            pass2.topk_weights = args.topk_weights;
            pass2.out = args.out;
            pass2.out_scales = args.out_scales;
            pass2.m_capacity = m;
            pass2.num_experts = static_cast<int>(E);
            pass2.intermediate = static_cast<int>(I);
            pass2.activation = args.activation;
            p.swiglu_us = timer.median_us([&] { kernels::swiglu_quant_fp8(pass2, nullptr); });
            p.schedule_us.emplace_back("two_pass_swiglu", p.swiglu_us);
            p.swiglu_bytes = static_cast<double>(m) * (2 * I * 2 + I + I / 128 * 4);
            args.packing = main_packing;
          }
          for (const auto& [name, other] : other_schedules) {
            if (!all_schedules) break;
            args.schedule = other;
            if (args.packing == kernels::GemmRole::kGateUpInterleaved8 && other == kernels::Fp8GemmSchedule::kOverlap)
              continue;  // not available for v9
            p.schedule_us.emplace_back(name, timer.median_us([&] { kernels::grouped_gemm1_fp8(args, nullptr); }));
          }
        } else {
          kernels::GroupedGemm2Fp8Args args;
          args.a = h.as<uint8_t>();
          args.a_scales = h_scales.as<float>();
          args.weights = w2.as<uint8_t>();
          args.weight_scales = w2_scales.as<float>();
          args.expert_offsets = offsets.as<int32_t>();
          args.out = out.as<uint16_t>();
          args.m_capacity = m;
          args.num_experts = static_cast<int>(E);
          args.hidden = static_cast<int>(H);
          args.intermediate = static_cast<int>(I);
          args.rows_per_expert_hint = options.rows_hint > 0 ? options.rows_hint : rows;
          args.schedule = schedule;
          args.v11 = fp8_main_v11;
          args.v11_block_n = options.v11_bn;
          p.us = timer.median_us([&] { kernels::grouped_gemm2_fp8(args, nullptr); });
          if (options.fp8_v11 == "both") {
            args.v11 = 1;
            p.schedule_us.emplace_back("v11", timer.median_us([&] { kernels::grouped_gemm2_fp8(args, nullptr); }));
            args.v11 = 0;
          }
          for (const auto& [name, other] : other_schedules) {
            if (!all_schedules) break;
            args.schedule = other;
            p.schedule_us.emplace_back(name, timer.median_us([&] { kernels::grouped_gemm2_fp8(args, nullptr); }));
          }
        }
        const void* dense_w = fp4_group ? dense_w8.data : which == 1 ? w13.data : w2.data;
        const void* dense_x = which == 1 ? x.data : h.data;
        if (!options.skip_cublas) {
          if (!bf16) {
            DenseFp8 dense(lt, m, static_cast<int>(p.n), static_cast<int>(p.k), workspace.data, workspace_bytes);
            p.cublas_fp8_us = timer.median_us([&] { dense.run(dense_w, dense_x, dense_out.data); });
          }
          if (!fp4_group) {  // W4A8: the FP8 dense GEMM is the denominator; no BF16 run
            const void* dense_w16 = bf16 ? dense_w : dense_w_bf16.data;  // expert 0's weights in bf16 mode
            const void* dense_x16 = bf16 ? dense_x : dense_x_bf16.data;
            const float alpha = 1.0f, beta = 0.0f;
            p.cublas_bf16_us = timer.median_us([&] {
              BENCH_CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.n), static_cast<int>(m),
                                              static_cast<int>(p.k), &alpha, dense_w16, CUDA_R_16BF,
                                              static_cast<int>(p.k), dense_x16, CUDA_R_16BF, static_cast<int>(p.k),
                                              &beta, dense_out.data, CUDA_R_16BF, static_cast<int>(p.n),
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            });
          }
        }
        std::printf("%-10s %5d %5s | %9.1f %8.1f %8.1f | %9.1f %8.1f %6.2f | %8.1f\n", model.c_str(), rows,
                    p.gemm.c_str(), p.us, p.flops() / p.us * 1e-6, p.weight_bytes() / p.us * 1e-3, p.denominator_us(),
                    p.flops() / p.denominator_us() * 1e-6, p.denominator_us() / p.us,
                    p.cublas_bf16_us > 0 ? p.flops() / p.cublas_bf16_us * 1e-6 : 0.0);
        for (const auto& [name, us] : p.schedule_us)
          std::printf("%-10s %5d %5s | %-8s %9.1f us %8.1f TFLOP/s | speedup vs main column %.3f | vs cuBLAS %.2f\n",
                      model.c_str(), rows, p.gemm.c_str(), name.c_str(), us, p.flops() / us * 1e-6, p.us / us,
                      p.denominator_us() / us);
        if (p.swiglu_us > 0)
          std::printf("%-10s %5d %5s | two_pass_swiglu %.1f us = %.0f GB/s (BF16 in, E4M3 + scales out)\n", model.c_str(),
                      rows, p.gemm.c_str(), p.swiglu_us, p.swiglu_bytes / p.swiglu_us * 1e-3);
        if (!bf16 && !fp4_group) p.schedule = all_schedules ? "serial" : options.schedule;
        if (!bf16 && !fp4_group && which == 1 && options.gemm1_v9 == "on") p.schedule += "+v9";
        if (!bf16 && !fp4_group && which == 1 && options.gemm1_v11 == "on") p.schedule += "+v11";
        if (!bf16 && !fp4_group && which == 1 && options.gemm1_v11 == "on" && gemm1_v11_small) p.schedule += "_small";
        if (!bf16 && !fp4_group && which == 2 && options.fp8_v11 == "on") p.schedule += "+v11";
        std::fflush(stdout);
        points.push_back(p);
      }
    }
  }
  cublasDestroy(blas);
  cublasLtDestroy(lt);
  if (!options.json_path.empty()) {
    nlohmann::json records = nlohmann::json::array();
    for (const Point& p : points) {
      if (p.bf16) {
        records.push_back({{"format", "bf16"}, {"model", p.model}, {"gemm", p.gemm}, {"rows_per_expert", p.rows},
                           {"experts", p.experts}, {"n", p.n}, {"k", p.k}, {"us", p.us},
                           {"tflops", p.flops() / p.us * 1e-6}, {"weight_gbps", p.weight_bytes() / p.us * 1e-3},
                           {"cublas_bf16_us", p.cublas_bf16_us},
                           {"cublas_bf16_tflops", p.flops() / p.cublas_bf16_us * 1e-6},
                           {"ratio_vs_cublas_bf16", p.cublas_bf16_us / p.us}});
        records.back()["kernel"] = options.bf16_v2 == "on" ? "v2" : options.bf16_v2 == "auto" ? "auto" : "v1";
        for (const auto& [name, us] : p.schedule_us) {
          records.back()[name + "_us"] = us;
          records.back()[name + "_tflops"] = p.flops() / us * 1e-6;
          records.back()[name + "_speedup_vs_main"] = p.us / us;
          records.back()[name + "_ratio_vs_cublas_bf16"] = p.cublas_bf16_us / us;
        }
        continue;
      }
      records.push_back({{"format", p.fp4_group == 16 ? "nvfp4" : p.fp4_group == 32 ? "mxfp4" : "fp8_block"},
                         {"model", p.model}, {"gemm", p.gemm}, {"rows_per_expert", p.rows}, {"experts", p.experts},
                         {"n", p.n}, {"k", p.k}, {"us", p.us}, {"tflops", p.flops() / p.us * 1e-6},
                         {"weight_gbps", p.weight_bytes() / p.us * 1e-3}, {"cublas_fp8_us", p.cublas_fp8_us},
                         {"cublas_fp8_tflops", p.flops() / p.cublas_fp8_us * 1e-6},
                         {"ratio_vs_cublas_fp8", p.cublas_fp8_us / p.us}, {"cublas_bf16_us", p.cublas_bf16_us},
                         {"cublas_bf16_tflops", p.flops() / p.cublas_bf16_us * 1e-6}});
      if (!p.schedule.empty()) records.back()["schedule"] = p.schedule;
      if (spread) {
        records.back()["rows_spread"] = "multinomial";
        records.back()["spread_seed"] = options.spread_seed;
        records.back()["rows_min"] = p.rows_min;
        records.back()["rows_max"] = p.rows_max;
        records.back()["experts_tail_le64"] = p.tails_le64;
      }
      for (const auto& [name, us] : p.schedule_us) {
        records.back()[name + "_us"] = us;
        records.back()[name + "_tflops"] = p.flops() / us * 1e-6;
        records.back()[name + "_speedup_vs_serial"] = p.us / us;
        records.back()[name + "_ratio_vs_cublas_fp8"] = p.cublas_fp8_us / us;
      }
      if (p.swiglu_us > 0) {
        records.back()["two_pass_swiglu_gbps"] = p.swiglu_bytes / p.swiglu_us * 1e-3;
        records.back()["two_pass_speedup_vs_fused"] = p.us / records.back()["two_pass_us"].get<double>();
      }
    }
    std::ofstream(options.json_path) << records.dump(2) << "\n";
  }
  return 0;
}
#endif

}  // namespace megamoe::bench
