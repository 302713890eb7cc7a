// The `megamoe serve` binary itself: starts on the tiny fixture with an ephemeral port, answers a
// completion, and exits 0 on SIGTERM. Also the engine's lockstep mode (every rank steps together).
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "server/llm_engine.h"
#include "server_fake_runner.h"

using json = nlohmann::json;

TEST(ServerCli, ServeStartsAnswersAndStopsOnSigterm) {
  const std::string binary = std::string(MEGAMOE_BINARY_DIR) + "/megamoe";
  const std::string model = std::string(MEGAMOE_SOURCE_DIR) + "/tests/fixtures/tiny-qwen3-moe";
  if (access(binary.c_str(), X_OK) != 0) GTEST_SKIP() << binary << " not built";
  int err_pipe[2];
  ASSERT_EQ(pipe(err_pipe), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(err_pipe[1], STDERR_FILENO);
    close(err_pipe[0]);
    execl(binary.c_str(), binary.c_str(), "serve", model.c_str(), "--port", "0", "--served-model-name", "tiny",
          "--max-model-len", "512", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(err_pipe[1]);
  // Read stderr (bounded: 30 s) until the startup line names the port.
  std::string log;
  int port = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  const std::regex port_line(R"(on http://127\.0\.0\.1:(\d+) )");
  while (port == 0 && std::chrono::steady_clock::now() < deadline) {
    char buffer[4096];
    const ssize_t n = read(err_pipe[0], buffer, sizeof(buffer));
    if (n <= 0) break;
    log.append(buffer, size_t(n));
    std::smatch match;
    if (std::regex_search(log, match, port_line)) port = std::stoi(match[1]);
  }
  if (port == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    FAIL() << "no port in the startup log:\n" << log;
  }
  EXPECT_NE(log.find("max_model_len 512"), std::string::npos) << log;
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(std::chrono::seconds(60));
  auto res = client.Post("/v1/completions",
                         json{{"model", "tiny"}, {"prompt", "Question: What is 2 + 3?\nAnswer:"}, {"max_tokens", 8},
                              {"temperature", 0}, {"ignore_eos", true}}.dump(),
                         "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["usage"]["completion_tokens"], 8);
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int status = -1;
  for (int i = 0; i < 300 && waitpid(pid, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (status == -1) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "server did not stop within 15 s of SIGTERM";
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  close(err_pipe[0]);
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
