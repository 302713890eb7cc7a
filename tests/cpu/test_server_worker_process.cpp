// RemoteRunner against a worker loop (serve_worker_steps) in a forked process: steps give the same
// logits as the runner stepped locally, a worker-side megamoe::Error is rethrown in the front-end
// (and the worker keeps serving), and a killed worker makes step() throw and failure() say why.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>

#include "megamoe/error.h"
#include "server/worker_process.h"
#include "server_fake_runner.h"

namespace {

using megamoe::server::testing::FakeRunner;

TEST(ServeWorkerProcess, RemoteRunnerStepsRethrowsWorkerErrorsAndReportsADeadWorker) {
  const auto path = std::filesystem::temp_directory_path() / ("megamoe-worker-test-" + std::to_string(getpid()) + ".sock");
  std::filesystem::remove(path);
  const int listen_fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(listen_fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(bind(listen_fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listen_fd, 1), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(listen_fd);
    int code = 0;
    try {
      FakeRunner runner(97, 4, 32, 128, {3});
      megamoe::server::serve_worker_steps(runner, path.string());
    } catch (...) {
      code = 3;
    }
    _exit(code);
  }
  const int fd = accept(listen_fd, nullptr, nullptr);
  close(listen_fd);
  std::filesystem::remove(path);
  ASSERT_GE(fd, 0);
  megamoe::server::RemoteRunner remote(0, fd, pid);
  // The hello carried the worker's runner description.
  EXPECT_EQ(remote.info().vocab_size, 97);
  EXPECT_EQ(remote.info().model_type, "fake_hash");
  EXPECT_EQ(remote.info().eos_token_ids, std::vector<int32_t>{3});
  EXPECT_EQ(remote.kv_block_size(), 4);
  EXPECT_EQ(remote.num_kv_blocks(), 32);

  // A prefill of two sequences then a decode: same logits, bit for bit, as a local runner.
  FakeRunner local(97, 4, 32, 128, {3});
  megamoe::engine::StepBatch prefill;
  prefill.chunks.push_back({7, {11, 12, 13, 14, 15}, 0, {2, 5}, true});
  prefill.chunks.push_back({8, {21, 22}, 0, {9}, false});
  megamoe::engine::StepBatch decode;
  decode.chunks.push_back({7, {16}, 5, {2, 5}, true});
  decode.chunks.push_back({8, {23}, 2, {9}, true});
  for (const auto* batch : {&prefill, &decode}) {
    const auto want = local.step(*batch);
    const auto got = remote.step(*batch);
    ASSERT_EQ(got.logits.size(), want.logits.size());
    for (size_t r = 0; r < want.logits.size(); ++r) EXPECT_EQ(got.logits[r], want.logits[r]) << "row " << r;
  }
  // Sampling in the worker: seeded temperature / top-p draws give the tokens the local runner samples
  // with the same (seed, draws), and greedy rows the argmax.
  const std::vector<megamoe::engine::ChunkSampling> sampling = {{0.9f, 0.8f, 1234, 17}, {0.0f, 1.0f, 5, 0}};
  const auto want_tokens = local.step_and_sample(decode, sampling);
  const auto got_tokens = remote.step_and_sample(decode, sampling);
  EXPECT_EQ(got_tokens, want_tokens);
  ASSERT_EQ(got_tokens.size(), 2u);
  // And a different draw count moves along the stream (sampled, not constant): over 32 draw counts
  // the tokens are not all the same.
  std::vector<int32_t> along;
  for (int64_t draws = 0; draws < 32; ++draws) along.push_back(remote.step_and_sample(decode, {{1.5f, 1.0f, 1234, draws}, {0.0f, 1.0f, 5, 0}})[0]);
  EXPECT_NE(std::count(along.begin(), along.end(), along.front()), 32);
  // The worker's error comes back as the same message; the worker still serves the next step.
  megamoe::engine::StepBatch bad;
  bad.chunks.push_back({9, {1, 2, 3, 4, 5}, 0, {1}, true});  // 5 tokens, one 4-token block
  std::string message;
  try {
    remote.step(bad);
  } catch (const megamoe::Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("block table of seq 9 covers 4 positions, needs 5"), std::string::npos) << message;
  EXPECT_TRUE(remote.failure().empty());
  EXPECT_EQ(remote.step({}).logits.size(), 0u);  // the empty (lockstep) step
  // A dead worker: step() throws naming the rank, and failure() keeps saying so.
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  std::string dead;
  try {
    remote.step(decode);
  } catch (const megamoe::Error& e) {
    dead = e.what();
  }
  EXPECT_NE(dead.find("serve worker rank 0"), std::string::npos) << dead;
  EXPECT_NE(dead.find("is gone"), std::string::npos) << dead;
  EXPECT_NE(remote.failure().find("is gone"), std::string::npos) << remote.failure();
  EXPECT_THROW(remote.step({}), megamoe::Error);
}

}  // namespace
