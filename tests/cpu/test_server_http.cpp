// `megamoe serve`'s HTTP front on loopback (ephemeral port), driven by the hash-based fake model:
// OpenAI-shaped completions, streaming == non-streaming, token ids == the model's greedy output,
// bad input -> 400, overload -> 503, disconnects free their sequence, 256 concurrent clients,
// and the bench serve / eval gsm8k clients against it. Every loop is bounded in count and time.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <thread>

#include "server/client/bench_serve.h"
#include "server/client/gsm8k_eval.h"
#include "server/openai_server.h"
#include "server_fake_runner.h"
#include "server_stream_client.h"

using namespace megamoe::server;
using megamoe::server::testing::FakeRunner;
using megamoe::server::testing::reference_greedy;
using json = nlohmann::json;
using megamoe::server::testing::post_stream;
using megamoe::server::testing::StreamResult;

namespace {

const std::string kTokenizer = std::string(MEGAMOE_SOURCE_DIR) + "/tests/fixtures/tokenizer";
const std::string kGsm8kFixture = std::string(MEGAMOE_SOURCE_DIR) + "/tests/fixtures/gsm8k";
constexpr int kVocab = 2048;
const std::vector<int32_t> kEos = {2045};
constexpr const char* kModel = "tiny-fake";

struct ServerUnderTest {
  std::shared_ptr<const Tokenizer> tokenizer = Tokenizer::from_file(kTokenizer);
  ServerMetrics metrics;
  std::unique_ptr<LLMEngine> engine;
  std::unique_ptr<OpenAIServer> http;
  int port = 0;

  explicit ServerUnderTest(EngineOptions options = {}, int ranks = 1, int num_blocks = 512,
                           std::chrono::microseconds step_delay = std::chrono::microseconds(0)) {
    std::vector<std::unique_ptr<megamoe::engine::ModelRunner>> runners;
    for (int r = 0; r < ranks; ++r)
      runners.push_back(std::make_unique<FakeRunner>(kVocab, 16, num_blocks, 2048, kEos, step_delay));
    engine = std::make_unique<LLMEngine>(std::move(runners), tokenizer, options, &metrics);
    HttpOptions http_options;
    http_options.port = 0;
    http_options.served_model_names = {kModel};
    http = std::make_unique<OpenAIServer>(*engine, metrics, http_options);
    http->start_background();
    port = http->port();
  }
  ~ServerUnderTest() {
    http->stop();
    http.reset();
    engine.reset();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(std::chrono::seconds(60));
    return c;
  }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port); }
  // Bounded wait until the engine holds no sequence and every KV block is free again.
  bool drained(std::chrono::seconds limit = std::chrono::seconds(10)) const {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      const EngineStats s = engine->stats();
      if (s.running == 0 && s.waiting == 0 && s.kv_blocks_free == s.kv_blocks_total) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
};

std::vector<int32_t> random_prompt(std::mt19937_64& rng, int length) {
  std::vector<int32_t> prompt(static_cast<size_t>(length));
  for (auto& t : prompt) t = int32_t(rng() % 2045);
  return prompt;
}

}  // namespace

