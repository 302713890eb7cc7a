// `megamoe serve` end to end on the committed tiny models with the CPU reference runner: the tokens
// served over HTTP (batched with other requests, chunked, streamed or not) equal the engine's own
// single-sequence greedy generate(); bench serve and a 20-question GSM8K eval run against it.
#include <gtest/gtest.h>
#include <httplib.h>

#include <future>
#include <random>

#include "engine/generate.h"
#include "engine/model.h"
#include "server/client/bench_serve.h"
#include "server/client/gsm8k_eval.h"
#include "server/openai_server.h"
#include "server_stream_client.h"

using namespace megamoe::server;
using json = nlohmann::json;

namespace {

std::string fixture(const std::string& name) { return std::string(MEGAMOE_SOURCE_DIR) + "/tests/fixtures/" + name; }

megamoe::engine::RunnerOptions quiet_options(int num_kv_blocks) {
  megamoe::engine::RunnerOptions options;
  options.load.progress = false;
  options.num_kv_blocks = num_kv_blocks;
  return options;
}

class TinyModelServer : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    tokenizer_ = Tokenizer::from_file(fixture(GetParam()));
    std::vector<std::unique_ptr<megamoe::engine::ModelRunner>> runners;
    runners.push_back(megamoe::engine::make_cpu_model_runner(fixture(GetParam()), quiet_options(512)));
    EngineOptions options;
    options.max_num_batched_tokens = 64;  // prompts longer than this are prefilled in chunks
    options.max_model_len = 2048;
    engine_ = std::make_unique<LLMEngine>(std::move(runners), tokenizer_, options, &metrics_);
    HttpOptions http;
    http.port = 0;
    http.served_model_names = {GetParam()};
    server_ = std::make_unique<OpenAIServer>(*engine_, metrics_, http);
    server_->start_background();
  }
  void TearDown() override {
    server_->stop();
    server_.reset();
    engine_.reset();
  }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }

  std::shared_ptr<const Tokenizer> tokenizer_;
  ServerMetrics metrics_;
  std::unique_ptr<LLMEngine> engine_;
  std::unique_ptr<OpenAIServer> server_;
};

}  // namespace

TEST_P(TinyModelServer, ServedTokensEqualEngineGreedyStreamedOrNot) {
  // The oracle: the engine's own single-sequence loop on a separate runner (its own KV cache).
  auto oracle = megamoe::engine::make_cpu_model_runner(fixture(GetParam()), quiet_options(512));
  const std::vector<std::string> prompts = {
      "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."
      " How many clips did Natalia sell altogether in April and May?\nAnswer:",
      "Hello", "The quick brown fox jumps over the lazy dog. 1234567890 你好 🙂", " \n\t spaces  ",
  };
  const int max_tokens = 24;
  std::vector<std::vector<int32_t>> expected;
  for (const std::string& p : prompts) {
    megamoe::engine::SamplingParams params;
    params.temperature = 0;
    params.max_tokens = max_tokens;
    params.ignore_eos = true;
    expected.push_back(megamoe::engine::generate(*oracle, tokenizer_->encode(p), params));
  }
  // All prompts at once, twice each (plain and streamed), so they share batches.
  std::vector<std::future<std::pair<std::vector<int32_t>, std::string>>> plain, streamed;
  for (const std::string& p : prompts) {
    const json body{{"prompt", p}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true},
                    {"return_token_ids", true}};
    plain.push_back(std::async(std::launch::async, [this, body] {
      httplib::Client client("127.0.0.1", server_->port());
      client.set_read_timeout(std::chrono::seconds(120));
      auto res = client.Post("/v1/completions", body.dump(), "application/json");
      if (!res || res->status != 200) return std::make_pair(std::vector<int32_t>{}, std::string("HTTP error"));
      const json reply = json::parse(res->body);
      return std::make_pair(reply["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
                            reply["choices"][0]["text"].get<std::string>());
    }));
    streamed.push_back(std::async(std::launch::async, [this, body] {
      const auto s = megamoe::server::testing::post_stream(server_->port(), body);
      return std::make_pair(s.tokens, s.status == 200 && s.done ? s.text : std::string("HTTP error"));
    }));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto [plain_tokens, plain_text] = plain[i].get();
    const auto [stream_tokens, stream_text] = streamed[i].get();
    EXPECT_EQ(plain_tokens, expected[i]) << "prompt " << i;
    EXPECT_EQ(stream_tokens, expected[i]) << "prompt " << i;
    EXPECT_EQ(plain_text, tokenizer_->decode(expected[i], true));
    EXPECT_EQ(stream_text, plain_text);
  }
}

TEST_P(TinyModelServer, BenchServeAndGsm8kEvalRun) {
  megamoe::client::BenchServeOptions bench;
  bench.base_url = base_url();
  bench.tokenizer = fixture(GetParam());
  bench.random_input_len = 128;
  bench.random_output_len = 4;
  bench.num_prompts = 16;
  bench.max_concurrency = 8;
  bench.ignore_eos = true;
  bench.show_progress = false;
  const json result = megamoe::client::run_bench_serve(bench);
  EXPECT_EQ(result["completed"], 16);
  EXPECT_EQ(result["failed"], 0) << result["errors"].dump();
  EXPECT_EQ(result["total_output_tokens"], 16 * 4);
  EXPECT_EQ(json::parse(result.dump()), result);

  megamoe::client::Gsm8kOptions eval;
  eval.base_url = base_url();
  eval.data_path = fixture("gsm8k");
  eval.num_questions = 20;
  eval.max_tokens = 64;  // random weights: long replies only cost CI time
  eval.concurrency = 20;
  const json scored = megamoe::client::run_gsm8k_eval(eval);
  EXPECT_EQ(scored["num_questions"], 20);
  EXPECT_EQ(scored["num_failed_requests"], 0);
  EXPECT_GE(scored["accuracy"].get<double>(), 0.0);
  EXPECT_LE(scored["invalid_rate"].get<double>(), 1.0);
  std::printf("%s: bench %.1f req/s, gsm8k accuracy %.2f invalid %.2f at %.1f questions/s\n", GetParam().c_str(),
              result["request_throughput"].get<double>(), scored["accuracy"].get<double>(),
              scored["invalid_rate"].get<double>(), scored["questions_per_s"].get<double>());
  const EngineStats stats = engine_->stats();
  EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TinyModelServer, ::testing::Values("tiny-qwen3-moe", "tiny-mixtral"),
                         [](const auto& info) { return info.param == "tiny-qwen3-moe" ? "Qwen3Moe" : "Mixtral"; });
