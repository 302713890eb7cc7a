#include <cstdio>

#include "tools/megamoe/command.h"

MEGAMOE_SUBCOMMAND("", "version", "print the megamoe version", [](CLI::App&) -> std::function<int()> {
  return [] {
    std::printf("megamoe 0.1.0\n");
    return 0;
  };
});