TEST(ServerHttp, CompletionTokensMatchGreedyAndStreamingAgrees) {
  ServerUnderTest server;
  auto client = server.client();
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 6; ++trial) {
    const auto prompt = random_prompt(rng, 1 + int(rng() % 60));
    const int max_tokens = 1 + int(rng() % 24);
    const json body{{"model", kModel}, {"prompt", prompt},           {"max_tokens", max_tokens},
                    {"temperature", 0}, {"return_token_ids", true}, {"ignore_eos", trial % 2 == 0}};
    auto res = client.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    const json reply = json::parse(res->body);
    const auto expected = reference_greedy(prompt, kVocab, max_tokens, kEos, trial % 2 == 0);
    EXPECT_EQ(reply["choices"][0]["token_ids"].get<std::vector<int32_t>>(), expected);
    EXPECT_EQ(reply["prompt_token_ids"].get<std::vector<int32_t>>(), prompt);
    EXPECT_EQ(reply["choices"][0]["text"], server.tokenizer->decode(expected, true));
    EXPECT_EQ(reply["object"], "text_completion");
    EXPECT_EQ(reply["model"], kModel);
    EXPECT_EQ(reply["usage"]["completion_tokens"], int(expected.size()));
    EXPECT_EQ(reply["usage"]["prompt_tokens"], int(prompt.size()));
    const StreamResult streamed = post_stream(server.port, body);
    EXPECT_EQ(streamed.status, 200);
    EXPECT_TRUE(streamed.done);
    EXPECT_EQ(streamed.tokens, expected);
    EXPECT_EQ(streamed.text, reply["choices"][0]["text"].get<std::string>());
    EXPECT_EQ(streamed.finish_reason, reply["choices"][0]["finish_reason"].get<std::string>());
    EXPECT_EQ(streamed.usage, reply["usage"]);
  }
  // A text prompt is tokenized with the model's tokenizer; stop strings agree between both modes.
  const std::string text = "Question: Natalia sold clips to 48 of her friends in April.\nAnswer:";
  json body{{"prompt", text}, {"max_tokens", 30}, {"temperature", 0}, {"return_token_ids", true},
            {"ignore_eos", true}, {"stop", {"e", "Question"}}};
  auto res = client.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json reply = json::parse(res->body);
  EXPECT_EQ(reply["prompt_token_ids"].get<std::vector<int32_t>>(), server.tokenizer->encode(text));
  const StreamResult streamed = post_stream(server.port, body);
  EXPECT_EQ(streamed.text, reply["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(reply["choices"][0]["text"].get<std::string>().find('e'), std::string::npos);
  EXPECT_TRUE(server.drained());
}

TEST(ServerHttp, SideEndpoints) {
  ServerUnderTest server;
  auto client = server.client();
  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto models = client.Get("/v1/models");
  ASSERT_TRUE(models);
  const json list = json::parse(models->body);
  EXPECT_EQ(list["data"][0]["id"], kModel);
  EXPECT_EQ(list["data"][0]["max_model_len"], 2048);
  auto tok = client.Post("/tokenize", json{{"prompt", "Hello, world! 你好"}}.dump(), "application/json");
  ASSERT_TRUE(tok);
  const json tokens = json::parse(tok->body);
  EXPECT_EQ(tokens["tokens"].get<std::vector<int32_t>>(), server.tokenizer->encode("Hello, world! 你好"));
  auto detok = client.Post("/detokenize", json{{"tokens", tokens["tokens"]}}.dump(), "application/json");
  ASSERT_TRUE(detok);
  EXPECT_EQ(json::parse(detok->body)["prompt"], "Hello, world! 你好");
  auto bad_detok = client.Post("/detokenize", json{{"tokens", {1, 99999}}}.dump(), "application/json");
  ASSERT_TRUE(bad_detok);
  EXPECT_EQ(bad_detok->status, 400);
  auto done = client.Post("/v1/completions", json{{"prompt", {1, 2, 3}}, {"max_tokens", 3}}.dump(), "application/json");
  ASSERT_TRUE(done);
  ASSERT_EQ(done->status, 200);
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("megamoe_requests_total{status=\"ok\"} 1"), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("megamoe_prompt_tokens_total 3"), std::string::npos);
  EXPECT_NE(metrics->body.find("megamoe_time_to_first_token_seconds_count 1"), std::string::npos);
  EXPECT_NE(metrics->body.find("megamoe_queue_depth 0"), std::string::npos);
}

