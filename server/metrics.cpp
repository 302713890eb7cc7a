#include "server/metrics.h"

#include <sstream>

namespace megamoe::server {

void ServerMetrics::observe_ttft(double seconds) {
  std::lock_guard lock(mutex_);
  for (size_t b = 0; b < kTtftBucketsS.size(); ++b)
    if (seconds <= kTtftBucketsS[b]) ++ttft_buckets_[b];
  ++ttft_count_;
  ttft_sum_ += seconds;
}

std::string ServerMetrics::render(int64_t waiting, int64_t running, int64_t kv_blocks_free,
                                  int64_t kv_blocks_total) const {
  std::ostringstream out;
  out << "# HELP megamoe_requests_total Completion requests by outcome.\n"
      << "# TYPE megamoe_requests_total counter\n"
      << "megamoe_requests_total{status=\"ok\"} " << requests_ok << "\n"
      << "megamoe_requests_total{status=\"bad_request\"} " << requests_bad << "\n"
      << "megamoe_requests_total{status=\"overloaded\"} " << requests_overloaded << "\n"
      << "megamoe_requests_total{status=\"aborted\"} " << requests_aborted << "\n"
      << "megamoe_requests_total{status=\"error\"} " << requests_error << "\n"
      << "# HELP megamoe_prompt_tokens_total Prompt tokens admitted.\n# TYPE megamoe_prompt_tokens_total counter\n"
      << "megamoe_prompt_tokens_total " << prompt_tokens << "\n"
      << "# HELP megamoe_generation_tokens_total Tokens generated.\n"
      << "# TYPE megamoe_generation_tokens_total counter\n"
      << "megamoe_generation_tokens_total " << generation_tokens << "\n"
      << "# HELP megamoe_preemptions_total Sequences preempted for KV blocks.\n"
      << "# TYPE megamoe_preemptions_total counter\nmegamoe_preemptions_total " << preemptions << "\n"
      << "# HELP megamoe_queue_depth Requests waiting to be scheduled.\n# TYPE megamoe_queue_depth gauge\n"
      << "megamoe_queue_depth " << waiting << "\n"
      << "# HELP megamoe_running_requests Requests in the running batch.\n"
      << "# TYPE megamoe_running_requests gauge\nmegamoe_running_requests " << running << "\n"
      << "# HELP megamoe_kv_blocks_free Free KV cache blocks (all ranks).\n# TYPE megamoe_kv_blocks_free gauge\n"
      << "megamoe_kv_blocks_free " << kv_blocks_free << "\n"
      << "# HELP megamoe_kv_blocks_total KV cache blocks (all ranks).\n# TYPE megamoe_kv_blocks_total gauge\n"
      << "megamoe_kv_blocks_total " << kv_blocks_total << "\n";
  std::lock_guard lock(mutex_);
  out << "# HELP megamoe_time_to_first_token_seconds Time from arrival to the first generated token.\n"
      << "# TYPE megamoe_time_to_first_token_seconds histogram\n";
  for (size_t b = 0; b < kTtftBucketsS.size(); ++b)
    out << "megamoe_time_to_first_token_seconds_bucket{le=\"" << kTtftBucketsS[b] << "\"} " << ttft_buckets_[b] << "\n";
  out << "megamoe_time_to_first_token_seconds_bucket{le=\"+Inf\"} " << ttft_count_ << "\n"
      << "megamoe_time_to_first_token_seconds_sum " << ttft_sum_ << "\n"
      << "megamoe_time_to_first_token_seconds_count " << ttft_count_ << "\n";
  return out.str();
}

}  // namespace megamoe::server
