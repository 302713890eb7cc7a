// Server counters and the TTFT histogram, rendered as Prometheus text for GET /metrics.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

namespace megamoe::server {

class ServerMetrics {
 public:
  static constexpr std::array<double, 12> kTtftBucketsS = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                           0.25,  0.5,   1.0,  2.5,   5.0,  10.0};
  std::atomic<int64_t> requests_ok{0}, requests_bad{0}, requests_overloaded{0}, requests_aborted{0},
      requests_error{0};
  std::atomic<int64_t> prompt_tokens{0}, generation_tokens{0}, preemptions{0};

  void observe_ttft(double seconds);
  // Gauges are read from the engine at render time.
  std::string render(int64_t waiting, int64_t running, int64_t kv_blocks_free, int64_t kv_blocks_total) const;

 private:
  mutable std::mutex mutex_;
  std::array<int64_t, kTtftBucketsS.size()> ttft_buckets_{};
  int64_t ttft_count_ = 0;
  double ttft_sum_ = 0;
};

}  // namespace megamoe::server