TEST(ServerHttp, BadRequestsAre400WithAMessageAndTheServerStaysUp) {
  EngineOptions options;
  options.max_model_len = 64;
  ServerUnderTest server(options);
  auto client = server.client();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{not json", "JSON"},
      {"[1, 2]", "object"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": [1, "a"]})", "prompt"},
      {R"({"prompt": [1.5]})", "integers"},
      {R"({"max_tokens": 4})", "prompt"},
      {R"({"prompt": "hi", "max_tokens": "5"})", "max_tokens"},
      {R"({"prompt": "hi", "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": "hi", "max_tokens": -3})", "max_tokens"},
      {R"({"prompt": "hi", "temperature": "hot"})", "temperature"},
      {R"({"prompt": "hi", "temperature": -1})", "temperature"},
      {R"({"prompt": "hi", "top_p": 0})", "top_p"},
      {R"({"prompt": "hi", "stream": "yes"})", "stream"},
      {R"({"prompt": "hi", "stop": 3})", "stop"},
      {R"({"prompt": "hi", "n": 2})", "'n'"},
      {R"({"prompt": "hi", "model": "gpt-5"})", "gpt-5"},
      {R"({"prompt": "hi", "model": 7})", "model"},
      {R"({"prompt": [99999]})", "99999"},
      {R"({"prompt": []})", "prompt"},
      {json{{"prompt", std::vector<int>(64, 7)}}.dump(), "context length"},
      {json{{"prompt", std::vector<int>(60, 7)}, {"max_tokens", 100}}.dump(), "'max_tokens'"},
  };
  for (const auto& [body, needle] : cases) {
    auto res = client.Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(res) << body;
    EXPECT_EQ(res->status, 400) << body;
    const json reply = json::parse(res->body, nullptr, false);
    ASSERT_FALSE(reply.is_discarded()) << res->body;
    const std::string message = reply["error"]["message"];
    EXPECT_NE(message.find(needle), std::string::npos) << body << " -> " << message;
    EXPECT_EQ(reply["error"]["code"], 400);
  }
  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  // Without max_tokens the default (16) is cut at max_model_len instead of refused.
  auto ok = client.Post("/v1/completions", json{{"prompt", std::vector<int>(60, 7)}, {"ignore_eos", true}}.dump(),
                        "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(json::parse(ok->body)["usage"]["total_tokens"].get<int>(), 64);
  EXPECT_TRUE(server.drained());
}

TEST(ServerHttp, OverloadIs503AndOthersStillSucceed) {
  EngineOptions options;
  options.max_queued_requests = 4;
  ServerUnderTest server(options, 1, 512, std::chrono::milliseconds(5));
  std::atomic<int> ok{0}, overloaded{0}, other{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      auto client = server.client();
      auto res = client.Post("/v1/completions",
                             json{{"prompt", {1, 2, i}}, {"max_tokens", 20}, {"ignore_eos", true}}.dump(),
                             "application/json");
      if (res && res->status == 200) ++ok;
      else if (res && res->status == 503) ++overloaded;
      else ++other;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_GT(overloaded.load(), 0);
  EXPECT_GE(ok.load(), 4);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(ok + overloaded, 16);
  EXPECT_TRUE(server.drained());
}

TEST(ServerHttp, ClientDisconnectMidStreamFreesItsSequence) {
  // Slow steps so the stream is surely still running when the client hangs up.
  ServerUnderTest server({}, 1, 512, std::chrono::milliseconds(5));
  auto client = server.client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = json{{"prompt", {5, 6, 7}}, {"max_tokens", 1500}, {"ignore_eos", true}, {"stream", true}}.dump();
  req.set_header("Content-Type", "application/json");
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };  // hang up
  auto res = client.send(req);
  EXPECT_GE(chunks, 3);
  const auto hung_up = std::chrono::steady_clock::now();
  ASSERT_TRUE(server.drained(std::chrono::seconds(5))) << "the sequence kept its KV blocks after the disconnect";
  // 1500 tokens at >= 5 ms a step would take 7.5 s: it was aborted, not run to the end.
  EXPECT_LT(std::chrono::steady_clock::now() - hung_up, std::chrono::seconds(5));
  EXPECT_EQ(server.metrics.requests_aborted.load(), 1);
  auto health = server.client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST(ServerHttp, ClientThatLeavesWhileQueuedIsDroppedBeforeItRuns) {
  EngineOptions options;
  options.max_num_seqs = 1;  // one running sequence; the second request has to wait
  ServerUnderTest server(options, 1, 512, std::chrono::milliseconds(5));
  // A: a long stream holding the only slot (2000 tokens >= 10 s).
  std::atomic<bool> a_done{false};
  std::thread a([&] {
    post_stream(server.port, json{{"prompt", {1, 2}}, {"max_tokens", 2000}, {"ignore_eos", true}});
    a_done = true;
  });
  const auto wait_until = [](auto condition, std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!condition() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return condition();
  };
  ASSERT_TRUE(wait_until([&] { return server.engine->stats().running == 1; }, std::chrono::seconds(5)));
  // B: queued behind A; its client gives up after 300 ms without having seen a byte.
  {
    httplib::Client client("127.0.0.1", server.port);
    client.set_read_timeout(std::chrono::milliseconds(300));
    auto res = client.Post("/v1/completions",
                           json{{"prompt", {3, 4}}, {"max_tokens", 5}, {"stream", true}}.dump(), "application/json");
    EXPECT_FALSE(res) << "B should still be queued";
  }
  // The keep-alive comments (one a second) find the closed socket: B is aborted while A still runs.
  EXPECT_TRUE(wait_until([&] { return server.metrics.requests_aborted.load() == 1; }, std::chrono::seconds(8)));
  const EngineStats stats = server.engine->stats();
  EXPECT_EQ(stats.waiting, 0);
  EXPECT_FALSE(a_done.load()) << "A finished before B was dropped: the test proves nothing";
  server.engine->abort(1);  // end A early (it is request 1): a server-side abort ends its stream
  a.join();
  EXPECT_TRUE(server.drained());
}

TEST(ServerHttp, TwoHundredFiftySixConcurrentClientsNoFailureNoLeak) {
  EngineOptions options;
  options.max_num_seqs = 64;
  options.max_num_batched_tokens = 512;
  // Two ranks; a KV cache small enough that preemption happens under this load.
  ServerUnderTest server(options, 2, 96);
  constexpr int kClients = 256;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(4);
  std::atomic<int> ok{0}, failed{0}, mismatched{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937_64 rng(uint64_t(c) * 7919 + 1);
      auto client = server.client();
      for (int i = 0; i < 20 && std::chrono::steady_clock::now() < deadline; ++i) {
        const auto prompt = random_prompt(rng, 1 + int(rng() % 40));
        const int max_tokens = 1 + int(rng() % 12);
        const json body{{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
                        {"ignore_eos", true}, {"return_token_ids", true}};
        std::vector<int32_t> got;
        if (i % 2 == 0) {
          auto res = client.Post("/v1/completions", body.dump(), "application/json");
          if (!res || res->status != 200) {
            if (++failed <= 3)
              std::printf("failure: %s\n", res ? (std::to_string(res->status) + " " + res->body).c_str()
                                                : httplib::to_string(res.error()).c_str());
            continue;
          }
          got = json::parse(res->body)["choices"][0]["token_ids"].get<std::vector<int32_t>>();
        } else {
          const StreamResult s = post_stream(server.port, body);
          if (s.status != 200 || !s.done) {
            if (++failed <= 3) std::printf("stream failure: status %d done %d\n", s.status, int(s.done));
            continue;
          }
          got = s.tokens;
        }
        ++ok;
        if (got != reference_greedy(prompt, kVocab, max_tokens, kEos, true)) ++mismatched;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(mismatched.load(), 0);
  EXPECT_GE(ok.load(), kClients);
  EXPECT_TRUE(server.drained()) << "KV blocks leaked";
  const EngineStats stats = server.engine->stats();
  for (int64_t n : stats.requests_per_rank) EXPECT_GT(n, ok.load() / 4);
  std::printf("256 clients: %d requests ok, %lld preemptions, %lld steps\n", ok.load(),
              static_cast<long long>(stats.preemptions), static_cast<long long>(stats.steps));
}

TEST(ServerHttp, BenchServeCompletesWithZeroFailures) {
  ServerUnderTest server;
  megamoe::client::BenchServeOptions o;
  o.base_url = server.base_url();
  o.tokenizer = kTokenizer;
  o.random_input_len = 64;
  o.random_output_len = 8;
  o.random_range_ratio = 0.5;
  o.num_prompts = 40;
  o.num_warmups = 4;
  o.max_concurrency = 8;
  o.ignore_eos = true;
  o.show_progress = false;
  o.percentile_metrics = {"ttft", "tpot", "itl", "e2el"};
  o.metric_percentiles = {50, 90, 99};
  o.save_detailed = true;
  const json result = megamoe::client::run_bench_serve(o);
  EXPECT_EQ(result["completed"], 40);
  EXPECT_EQ(result["failed"], 0) << result["errors"].dump();
  EXPECT_EQ(result["model_id"], kModel);
  int64_t output_sum = 0;
  for (const json& n : result["output_lens"]) {
    EXPECT_GE(n.get<int>(), 4);  // 8 +- 50%, generated to the token (ignore_eos)
    EXPECT_LE(n.get<int>(), 12);
    output_sum += n.get<int>();
  }
  EXPECT_EQ(result["total_output_tokens"].get<int64_t>(), output_sum);
  for (const char* key : {"request_throughput", "total_token_throughput", "output_throughput", "mean_ttft_ms",
                          "median_ttft_ms", "p99_ttft_ms", "p50_itl_ms", "p90_tpot_ms", "mean_e2el_ms", "duration"})
    EXPECT_TRUE(result.contains(key) && result[key].is_number()) << key;
  EXPECT_GT(result["mean_ttft_ms"].get<double>(), 0);
  EXPECT_EQ(result["input_lens"].size(), 40u);
  // Re-parses as JSON, and a finite request rate also completes.
  EXPECT_EQ(json::parse(result.dump()), result);
  o.request_rate = 200;
  o.num_warmups = 0;
  o.save_detailed = false;
  const json paced = megamoe::client::run_bench_serve(o);
  EXPECT_EQ(paced["failed"], 0);
  EXPECT_EQ(paced["request_rate"], 200.0);
  const std::string summary = megamoe::client::format_bench_summary(paced, o);
  for (const char* label : {"Failed requests:", "Mean ttft (ms):", "P99 itl (ms):", "P90 e2el (ms):"})
    EXPECT_NE(summary.find(label), std::string::npos) << label << "\n" << summary;
  EXPECT_TRUE(server.drained());
}

TEST(ServerHttp, BenchServeCountsFailedRequests) {
  // Nothing listens on this port once the server is gone: every request fails and is counted.
  int dead_port;
  {
    ServerUnderTest server;
    dead_port = server.port;
  }
  megamoe::client::BenchServeOptions o;
  o.base_url = "http://127.0.0.1:" + std::to_string(dead_port);
  o.model = kModel;
  o.random_input_len = 8;
  o.random_output_len = 2;
  o.num_prompts = 5;
  o.show_progress = false;
  o.request_timeout_s = 5;
  const json result = megamoe::client::run_bench_serve(o);
  EXPECT_EQ(result["failed"], 5);
  EXPECT_EQ(result["completed"], 0);
  EXPECT_FALSE(result["errors"].empty());
}

TEST(ServerHttp, EvalGsm8kOverTwentyQuestionsRunsAndScores) {
  ServerUnderTest server;
  megamoe::client::Gsm8kOptions o;
  o.base_url = server.base_url();
  o.data_path = kGsm8kFixture;
  o.num_questions = 20;
  o.max_tokens = 32;  // random weights: the score is meaningless, the pipeline is what is tested
  o.concurrency = 8;
  o.save_detailed = true;
  const json result = megamoe::client::run_gsm8k_eval(o);
  EXPECT_EQ(result["num_questions"], 20);
  EXPECT_EQ(result["num_failed_requests"], 0);
  EXPECT_GE(result["accuracy"].get<double>(), 0.0);
  EXPECT_LE(result["accuracy"].get<double>(), 1.0);
  EXPECT_GT(result["questions_per_s"].get<double>(), 0.0);
  EXPECT_EQ(result["details"].size(), 20u);
  // The invalid count agrees with re-extracting the replies.
  int invalid = 0;
  for (const json& d : result["details"]) invalid += !megamoe::client::extract_last_integer(d["reply"].get<std::string>());
  EXPECT_EQ(result["num_invalid"], invalid);
  EXPECT_TRUE(server.drained());
}

TEST(ServerGsm8k, ExtractionOnRealGoldAnswers) {
  using megamoe::client::extract_last_integer;
  using megamoe::client::gold_answer;
  // The full data set when this checkout sits next to ../shared, else the committed subset.
  std::string dir = std::string(MEGAMOE_SOURCE_DIR) + "/../shared/data/gsm8k";
  if (!std::filesystem::exists(dir + "/test.jsonl")) dir = kGsm8kFixture;
  int checked = 0, with_commas = 0, negative = 0;
  for (const char* file : {"/train.jsonl", "/test.jsonl"}) {
    for (const auto& problem : megamoe::client::load_gsm8k(dir + file)) {
      const size_t mark = problem.answer.rfind("#### ");
      ASSERT_NE(mark, std::string::npos) << problem.answer;
      std::string gold_text = problem.answer.substr(mark + 5);
      with_commas += gold_text.find(',') != std::string::npos;
      gold_text.erase(std::remove(gold_text.begin(), gold_text.end(), ','), gold_text.end());
      const int64_t expected = std::stoll(gold_text);
      negative += expected < 0;
      ASSERT_EQ(gold_answer(problem.answer), expected) << problem.answer;
      // A model reply that ends like a gold solution scores as that number.
      EXPECT_EQ(extract_last_integer(problem.answer), expected) << problem.answer;
      ++checked;
    }
  }
  EXPECT_GE(checked, 30);
  std::printf("gold answers checked: %d (%d with commas, %d negative) from %s\n", checked, with_commas, negative,
              dir.c_str());
  EXPECT_EQ(extract_last_integer("so she pays $1,234 in total."), 1234);
  EXPECT_EQ(extract_last_integer("The temperature is -5 degrees"), -5);
  EXPECT_EQ(extract_last_integer("3 apples and 4 pears make 7.\nQuestion"), 7);
  EXPECT_EQ(extract_last_integer("It costs 2.5 dollars"), 5);  // last integer, by the definition
  EXPECT_FALSE(extract_last_integer("no number here").has_value());
  EXPECT_FALSE(extract_last_integer("").has_value());
  const auto prompt = megamoe::client::gsm8k_prompt({{"Q1?", "A1 #### 1"}}, "Q2?");
  EXPECT_EQ(prompt, "Question: Q1?\nAnswer: A1 #### 1\n\nQuestion: Q2?\nAnswer:");
}
