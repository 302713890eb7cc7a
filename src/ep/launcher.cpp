// launch_ranks(): one process per GPU, each told its rank, the group size and a fresh rendezvous file.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "megamoe/ep.h"
#include "megamoe/error.h"

namespace megamoe {

bool launched_rank_from_env(LaunchedRank* out) {
  const char* rank = std::getenv(kEpRankEnv);
  const char* ranks = std::getenv(kEpRanksEnv);
  const char* rendezvous = std::getenv(kEpRendezvousEnv);
  if (!rank || !ranks || !rendezvous) return false;
  out->rank = std::atoi(rank);
  out->ranks = std::atoi(ranks);
  out->rendezvous = rendezvous;
  MEGAMOE_CHECK(out->ranks >= 1 && out->ranks <= kMaxEpRanks && out->rank >= 0 && out->rank < out->ranks,
                kEpRankEnv, " = ", rank, " / ", kEpRanksEnv, " = ", ranks, " out of range");
  return true;
}

int launch_ranks(int ranks, const std::vector<std::string>& argv, int timeout_s) {
  MEGAMOE_CHECK(ranks >= 1 && ranks <= kMaxEpRanks, "ranks = ", ranks, " must be in [1, ", kMaxEpRanks, "]");
  MEGAMOE_CHECK(!argv.empty(), "launch_ranks: empty argv");
  std::random_device seed;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("megamoe-rdv-" + std::to_string(getpid()) + "-" + std::to_string(seed()));
  std::filesystem::create_directories(dir);
  const std::string rendezvous = "file:" + (dir / "nccl_id").string();

  std::vector<pid_t> children;
  for (int rank = 0; rank < ranks; ++rank) {
    const pid_t pid = fork();
    MEGAMOE_CHECK(pid >= 0, "fork failed for rank ", rank);
    if (pid == 0) {
      setenv(kEpRankEnv, std::to_string(rank).c_str(), 1);
      setenv(kEpRanksEnv, std::to_string(ranks).c_str(), 1);
      setenv(kEpRendezvousEnv, rendezvous.c_str(), 1);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);  // exec failed (child process: no exceptions across fork)
    }
    children.push_back(pid);
  }

  int first_failure = 0;
  size_t remaining = children.size();
  std::vector<bool> done(children.size(), false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  bool killed = false;
  auto failed_at = std::chrono::steady_clock::time_point::max();
  while (remaining > 0) {
    for (size_t i = 0; i < children.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      const pid_t got = waitpid(children[i], &status, WNOHANG);
      if (got == 0) continue;
      done[i] = true;
      --remaining;
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (code != 0 && first_failure == 0) {
        first_failure = code;
        failed_at = std::chrono::steady_clock::now();
      }
    }
    if (remaining == 0) break;
    const auto now = std::chrono::steady_clock::now();
    // A failed rank leaves its peers blocked in collectives: give them 30 s, then stop them.
    const bool give_up = now > deadline || (first_failure != 0 && now - failed_at > std::chrono::seconds(30));
    if (give_up && !killed) {
      for (size_t i = 0; i < children.size(); ++i)
        if (!done[i]) kill(children[i], SIGKILL);
      killed = true;
      if (first_failure == 0) first_failure = 124;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return first_failure;
}

int relaunch_self_on_ranks(int ranks, int timeout_s) {
  std::vector<std::string> argv{std::filesystem::read_symlink("/proc/self/exe").string()};
  std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);
  std::string arg;
  for (bool first = true; std::getline(cmdline, arg, '\0'); first = false)
    if (!first) argv.push_back(arg);
  return launch_ranks(ranks, argv, timeout_s);
}

}  // namespace megamoe
