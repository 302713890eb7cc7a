// `megamoe serve --worker-processes`: the front-end (HTTP, tokenizer, LLMEngine, schedulers, KV block
// managers) stays in the serve process; each data-parallel rank's ModelRunner lives in a worker
// process of its own, reached over a Unix socket with the frames of server/step_frame.h.
//   front-end: start_worker_processes() -> one RemoteRunner per rank, handed to LLMEngine unchanged.
//   worker   : the same binary and command line, started with kServeWorkerSocketEnv and the EP
//              environment of launch_ranks (MEGAMOE_EP_RANK / _RANKS / _RENDEZVOUS); it builds its
//              runner, connects, sends kHello and answers kStep frames until kStop or EOF.
// NOTES: a worker's megamoe::Error in step() comes back as a kError frame and is rethrown by
// RemoteRunner::step (the worker stays up: the batch was bad, not the worker). A worker that dies
// makes every later step() throw, and failure() non-empty, which LLMEngine turns into 503s.
#pragma once

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/runner.h"
#include "server/step_frame.h"

namespace megamoe::server {

inline constexpr const char* kServeWorkerSocketEnv = "MEGAMOE_SERVE_WORKER_SOCKET";

class RemoteRunner : public engine::ModelRunner {
 public:
  // Takes the connected socket `fd` of worker `rank` (process `pid`) and reads its kHello.
  RemoteRunner(int rank, int fd, pid_t pid);
  ~RemoteRunner() override;  // sends kStop, waits for the worker (SIGKILL after 10 s)
  const engine::ModelInfo& info() const override { return hello_.info; }
  int kv_block_size() const override { return hello_.kv_block_size; }
  int num_kv_blocks() const override { return hello_.num_kv_blocks; }
  engine::StepOutput step(const engine::StepBatch& batch) override;
  // Sampling runs in the worker: only token ids come back (kSampleStep -> kTokens).
  std::vector<int32_t> step_and_sample(const engine::StepBatch& batch,
                                       const std::vector<engine::ChunkSampling>& sampling) override;
  std::string failure() const override;

 private:
  // Sends `frame`, waits for the answer; a kError answer is rethrown, a lost worker is die().
  void exchange(const std::vector<uint8_t>& frame, FrameKind expected, std::vector<uint8_t>* payload);
  [[noreturn]] void die(const std::string& what);
  std::string who() const;
  int rank_;
  int fd_;
  pid_t pid_;
  WorkerHello hello_;
  mutable std::mutex mutex_;
  std::string failure_;
};

// Starts `ranks` copies of `argv` (argv[0] = the executable), each told its socket through
// kServeWorkerSocketEnv and its rank through the EP environment, and waits (at most timeout_s) for
// each to connect and say hello. A worker that exits first fails this with its exit status.
std::vector<std::unique_ptr<engine::ModelRunner>> start_worker_processes(int ranks, const std::vector<std::string>& argv,
                                                                         int timeout_s = 600);

// Worker side: connects to `socket_path`, sends the runner's hello and serves steps until kStop or
// the front-end closes the socket.
void serve_worker_steps(engine::ModelRunner& runner, const std::string& socket_path);

}  // namespace megamoe::server
