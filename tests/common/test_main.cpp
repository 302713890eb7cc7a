#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  // Line-buffered stdout (set before any output, as setvbuf requires): a launched rank that hangs and is
  // killed still shows how far it got; fully buffered output to the parent's pipe was lost (session 7).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
