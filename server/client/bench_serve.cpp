#include "server/client/bench_serve.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

#include "megamoe/error.h"
#include "server/client/openai_client.h"
#include "server/tokenizer.h"

namespace megamoe::client {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = q / 100.0 * double(values.size() - 1);
  const size_t lo = size_t(std::floor(rank)), hi = size_t(std::ceil(rank));
  return values[lo] + (values[hi] - values[lo]) * (rank - double(lo));
}

namespace {

struct PlannedRequest {
  std::vector<int32_t> prompt;
  int output_len = 0;
};

std::vector<PlannedRequest> plan_random(const BenchServeOptions& o, int count, uint64_t seed) {
  std::vector<int32_t> allowed;
  if (!o.tokenizer.empty()) {
    auto tokenizer = server::Tokenizer::from_file(o.tokenizer);
    for (int32_t id = 0; id < tokenizer->vocab_size(); ++id)
      if (!tokenizer->is_special(id)) allowed.push_back(id);
  } else {
    allowed.resize(size_t(o.random_vocab_size));
    std::iota(allowed.begin(), allowed.end(), 0);
  }
  MEGAMOE_CHECK(!allowed.empty(), "no token ids to draw random prompts from");
  std::mt19937_64 rng(seed);
  auto draw_len = [&](int base) {
    const int lo = std::max(1, int(std::floor(base * (1.0 - o.random_range_ratio))));
    const int hi = std::max(lo, int(std::ceil(base * (1.0 + o.random_range_ratio))));
    return lo + int(rng() % uint64_t(hi - lo + 1));
  };
  std::vector<PlannedRequest> out(static_cast<size_t>(count));
  for (PlannedRequest& r : out) {
    r.prompt.resize(size_t(draw_len(o.random_input_len)));
    for (int32_t& t : r.prompt) t = allowed[rng() % allowed.size()];
    r.output_len = draw_len(o.random_output_len);
  }
  return out;
}

json request_body(const BenchServeOptions& o, const std::string& model, const PlannedRequest& r) {
  json body{{"model", model}, {"prompt", r.prompt}, {"max_tokens", r.output_len}, {"temperature", o.temperature}};
  if (o.ignore_eos) body["ignore_eos"] = true;
  return body;
}

// Runs `planned` with at most `concurrency` in flight, request i sent no earlier than send_at[i].
std::vector<CallResult> run_all(const BenchServeOptions& o, const std::string& model,
                                const std::vector<PlannedRequest>& planned, const std::vector<double>& send_at,
                                int concurrency, bool progress) {
  std::vector<CallResult> results(planned.size());
  std::atomic<size_t> next{0}, done{0};
  std::mutex print_mutex;
  const Endpoint endpoint = Endpoint::parse(o.base_url);
  const auto start = Clock::now();
  auto worker = [&] {
    CompletionClient client(endpoint, o.request_timeout_s);
    while (true) {
      const size_t i = next++;
      if (i >= planned.size()) return;
      std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(send_at[i])));
      results[i] = client.complete(request_body(o, model, planned[i]), /*stream=*/true);
      const size_t finished = ++done;
      if (progress) {
        std::lock_guard lock(print_mutex);
        const int width = 40, filled = int(width * finished / planned.size());
        std::fprintf(stderr, "\r[%s%s] %zu/%zu", std::string(size_t(filled), '#').c_str(),
                     std::string(size_t(width - filled), '.').c_str(), finished, planned.size());
        if (finished == planned.size()) std::fprintf(stderr, "\n");
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < concurrency; ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace

json run_bench_serve(const BenchServeOptions& o) {
  MEGAMOE_CHECK(o.dataset_name == "random", "--dataset-name '", o.dataset_name, "' is unsupported (random)");
  MEGAMOE_CHECK(o.num_prompts > 0, "--num-prompts ", o.num_prompts, " must be > 0");
  MEGAMOE_CHECK(o.random_input_len > 0 && o.random_output_len > 0, "--random-input-len and --random-output-len must be > 0");
  MEGAMOE_CHECK(o.random_range_ratio >= 0 && o.random_range_ratio < 1, "--random-range-ratio ", o.random_range_ratio,
                " must be in [0, 1)");
  MEGAMOE_CHECK(o.request_rate > 0, "--request-rate ", o.request_rate, " must be > 0 (or inf)");
  MEGAMOE_CHECK(o.max_concurrency >= 0, "--max-concurrency ", o.max_concurrency, " must be >= 0");
  for (const std::string& m : o.percentile_metrics)
    MEGAMOE_CHECK(m == "ttft" || m == "tpot" || m == "itl" || m == "e2el", "--percentile-metrics entry '", m,
                  "' must be one of ttft, tpot, itl, e2el");
  std::string model = o.model;
  if (model.empty()) {
    CompletionClient probe(Endpoint::parse(o.base_url), 30);
    model = probe.first_model();
    MEGAMOE_CHECK(!model.empty(), "no --model given and GET ", o.base_url, "/v1/models gave none");
  }
  // NOTES: at most this many client threads; above it requests queue on the client side, which
  // would then be a client limit, so it is reported in the result.
  constexpr int kMaxClientThreads = 2048;
  const int concurrency = std::min({o.max_concurrency > 0 ? o.max_concurrency : o.num_prompts, o.num_prompts, kMaxClientThreads});

  if (o.num_warmups > 0) {
    auto warm = plan_random(o, o.num_warmups, o.seed ^ 0x5eedULL);
    run_all(o, model, warm, std::vector<double>(warm.size(), 0.0), std::min(concurrency, o.num_warmups), false);
  }
  const auto planned = plan_random(o, o.num_prompts, o.seed);
  std::vector<double> send_at(planned.size(), 0.0);
  if (std::isfinite(o.request_rate)) {
    std::mt19937_64 rng(o.seed + 1);
    std::exponential_distribution<double> gap(o.request_rate);  // Poisson arrivals
    double t = 0;
    for (double& s : send_at) {
      s = t;
      t += gap(rng);
    }
  }
  const auto start = Clock::now();
  const auto results = run_all(o, model, planned, send_at, concurrency, o.show_progress);
  const double duration = std::chrono::duration<double>(Clock::now() - start).count();

  int completed = 0, failed = 0;
  int64_t total_input = 0, total_output = 0;
  std::vector<double> ttfts, tpots, itls, e2els;
  json input_lens = json::array(), output_lens = json::array(), ttft_list = json::array(), itl_list = json::array(),
       texts = json::array(), errors = json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    const CallResult& r = results[i];
    input_lens.push_back(planned[i].prompt.size());
    output_lens.push_back(r.ok ? r.output_tokens : 0);
    ttft_list.push_back(r.ok ? r.ttft_s : 0.0);
    itl_list.push_back(r.itl_s);
    texts.push_back(r.text);
    errors.push_back(r.error);
    if (!r.ok) {
      ++failed;
      continue;
    }
    ++completed;
    total_input += int64_t(planned[i].prompt.size());
    total_output += r.output_tokens;
    ttfts.push_back(r.ttft_s * 1000);
    e2els.push_back(r.latency_s * 1000);
    if (r.output_tokens > 1) tpots.push_back((r.latency_s - r.ttft_s) * 1000 / (r.output_tokens - 1));
    for (double gap : r.itl_s) itls.push_back(gap * 1000);
  }
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y%m%d-%H%M%S", std::localtime(&now));
  json result{{"date", date},
              {"backend", "openai"},
              {"endpoint_type", "openai"},
              {"label", nullptr},
              {"model_id", model},
              {"tokenizer_id", o.tokenizer.empty() ? json(nullptr) : json(o.tokenizer)},
              {"num_prompts", o.num_prompts},
              {"request_rate", std::isfinite(o.request_rate) ? json(o.request_rate) : json("inf")},
              {"burstiness", 1.0},
              {"max_concurrency", o.max_concurrency > 0 ? json(o.max_concurrency) : json(nullptr)},
              {"duration", duration},
              {"completed", completed},
              {"failed", failed},
              {"total_input_tokens", total_input},
              {"total_output_tokens", total_output},
              {"request_throughput", completed / duration},
              {"output_throughput", double(total_output) / duration},
              {"total_token_throughput", double(total_input + total_output) / duration}};
  auto add_stats = [&](const std::string& name, const std::vector<double>& values) {
    const double mean = values.empty() ? 0 : std::accumulate(values.begin(), values.end(), 0.0) / double(values.size());
    double var = 0;
    for (double v : values) var += (v - mean) * (v - mean);
    result["mean_" + name + "_ms"] = mean;
    result["median_" + name + "_ms"] = percentile(values, 50);
    result["std_" + name + "_ms"] = values.empty() ? 0 : std::sqrt(var / double(values.size()));
    for (double p : o.metric_percentiles) {
      std::ostringstream key;
      key << "p" << p << "_" << name << "_ms";
      result[key.str()] = percentile(values, p);
    }
  };
  add_stats("ttft", ttfts);
  add_stats("tpot", tpots);
  add_stats("itl", itls);
  add_stats("e2el", e2els);
  if (o.save_detailed) {
    result["input_lens"] = input_lens;
    result["output_lens"] = output_lens;
    result["ttfts"] = ttft_list;
    result["itls"] = itl_list;
    result["generated_texts"] = texts;
    result["errors"] = errors;
  } else {
    // Failures are never dropped: the first few errors travel with every result.
    json first_errors = json::array();
    for (const CallResult& r : results)
      if (!r.ok && first_errors.size() < 5) first_errors.push_back(r.error);
    result["errors"] = first_errors;
  }
  return result;
}

std::string format_bench_summary(const json& r, const BenchServeOptions& o) {
  std::ostringstream s;
  char line[160];
  auto row = [&](const char* name, const std::string& value) {
    std::snprintf(line, sizeof(line), "%-40s %12s\n", name, value.c_str());
    s << line;
  };
  auto num = [](double v, int digits) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
    return std::string(buf);
  };
  s << "============ Serving Benchmark Result ============\n";
  row("Successful requests:", std::to_string(r["completed"].get<int>()));
  row("Failed requests:", std::to_string(r["failed"].get<int>()));
  row("Maximum request concurrency:", r["max_concurrency"].is_null() ? "none" : r["max_concurrency"].dump());
  row("Benchmark duration (s):", num(r["duration"], 2));
  row("Total input tokens:", std::to_string(r["total_input_tokens"].get<int64_t>()));
  row("Total generated tokens:", std::to_string(r["total_output_tokens"].get<int64_t>()));
  row("Request throughput (req/s):", num(r["request_throughput"], 2));
  row("Output token throughput (tok/s):", num(r["output_throughput"], 2));
  row("Total token throughput (tok/s):", num(r["total_token_throughput"], 2));
  const std::pair<const char*, const char*> titles[] = {
      {"ttft", "Time to First Token"}, {"tpot", "Time per Output Token (excl. 1st token)"},
      {"itl", "Inter-token Latency"}, {"e2el", "End-to-end Latency"}};
  for (const auto& [key, title] : titles) {
    if (std::find(o.percentile_metrics.begin(), o.percentile_metrics.end(), key) == o.percentile_metrics.end()) continue;
    s << "---------------" << title << "---------------\n";
    const std::string k = key;
    char label[64];
    std::snprintf(label, sizeof(label), "Mean %s (ms):", key);
    row(label, num(r["mean_" + k + "_ms"], 2));
    std::snprintf(label, sizeof(label), "Median %s (ms):", key);
    row(label, num(r["median_" + k + "_ms"], 2));
    for (double p : o.metric_percentiles) {
      std::ostringstream pk;
      pk << "p" << p << "_" << k << "_ms";
      std::snprintf(label, sizeof(label), "P%g %s (ms):", p, key);
      row(label, num(r[pk.str()], 2));
    }
  }
  s << "==================================================\n";
  return s.str();
}

}  // namespace megamoe::client
