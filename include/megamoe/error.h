// One exception type and one check-macro family for the whole library.
// NOTES: library code never calls exit()/abort(); every failure becomes megamoe::Error with a message
// that names the field (or call) and the limit that was violated.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace megamoe {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const char* condition, const std::string& message);

// Builds a message from any streamable pieces: MEGAMOE_CHECK(x < n, "topk_ids[", i, "] = ", x, " >= E = ", n).
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream stream;
  (stream << ... << args);
  return stream.str();
}
}  // namespace detail
}  // namespace megamoe

#define MEGAMOE_CHECK(condition, ...)                                                              \
  do {                                                                                             \
    if (!(condition)) [[unlikely]]                                                                 \
      ::megamoe::detail::throw_error(__FILE__, __LINE__, #condition,                               \
                                     ::megamoe::detail::concat(__VA_ARGS__));                      \
  } while (0)

#define MEGAMOE_FAIL(...) \
  ::megamoe::detail::throw_error(__FILE__, __LINE__, nullptr, ::megamoe::detail::concat(__VA_ARGS__))

// CUDA / NCCL checks live in error_cuda.h so that CPU-only translation units need no CUDA headers.
