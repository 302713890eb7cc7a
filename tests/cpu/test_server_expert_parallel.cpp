// `serve --data-parallel-size N --enable-expert-parallel` on the CPU (N = 2, 4, 8), end to end over
// loopback HTTP: N runner ranks share one in-process CpuEpGroup (each holds E/N experts; 1 of the 8 on
// 8 ranks) and the engine steps them in lockstep. The served greedy tokens must equal one rank's (DP1)
// single-sequence generate(), alone (the other ranks idle every step) and with concurrent requests;
// no KV block may leak.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <thread>
#include <tuple>

#include "engine/generate.h"
#include "engine/model.h"
#include "megamoe/cpu_ep.h"
#include "server/openai_server.h"
#include "server_stream_client.h"

using namespace megamoe::server;
using json = nlohmann::json;

namespace {

std::string fixture(const std::string& name) { return std::string(MEGAMOE_SOURCE_DIR) + "/tests/fixtures/" + name; }

megamoe::engine::RunnerOptions quiet_options() {
  megamoe::engine::RunnerOptions options;
  options.load.progress = false;
  options.num_kv_blocks = 256;
  return options;
}

std::vector<int32_t> complete(int port, const std::string& prompt, int max_tokens) {
  const json body{{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true},
                  {"return_token_ids", true}};
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(std::chrono::seconds(120));
  auto res = client.Post("/v1/completions", body.dump(), "application/json");
  if (!res || res->status != 200) return {};
  return json::parse(res->body)["choices"][0]["token_ids"].get<std::vector<int32_t>>();
}

class ExpertParallelServer : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(ExpertParallelServer, DpEpServesTheSameGreedyTokensAsDp1) {
  const auto [model, ranks] = GetParam();
  auto tokenizer = Tokenizer::from_file(fixture(model));
  auto oracle = megamoe::engine::make_cpu_model_runner(fixture(model), quiet_options());
  const std::vector<std::string> prompts = {
      "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."
      " How many clips did Natalia sell altogether in April and May?\nAnswer:",
      "Hello", "The quick brown fox jumps over the lazy dog.", " \n\t spaces  "};
  const int max_tokens = 16;
  std::vector<std::vector<int32_t>> expected;
  for (const std::string& p : prompts) {
    megamoe::engine::SamplingParams params;
    params.temperature = 0;
    params.max_tokens = max_tokens;
    params.ignore_eos = true;
    expected.push_back(megamoe::engine::generate(*oracle, tokenizer->encode(p), params));
  }

  megamoe::engine::RunnerOptions options = quiet_options();
  options.max_tokens_per_step = 16;  // the long prompt is prefilled in chunks; MoE pieces differ by rank
  options.cpu_ep = std::make_shared<megamoe::CpuEpGroup>(ranks, /*timeout_seconds=*/120.0);
  std::vector<std::unique_ptr<megamoe::engine::ModelRunner>> runners;
  for (int rank = 0; rank < ranks; ++rank) {
    options.ep_rank = rank;
    runners.push_back(megamoe::engine::make_cpu_model_runner(fixture(model), options));
  }
  EngineOptions engine_options;
  engine_options.max_num_batched_tokens = options.max_tokens_per_step;
  engine_options.max_model_len = 1024;
  engine_options.lockstep_ranks = true;
  ServerMetrics metrics;
  LLMEngine engine(std::move(runners), tokenizer, engine_options, &metrics);
  HttpOptions http;
  http.port = 0;
  http.served_model_names = {model};
  OpenAIServer server(engine, metrics, http);
  server.start_background();
  const int port = server.port();

  // One request alone: every other rank idles through every step.
  EXPECT_EQ(complete(port, prompts[1], max_tokens), expected[1]);
  // All at once, plain and streamed (8 requests): the ranks busy with different token counts per step.
  std::vector<std::future<std::vector<int32_t>>> plain, streamed;
  for (const std::string& p : prompts) {
    plain.push_back(std::async(std::launch::async, [&, p] { return complete(port, p, max_tokens); }));
    streamed.push_back(std::async(std::launch::async, [&, p] {
      const json body{{"prompt", p}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true},
                      {"return_token_ids", true}};
      return megamoe::server::testing::post_stream(port, body).tokens;
    }));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(plain[i].get(), expected[i]) << "prompt " << i;
    EXPECT_EQ(streamed[i].get(), expected[i]) << "prompt " << i << " (streamed)";
  }
  EngineStats stats = engine.stats();
  for (int i = 0; i < 100 && (stats.running + stats.waiting > 0 || stats.kv_blocks_free != stats.kv_blocks_total); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    stats = engine.stats();
  }
  EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total) << "KV blocks leaked";
  EXPECT_EQ(stats.running + stats.waiting, 0);
  ASSERT_EQ(stats.requests_per_rank.size(), static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) EXPECT_GT(stats.requests_per_rank[r], 0) << "rank " << r << " never served";
  server.stop();
}

INSTANTIATE_TEST_SUITE_P(TinyModels, ExpertParallelServer,
                         ::testing::Combine(::testing::Values("tiny-qwen3-moe", "tiny-mixtral"), ::testing::Values(2, 4, 8)),
                         [](const auto& info) {
                           std::string name = std::get<0>(info.param) + "_dp" + std::to_string(std::get<1>(info.param));
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
