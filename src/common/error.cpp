#include "megamoe/error.h"

namespace megamoe::detail {

void throw_error(const char* file, int line, const char* condition, const std::string& message) {
  std::ostringstream stream;
  stream << "megamoe: " << message;
  if (condition != nullptr) stream << " [check `" << condition << "` failed";
  else stream << " [";
  stream << " at " << file << ":" << line << "]";
  throw Error(stream.str());
}

}  // namespace megamoe::detail
