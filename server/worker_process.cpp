#include "server/worker_process.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "megamoe/ep.h"
#include "megamoe/error.h"

namespace megamoe::server {
namespace {

sockaddr_un unix_address(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  MEGAMOE_CHECK(path.size() < sizeof(address.sun_path), "worker socket path ", path, " is ", path.size(),
                " bytes, must be < ", sizeof(address.sun_path));
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  return address;
}

std::string exit_status_text(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("signal ") + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

// Waits for `pid` up to `timeout`, then SIGKILLs it; returns the wait status.
int reap(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (true) {
    const pid_t got = waitpid(pid, &status, WNOHANG);
    if (got == pid || got < 0) return status;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

RemoteRunner::RemoteRunner(int rank, int fd, pid_t pid) : rank_(rank), fd_(fd), pid_(pid) {
  FrameHeader header;
  std::vector<uint8_t> payload;
  MEGAMOE_CHECK(read_frame(fd_, &header, &payload, who()), who(), " closed its socket before its hello");
  if (header.kind == FrameKind::kError)
    MEGAMOE_FAIL(who(), " failed at startup: ", decode_error(payload.data(), payload.size()));
  MEGAMOE_CHECK(header.kind == FrameKind::kHello, who(), ": expected a hello frame, got kind ", int(header.kind));
  hello_ = decode_hello(payload.data(), payload.size());
}

RemoteRunner::~RemoteRunner() {
  try {
    if (failure().empty()) write_frame(fd_, encode_stop(), who());
  } catch (const Error&) {
  }
  ::close(fd_);
  if (pid_ > 0) reap(pid_, std::chrono::seconds(10));
}

std::string RemoteRunner::who() const {
  return "serve worker rank " + std::to_string(rank_) + " (pid " + std::to_string(pid_) + ")";
}

std::string RemoteRunner::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void RemoteRunner::die(const std::string& what) {
  std::string message = who() + " is gone: " + what;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    message += " (" + exit_status_text(status) + ")";
    pid_ = -1;  // reaped
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failure_ = message;
  }
  MEGAMOE_FAIL(message);
}

void RemoteRunner::exchange(const std::vector<uint8_t>& frame, FrameKind expected, std::vector<uint8_t>* payload) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    MEGAMOE_CHECK(failure_.empty(), failure_);
  }
  FrameHeader header;
  bool got = false;
  try {
    write_frame(fd_, frame, who());
    got = read_frame(fd_, &header, payload, who());
  } catch (const Error& e) {
    die(e.what());
  }
  if (!got) die("socket closed during a step");
  if (header.kind == FrameKind::kError) MEGAMOE_FAIL(decode_error(payload->data(), payload->size()));
  if (header.kind != expected) die("answered a step with frame kind " + std::to_string(int(header.kind)));
}

engine::StepOutput RemoteRunner::step(const engine::StepBatch& batch) {
  std::vector<uint8_t> payload;
  exchange(encode_step(batch), FrameKind::kOutput, &payload);
  return decode_output(payload.data(), payload.size());
}

std::vector<int32_t> RemoteRunner::step_and_sample(const engine::StepBatch& batch,
                                                   const std::vector<engine::ChunkSampling>& sampling) {
  std::vector<uint8_t> payload;
  exchange(encode_sample_step(batch, sampling), FrameKind::kTokens, &payload);
  return decode_tokens(payload.data(), payload.size());
}

std::vector<std::unique_ptr<engine::ModelRunner>> start_worker_processes(int ranks, const std::vector<std::string>& argv,
                                                                         int timeout_s) {
  MEGAMOE_CHECK(ranks >= 1 && ranks <= kMaxEpRanks, "worker processes: ranks = ", ranks, " must be in [1, ",
                kMaxEpRanks, "]");
  MEGAMOE_CHECK(!argv.empty(), "start_worker_processes: empty argv");
  std::random_device seed;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("megamoe-serve-" + std::to_string(getpid()) + "-" + std::to_string(seed()));
  std::filesystem::create_directories(dir);
  struct Pending {
    int listen_fd = -1;
    pid_t pid = -1;
  };
  std::vector<Pending> pending(static_cast<size_t>(ranks));
  std::vector<std::unique_ptr<engine::ModelRunner>> runners;
  auto cleanup = [&] {
    for (auto& p : pending) {
      if (p.listen_fd >= 0) ::close(p.listen_fd);
      if (p.pid > 0) {
        kill(p.pid, SIGKILL);
        waitpid(p.pid, nullptr, 0);
      }
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  };
  try {
    const std::string rendezvous = "file:" + (dir / "nccl_id").string();
    for (int rank = 0; rank < ranks; ++rank) {
      const std::string path = (dir / ("rank" + std::to_string(rank) + ".sock")).string();
      const sockaddr_un address = unix_address(path);
      Pending& p = pending[size_t(rank)];
      p.listen_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      MEGAMOE_CHECK(p.listen_fd >= 0, "worker socket: ", std::strerror(errno));
      MEGAMOE_CHECK(::bind(p.listen_fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0 &&
                        ::listen(p.listen_fd, 1) == 0,
                    "worker socket ", path, ": ", std::strerror(errno));
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      const std::string rank_text = std::to_string(rank), ranks_text = std::to_string(ranks);
      const pid_t parent = getpid();
      p.pid = fork();
      MEGAMOE_CHECK(p.pid >= 0, "fork failed for serve worker rank ", rank);
      if (p.pid == 0) {
        // Child: dies with the front-end; signals the front-end blocks are its own business.
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1);
        setenv(kServeWorkerSocketEnv, path.c_str(), 1);
        setenv(kEpRankEnv, rank_text.c_str(), 1);
        setenv(kEpRanksEnv, ranks_text.c_str(), 1);
        setenv(kEpRendezvousEnv, rendezvous.c_str(), 1);
        execv(args[0], args.data());
        _exit(127);  // exec failed (no exceptions across fork)
      }
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    for (int rank = 0; rank < ranks; ++rank) {
      Pending& p = pending[size_t(rank)];
      int fd = -1;
      while (fd < 0) {
        int status = 0;
        if (waitpid(p.pid, &status, WNOHANG) == p.pid) {
          p.pid = -1;
          MEGAMOE_FAIL("serve worker rank ", rank, " exited before connecting: ", exit_status_text(status));
        }
        MEGAMOE_CHECK(std::chrono::steady_clock::now() < deadline, "serve worker rank ", rank, " did not connect within ",
                      timeout_s, " s");
        pollfd waiting{p.listen_fd, POLLIN, 0};
        if (::poll(&waiting, 1, 100) > 0) fd = ::accept4(p.listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      }
      ::close(p.listen_fd);
      p.listen_fd = -1;
      const pid_t pid = p.pid;
      p.pid = -1;  // the RemoteRunner owns it from here (its destructor reaps it)
      try {
        runners.push_back(std::make_unique<RemoteRunner>(rank, fd, pid));
      } catch (...) {
        ::close(fd);
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
        throw;
      }
    }
  } catch (...) {
    runners.clear();
    cleanup();
    throw;
  }
  cleanup();
  return runners;
}

void serve_worker_steps(engine::ModelRunner& runner, const std::string& socket_path) {
  const std::string who = "serve worker on " + socket_path;
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  MEGAMOE_CHECK(fd >= 0, who, ": socket: ", std::strerror(errno));
  const sockaddr_un address = unix_address(socket_path);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    const int err = errno;
    ::close(fd);
    MEGAMOE_FAIL(who, ": connect: ", std::strerror(err));
  }
  try {
    write_frame(fd, encode_hello({runner.info(), runner.num_kv_blocks(), runner.kv_block_size()}), who);
    FrameHeader header;
    std::vector<uint8_t> payload;
    while (read_frame(fd, &header, &payload, who) && header.kind != FrameKind::kStop) {
      MEGAMOE_CHECK(header.kind == FrameKind::kStep || header.kind == FrameKind::kSampleStep, who,
                    ": expected a step frame, got kind ", int(header.kind));
      std::vector<uint8_t> reply;
      try {
        if (header.kind == FrameKind::kStep) {
          reply = encode_output(runner.step(decode_step(payload.data(), payload.size())));
        } else {
          const SampleStep step = decode_sample_step(payload.data(), payload.size());
          reply = encode_tokens(runner.step_and_sample(step.batch, step.sampling));
        }
      } catch (const Error& e) {
        reply = encode_error(e.what());
      }
      write_frame(fd, reply, who);
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

}  // namespace megamoe::server
