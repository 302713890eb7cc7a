// `megamoe bench wgmma`: runs every compiled wgmma probe configuration (src/kernels/wgmma_probe.h) on one
// CTA per SM and reports, per configuration:
//   TFLOP/s        2 * MACs of all CTAs / median cudaEvent wall time
//   util %         tensor utilisation from clock64: MACs per SM cycle (CTA span, mean over CTAs) / 4096,
//                  the dense FP8 peak of one SM (m64n128k32 = 64 * 128 * 32 MACs per 64 cycles)
//   ceil %         TFLOP/s / the measured FP8 ceiling (1420): the same rate against what a GEMM reaches
//   cyc/group      mean loop cycles of one warpgroup / groups it issued (for B: the group latency)
//   MHz            mean CTA span cycles / wall time (the SM clock during the run)
// Checks (exit code 1 on failure): every thread's checksum finite and not zero, bit-identical across
// the repeats and across CTAs (all CTAs compute the same thing).
#include "bench/wgmma_probe_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#ifdef MEGAMOE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "megamoe/error_cuda.h"
#include "src/kernels/wgmma_probe.h"
#endif

namespace megamoe::bench {

#ifndef MEGAMOE_WITH_CUDA
int run_wgmma_bench(const WgmmaBenchOptions&) {
  std::fprintf(stderr, "bench wgmma needs a CUDA build (MEGAMOE_ENABLE_CUDA=ON)\n");
  return 1;
}
#else
namespace {

struct CudaFree {
  void operator()(void* pointer) const { cudaFree(pointer); }
};
template <typename T>
std::unique_ptr<T, CudaFree> device_array(size_t count) {
  void* pointer = nullptr;
  MEGAMOE_CUDA_CHECK(cudaMalloc(&pointer, std::max<size_t>(count * sizeof(T), 256)));
  return std::unique_ptr<T, CudaFree>(static_cast<T*>(pointer));
}

constexpr double kPeakMacsPerSmCycle = 64.0 * 128 * 32 / 64;  // 4096

struct ProbeResult {
  kernels::WgmmaProbeConfig config;
  double median_ms = 0, tflops = 0, utilisation = 0, ceiling_fraction = 0, cycles_per_group = 0, clock_mhz = 0;
  double max_cycles_per_group = 0;  // slowest warpgroup
  bool checks_passed = true;
  std::string failure;
};

}  // namespace

int run_wgmma_bench(const WgmmaBenchOptions& options) {
  MEGAMOE_CHECK(options.iterations >= 1, "iterations must be >= 1, got ", options.iterations);
  MEGAMOE_CHECK(options.repeats >= 1, "repeats must be >= 1, got ", options.repeats);
  int device = 0, sms = 0, max_clock_khz = 0;
  MEGAMOE_CUDA_CHECK(cudaGetDevice(&device));
  MEGAMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  MEGAMOE_CUDA_CHECK(cudaDeviceGetAttribute(&max_clock_khz, cudaDevAttrClockRate, device));
  cudaDeviceProp prop{};
  MEGAMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const int ctas = options.ctas > 0 ? options.ctas : sms;

  const kernels::WgmmaProbeInputs inputs = kernels::wgmma_probe_random_inputs(options.seed);
  auto a = device_array<uint8_t>(inputs.a.size());
  auto b = device_array<uint8_t>(inputs.b.size());
  auto scales = device_array<float>(inputs.scales.size());
  MEGAMOE_CUDA_CHECK(cudaMemcpy(a.get(), inputs.a.data(), inputs.a.size(), cudaMemcpyHostToDevice));
  MEGAMOE_CUDA_CHECK(cudaMemcpy(b.get(), inputs.b.data(), inputs.b.size(), cudaMemcpyHostToDevice));
  MEGAMOE_CUDA_CHECK(
      cudaMemcpy(scales.get(), inputs.scales.data(), inputs.scales.size() * sizeof(float), cudaMemcpyHostToDevice));
  cudaEvent_t start = nullptr, stop = nullptr;
  MEGAMOE_CUDA_CHECK(cudaEventCreate(&start));
  MEGAMOE_CUDA_CHECK(cudaEventCreate(&stop));

  std::printf("device %s, %d SMs, max clock %d MHz; %d CTAs, %d steps per warpgroup, median of %d, seed %llu\n",
              prop.name, sms, max_clock_khz / 1000, ctas, options.iterations, options.repeats,
              static_cast<unsigned long long>(options.seed));
  std::printf("%-4s %3s %3s %-11s | %9s %7s %7s | %10s %10s | %6s | %s\n", "pat", "wg", "sub", "instr", "TFLOP/s",
              "util%", "ceil%", "cyc/group", "max cyc/g", "MHz", "check");

  std::vector<ProbeResult> results;
  bool all_passed = true;
  for (const kernels::WgmmaProbeConfig& config : kernels::wgmma_probe_configs()) {
    const kernels::WgmmaProbeShape shape = kernels::wgmma_probe_shape(config);
    const int warpgroups = config.warpgroups;
    const size_t threads = static_cast<size_t>(ctas) * warpgroups * 128;
    auto cycles = device_array<long long>(static_cast<size_t>(ctas) * warpgroups * 2);
    auto checksums = device_array<float>(threads);
    std::vector<long long> host_cycles(static_cast<size_t>(ctas) * warpgroups * 2);
    std::vector<float> host_checksums(threads), first_checksums;
    std::vector<double> ms(options.repeats), spans(options.repeats), group_cycles(options.repeats),
        max_group_cycles(options.repeats);
    ProbeResult result;
    result.config = config;
    const double groups = static_cast<double>(options.iterations) * shape.groups_per_step;
    for (int repeat = -1; repeat < options.repeats; ++repeat) {  // -1: warm-up
      MEGAMOE_CUDA_CHECK(cudaMemset(checksums.get(), 0xFF, threads * sizeof(float)));  // NaN poison
      MEGAMOE_CUDA_CHECK(cudaEventRecord(start));
      kernels::launch_wgmma_probe(config, a.get(), b.get(), scales.get(), options.iterations, ctas, cycles.get(),
                                  checksums.get(), nullptr, nullptr);
      MEGAMOE_CUDA_CHECK(cudaEventRecord(stop));
      MEGAMOE_CUDA_CHECK(cudaEventSynchronize(stop));
      float elapsed = 0;
      MEGAMOE_CUDA_CHECK(cudaEventElapsedTime(&elapsed, start, stop));
      MEGAMOE_CUDA_CHECK(cudaMemcpy(host_cycles.data(), cycles.get(), host_cycles.size() * sizeof(long long),
                                    cudaMemcpyDeviceToHost));
      MEGAMOE_CUDA_CHECK(
          cudaMemcpy(host_checksums.data(), checksums.get(), threads * sizeof(float), cudaMemcpyDeviceToHost));
      // checks: finite, non-zero, identical across CTAs and repeats
      const size_t per_cta = static_cast<size_t>(warpgroups) * 128;
      for (size_t i = 0; i < threads && result.checks_passed; ++i) {
        const float value = host_checksums[i];
        if (!std::isfinite(value) || value == 0.0f) {
          result.checks_passed = false;
          result.failure = "checksum of thread " + std::to_string(i) + " is " + std::to_string(value);
        } else if (std::memcmp(&value, &host_checksums[i % per_cta], sizeof(float)) != 0) {
          result.checks_passed = false;
          result.failure = "CTA " + std::to_string(i / per_cta) + " differs from CTA 0 at thread " +
                           std::to_string(i % per_cta);
        }
      }
      if (first_checksums.empty()) {
        first_checksums = host_checksums;
      } else if (result.checks_passed &&
                 std::memcmp(first_checksums.data(), host_checksums.data(), threads * sizeof(float)) != 0) {
        result.checks_passed = false;
        result.failure = "checksums differ between repeats";
      }
      if (repeat < 0) continue;
      double span_sum = 0, loop_sum = 0, loop_max = 0;
      for (int cta = 0; cta < ctas; ++cta) {
        long long first = host_cycles[static_cast<size_t>(cta) * warpgroups * 2], last = 0;
        for (int w = 0; w < warpgroups; ++w) {
          const long long begin = host_cycles[(static_cast<size_t>(cta) * warpgroups + w) * 2];
          const long long end = host_cycles[(static_cast<size_t>(cta) * warpgroups + w) * 2 + 1];
          first = std::min(first, begin);
          last = std::max(last, end);
          loop_sum += static_cast<double>(end - begin);
          loop_max = std::max(loop_max, static_cast<double>(end - begin));
        }
        span_sum += static_cast<double>(last - first);
      }
      ms[repeat] = elapsed;
      spans[repeat] = span_sum / ctas;
      group_cycles[repeat] = loop_sum / (static_cast<double>(ctas) * warpgroups) / groups;
      max_group_cycles[repeat] = loop_max / groups;
    }
    // the median launch by wall time, and its clock64 figures
    std::vector<int> order(options.repeats);
    for (int i = 0; i < options.repeats; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](int x, int y) { return ms[x] < ms[y]; });
    const int median = order[options.repeats / 2];
    const double macs_per_cta = warpgroups * groups * static_cast<double>(shape.macs_per_group);
    result.median_ms = ms[median];
    result.tflops = 2.0 * macs_per_cta * ctas / (ms[median] * 1e-3) / 1e12;
    result.utilisation = macs_per_cta / spans[median] / kPeakMacsPerSmCycle;
    result.ceiling_fraction = result.tflops / options.ceiling_tflops;
    result.cycles_per_group = group_cycles[median];
    result.max_cycles_per_group = max_group_cycles[median];
    result.clock_mhz = spans[median] / (ms[median] * 1e-3) / 1e6;
    all_passed = all_passed && result.checks_passed;
    std::printf("%-4s %3d %3d %-11s | %9.1f %7.1f %7.1f | %10.1f %10.1f | %6.0f | %s\n",
                kernels::wgmma_probe_pattern_name(config.pattern), warpgroups, config.sub_tiles, shape.instruction,
                result.tflops, 100.0 * result.utilisation, 100.0 * result.ceiling_fraction, result.cycles_per_group,
                result.max_cycles_per_group, result.clock_mhz, result.checks_passed ? "ok" : result.failure.c_str());
    results.push_back(result);
  }
  MEGAMOE_CUDA_CHECK(cudaEventDestroy(start));
  MEGAMOE_CUDA_CHECK(cudaEventDestroy(stop));
  std::printf("util%% = MACs per SM cycle / %.0f (dense FP8 peak per SM); at the measured clock the %.0f TFLOP/s "
              "ceiling is %.0f MACs per SM cycle\n",
              kPeakMacsPerSmCycle, options.ceiling_tflops,
              results.empty() ? 0.0
                              : options.ceiling_tflops * 1e12 / (2.0 * sms * results.front().clock_mhz * 1e6));

