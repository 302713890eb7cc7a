// The `megamoe serve` binary itself: starts on the tiny fixture with an ephemeral port, answers a
// completion, and exits 0 on SIGTERM. Also the engine's lockstep mode (every rank steps together).
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "server/llm_engine.h"
#include "server_fake_runner.h"

using json = nlohmann::json;

namespace {

const std::string kBinary = std::string(MEGAMOE_BINARY_DIR) + "/megamoe";
const std::string kModel = std::string(MEGAMOE_SOURCE_DIR) + "/tests/fixtures/tiny-qwen3-moe";

struct ServeRun {
  std::string log;  // stderr up to the startup line (or all of it when the server exits)
  std::vector<int32_t> tokens;  // the greedy completion's token ids
  std::vector<std::vector<int32_t>> concurrent_tokens;  // the extra concurrent completions' ids
  int exit_status = -1;
};

std::vector<int32_t> greedy_completion(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(std::chrono::seconds(60));
  auto res = client.Post("/v1/completions",
                         json{{"model", "tiny"}, {"prompt", "Question: What is 2 + 3?\nAnswer:"}, {"max_tokens", 8},
                              {"temperature", 0}, {"ignore_eos", true}, {"return_token_ids", true}}.dump(),
                         "application/json");
  EXPECT_TRUE(res);
  if (!res) return {};
  EXPECT_EQ(res->status, 200) << res->body;
  if (res->status != 200) return {};
  const json reply = json::parse(res->body);
  EXPECT_EQ(reply["usage"]["completion_tokens"], 8);
  return reply["choices"][0]["token_ids"].get<std::vector<int32_t>>();
}

// Child processes of `pid` (its worker processes under --worker-processes).
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> children;
  std::ifstream file("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  for (pid_t child; file >> child;) children.push_back(child);
  return children;
}

// Starts `megamoe serve` with `extra` flags, asks one greedy completion, stops it with SIGTERM.
// A server that exits at startup returns its log and exit status without a completion.
// `concurrent` more completions then run at once (spread over the ranks); `after(port, pid)` runs
// before SIGTERM.
ServeRun serve_once(const std::vector<std::string>& extra, int concurrent = 0,
                    const std::function<void(int, pid_t)>& after = {}) {
  ServeRun run;
  std::vector<std::string> args = {kBinary, "serve", kModel, "--port", "0", "--served-model-name", "tiny",
                                   "--max-model-len", "512"};
  args.insert(args.end(), extra.begin(), extra.end());
  int err_pipe[2];
  EXPECT_EQ(pipe(err_pipe), 0);
  const pid_t pid = fork();
  EXPECT_GE(pid, 0);
  if (pid == 0) {
    dup2(err_pipe[1], STDERR_FILENO);
    close(err_pipe[0]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(kBinary.c_str(), argv.data());
    _exit(127);
  }
  close(err_pipe[1]);
  // Read stderr (bounded: 30 s) until the startup line names the port.
  int port = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  const std::regex port_line(R"(on http://127\.0\.0\.1:(\d+) )");
  while (port == 0 && std::chrono::steady_clock::now() < deadline) {
    char buffer[4096];
    const ssize_t n = read(err_pipe[0], buffer, sizeof(buffer));
    if (n <= 0) break;
    run.log.append(buffer, size_t(n));
    std::smatch match;
    if (std::regex_search(run.log, match, port_line)) port = std::stoi(match[1]);
  }
  if (port == 0) {
    for (int i = 0; i < 100 && waitpid(pid, &run.exit_status, WNOHANG) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (run.exit_status == -1) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    close(err_pipe[0]);
    return run;
  }
  run.tokens = greedy_completion(port);
  std::vector<std::future<std::vector<int32_t>>> others;
  for (int i = 0; i < concurrent; ++i) others.push_back(std::async(std::launch::async, greedy_completion, port));
  for (auto& other : others) run.concurrent_tokens.push_back(other.get());
  if (after) after(port, pid);
  EXPECT_EQ(kill(pid, SIGTERM), 0);
  int status = -1;
  for (int i = 0; i < 300 && waitpid(pid, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (status == -1) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    ADD_FAILURE() << "server did not stop within 15 s of SIGTERM";
  }
  run.exit_status = status;
  close(err_pipe[0]);
  return run;
}

}  // namespace

TEST(ServerCli, ServeStartsAnswersAndStopsOnSigterm) {
  if (access(kBinary.c_str(), X_OK) != 0) GTEST_SKIP() << kBinary << " not built";
  const ServeRun run = serve_once({});
  ASSERT_EQ(run.tokens.size(), 8u) << run.log;
  EXPECT_NE(run.log.find("max_model_len 512"), std::string::npos) << run.log;
  EXPECT_TRUE(WIFEXITED(run.exit_status) && WEXITSTATUS(run.exit_status) == 0) << "status " << run.exit_status;
}

TEST(ServerCli, DataParallelExpertParallelServesTheSameTokensAsOneRank) {
  if (access(kBinary.c_str(), X_OK) != 0) GTEST_SKIP() << kBinary << " not built";
  const ServeRun one = serve_once({});
  const ServeRun ep = serve_once({"--data-parallel-size", "2", "--enable-expert-parallel"});
  ASSERT_EQ(one.tokens.size(), 8u) << one.log;
  EXPECT_EQ(ep.tokens, one.tokens) << ep.log;
  EXPECT_TRUE(WIFEXITED(ep.exit_status) && WEXITSTATUS(ep.exit_status) == 0) << "status " << ep.exit_status;
  // Where it cannot run (GPU DP+EP needs one process per GPU) serve refuses at startup, saying why.
  const ServeRun refused =
      serve_once({"--data-parallel-size", "2", "--enable-expert-parallel", "--moe-backend", "staged"});
  EXPECT_TRUE(refused.tokens.empty());
  EXPECT_TRUE(WIFEXITED(refused.exit_status) && WEXITSTATUS(refused.exit_status) != 0) << refused.log;
  EXPECT_NE(refused.log.find("needs one process per GPU"), std::string::npos) << refused.log;
}

TEST(ServerEngine, LockstepRanksStepTogetherWithEmptyBatches) {
  using megamoe::server::testing::FakeRunner;
  auto tokenizer = megamoe::server::Tokenizer::from_file(std::string(MEGAMOE_SOURCE_DIR) + "/tests/fixtures/tokenizer");
  std::vector<std::unique_ptr<megamoe::engine::ModelRunner>> runners;
  std::vector<FakeRunner*> fakes;
  for (int r = 0; r < 2; ++r) {
    runners.push_back(std::make_unique<FakeRunner>(2048, 16, 64, 4096, std::vector<int32_t>{2045}));
    fakes.push_back(static_cast<FakeRunner*>(runners.back().get()));
  }
  megamoe::server::EngineOptions options;
  options.lockstep_ranks = true;
  megamoe::server::LLMEngine engine(std::move(runners), tokenizer, options);
  // One request: only one rank has work, the other must still step every time.
  megamoe::engine::SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 10;
  params.ignore_eos = true;
  std::promise<std::vector<int32_t>> done;
  std::vector<int32_t> tokens;
  auto submitted = engine.submit({1, 2, 3}, params, [&](megamoe::server::GenerationUpdate&& u) {
    tokens.insert(tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
    if (u.finished) done.set_value(tokens);
  });
  ASSERT_EQ(submitted.status, megamoe::server::SubmitResult::kOk);
  auto future = done.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(future.get(), megamoe::server::testing::reference_greedy({1, 2, 3}, 2048, 10, {2045}, true));
  EXPECT_EQ(fakes[0]->steps.load(), 10);
  EXPECT_EQ(fakes[1]->steps.load(), 10);
}

TEST(ServerCli, WorkerProcessesServeTheSameTokensAsOneRankInProcess) {
  if (access(kBinary.c_str(), X_OK) != 0) GTEST_SKIP() << kBinary << " not built";
  const ServeRun one = serve_once({});
  ASSERT_EQ(one.tokens.size(), 8u) << one.log;
  // DP2, each rank's CPU runner in a worker process of its own; four concurrent requests land on both.
  std::vector<pid_t> workers;
  std::string metrics;
  const ServeRun two = serve_once({"--data-parallel-size", "2", "--worker-processes"}, 4, [&](int port, pid_t pid) {
    workers = children_of(pid);
    httplib::Client client("127.0.0.1", port);
    if (auto res = client.Get("/metrics")) metrics = res->body;
  });
  // Both workers served requests (the engine balances new requests over the ranks).
  for (const std::string rank : {"0", "1"}) {
    const std::regex assigned("megamoe_rank_requests_total\\{rank=\"" + rank + "\"\\} ([0-9]+)");
    std::smatch match;
    ASSERT_TRUE(std::regex_search(metrics, match, assigned)) << metrics;
    EXPECT_GE(std::stoi(match[1]), 1) << "rank " << rank << "\n" << metrics;
  }
  EXPECT_NE(two.log.find("dp 2 (worker processes)"), std::string::npos) << two.log;
  EXPECT_EQ(workers.size(), 2u) << "worker processes of the server";
  EXPECT_EQ(two.tokens, one.tokens) << two.log;
  ASSERT_EQ(two.concurrent_tokens.size(), 4u);
  for (const auto& tokens : two.concurrent_tokens) EXPECT_EQ(tokens, one.tokens);
  EXPECT_TRUE(WIFEXITED(two.exit_status) && WEXITSTATUS(two.exit_status) == 0) << "status " << two.exit_status;
  // The workers exit with the front-end.
  for (pid_t worker : workers) EXPECT_NE(kill(worker, 0), 0) << "worker " << worker << " outlived the server";
}

// Seeded temperature sampling runs in the worker processes; the same seed gives the same tokens as
// sampling in the in-process DP1 engine.
TEST(ServerCli, WorkerProcessesSampleSeededRequestsLikeOneRankInProcess) {
  if (access(kBinary.c_str(), X_OK) != 0) GTEST_SKIP() << kBinary << " not built";
  auto sampled = [](int port, int64_t seed) {
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(std::chrono::seconds(60));
    auto res = client.Post("/v1/completions",
                           json{{"model", "tiny"}, {"prompt", "Once upon a time"}, {"max_tokens", 12},
                                {"temperature", 1.0}, {"top_p", 0.95}, {"seed", seed}, {"ignore_eos", true},
                                {"return_token_ids", true}}.dump(),
                           "application/json");
    EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no reply");
    return res && res->status == 200 ? json::parse(res->body)["choices"][0]["token_ids"].get<std::vector<int32_t>>()
                                     : std::vector<int32_t>{};
  };
  std::vector<std::vector<int32_t>> one_rank, workers;
  serve_once({}, 0, [&](int port, pid_t) {
    for (int64_t seed : {7, 8, 7}) one_rank.push_back(sampled(port, seed));
  });
  serve_once({"--data-parallel-size", "2", "--worker-processes"}, 0, [&](int port, pid_t) {
    for (int64_t seed : {7, 8, 7}) workers.push_back(sampled(port, seed));
  });
  ASSERT_EQ(one_rank.size(), 3u);
  ASSERT_EQ(one_rank[0].size(), 12u);
  EXPECT_EQ(workers, one_rank);
  EXPECT_EQ(one_rank[0], one_rank[2]);  // same seed, same tokens
  EXPECT_NE(one_rank[0], one_rank[1]);  // a different seed samples differently
}

TEST(ServerCli, DeadWorkerProcessFailsRequestsAndTheServerAnswers503) {
  if (access(kBinary.c_str(), X_OK) != 0) GTEST_SKIP() << kBinary << " not built";
  std::string first_error, second_error;
  int first_status = 0, second_status = 0;
  const ServeRun run = serve_once({"--data-parallel-size", "2", "--worker-processes"}, 0, [&](int port, pid_t pid) {
    const std::vector<pid_t> workers = children_of(pid);
    ASSERT_EQ(workers.size(), 2u);
    httplib::Client healthy("127.0.0.1", port);
    auto before = healthy.Get("/health");
    ASSERT_TRUE(before);
    EXPECT_EQ(before->status, 200);
    for (pid_t worker : workers) kill(worker, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(std::chrono::seconds(30));
    const std::string body = json{{"model", "tiny"}, {"prompt", "Hello"}, {"max_tokens", 4}, {"temperature", 0}}.dump();
    // The request that finds the worker dead fails with its error; every later one gets 503.
    auto first = client.Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(first);
    first_status = first->status;
    first_error = first->body;
    auto second = client.Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(second);
    second_status = second->status;
    second_error = second->body;
    auto health = client.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 503) << health->body;
  });
  ASSERT_EQ(run.tokens.size(), 8u) << run.log;
  EXPECT_NE(first_status, 200) << first_error;
  EXPECT_NE(first_error.find("serve worker rank"), std::string::npos) << first_error;
  EXPECT_EQ(second_status, 503) << second_error;
  EXPECT_NE(second_error.find("serve worker rank"), std::string::npos) << second_error;
  EXPECT_NE(second_error.find("is gone"), std::string::npos) << second_error;
  EXPECT_TRUE(WIFEXITED(run.exit_status) && WEXITSTATUS(run.exit_status) == 0) << "status " << run.exit_status;
}
