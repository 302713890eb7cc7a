// Runs the built `megamoe` binary (MEGAMOE_BINARY_DIR, set by tests/CMakeLists.txt) with arguments and
// collects its exit code and combined stdout + stderr: the end-to-end tests of the CLI.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace megamoe::testing {

struct CommandResult {
  int exit_code = -1;  // -1: not started, or killed by a signal
  std::string output;
};

inline CommandResult run_megamoe(const std::string& args) {
  const std::string binary = std::string(MEGAMOE_BINARY_DIR) + "/megamoe";
  CommandResult run;
  if (!std::filesystem::exists(binary)) {
    ADD_FAILURE() << binary << " is missing: build the megamoe target before running the tests";
    return run;
  }
  FILE* pipe = popen((binary + " " + args + " 2>&1").c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed";
    return run;
  }
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.output.append(buffer, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

}  // namespace megamoe::testing