  if (!options.json_path.empty()) {
    nlohmann::json records = nlohmann::json::array();
    for (const ProbeResult& r : results) {
      const kernels::WgmmaProbeShape shape = kernels::wgmma_probe_shape(r.config);
      const double ceiling_macs_per_cycle = options.ceiling_tflops * 1e12 / (2.0 * sms * r.clock_mhz * 1e6);
      records.push_back({{"pattern", kernels::wgmma_probe_pattern_name(r.config.pattern)},
                         {"description", kernels::wgmma_probe_pattern_description(r.config.pattern)},
                         {"warpgroups", r.config.warpgroups},
                         {"sub_tiles", r.config.sub_tiles},
                         {"instruction", shape.instruction},
                         {"groups_per_step", shape.groups_per_step},
                         {"median_ms", r.median_ms},
                         {"tflops", r.tflops},
                         {"tensor_utilisation", r.utilisation},
                         {"ceiling_fraction", r.ceiling_fraction},
                         {"ceiling_macs_per_sm_cycle", ceiling_macs_per_cycle},
                         {"cycles_per_group", r.cycles_per_group},
                         {"max_cycles_per_group", r.max_cycles_per_group},
                         {"clock_mhz", r.clock_mhz},
                         {"checks_passed", r.checks_passed},
                         {"failure", r.failure}});
    }
    const nlohmann::json document = {{"device", prop.name},        {"sms", sms},
                                     {"max_clock_mhz", max_clock_khz / 1000},
                                     {"ctas", ctas},               {"iterations", options.iterations},
                                     {"repeats", options.repeats}, {"seed", options.seed},
                                     {"peak_macs_per_sm_cycle", kPeakMacsPerSmCycle},
                                     {"ceiling_tflops", options.ceiling_tflops},
                                     {"results", records}};
    std::ofstream(options.json_path) << document.dump(2) << "\n";
  }
  if (!all_passed) std::fprintf(stderr, "bench wgmma: a checksum check failed (see the check column)\n");
  return all_passed ? 0 : 1;
}
#endif

}  // namespace megamoe::bench
