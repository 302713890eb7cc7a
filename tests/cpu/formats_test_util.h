// Helpers shared by the formats tests.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "megamoe/error.h"

namespace megamoe::test {

// Runs f, expects a megamoe::Error whose message contains every one of `words`.
template <typename F>
void expect_error_mentions(F&& f, const std::vector<std::string>& words) {
  try {
    f();
    ADD_FAILURE() << "expected megamoe::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const auto& w : words) EXPECT_NE(what.find(w), std::string::npos) << "'" << w << "' not in: " << what;
  }
}

}  // namespace megamoe::test
