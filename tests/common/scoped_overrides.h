// Process-wide settings a test changes for one scope and restores at its end, so that a suite run with a setting in
// its environment (the device scripts set MEGAMOE_* switches) finds it as it was after every test.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace megamoe::testing {

// Sets an environment variable for its scope, then restores the previous value or unsets it. The library reads its
// MEGAMOE_* variables when a backend, dispatcher or kernel switch is made or first used, so a test sets them first.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_.c_str(), old_->c_str(), 1);
    else ::unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// A switch read once from the environment and overridden by its setter (kernels::w4a8_g1_v10 / set_w4a8_g1_v10,
// w4a8_decode / set_w4a8_decode, ...): the value at scope entry is set again at scope end.
class ScopedSwitch {
 public:
  ScopedSwitch(int (*get)(), void (*set)(int)) : set_(set), saved_(get()) {}
  ~ScopedSwitch() { set_(saved_); }
  ScopedSwitch(const ScopedSwitch&) = delete;
  ScopedSwitch& operator=(const ScopedSwitch&) = delete;

 private:
  void (*set_)(int);
  int saved_;
};

}  // namespace megamoe::testing
