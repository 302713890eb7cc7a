// The `megamoe` command: parses the command line and dispatches to the registered subcommands.
#include <cstdio>
#include <exception>
#include <map>

#include "megamoe/error.h"
#include "tools/megamoe/command.h"

namespace megamoe::tool {
std::vector<Subcommand>& subcommands() {
  static std::vector<Subcommand> all;
  return all;
}
}  // namespace megamoe::tool

int main(int argc, char** argv) {
  using namespace megamoe::tool;
  CLI::App app{"megamoe: fused expert-parallel Mixture-of-Experts for NVLink GPUs"};
  app.require_subcommand(1);
  std::map<std::string, CLI::App*> groups;
  std::function<int()> to_run;
  std::vector<std::function<int()>> runners(subcommands().size());
  for (size_t i = 0; i < subcommands().size(); ++i) {
    const Subcommand& command = subcommands()[i];
    CLI::App* parent = &app;
    if (!command.group.empty()) {
      auto found = groups.find(command.group);
      if (found == groups.end()) {
        found = groups.emplace(command.group, app.add_subcommand(command.group, command.group + " tools")).first;
        found->second->require_subcommand(1);
      }
      parent = found->second;
    }
    CLI::App* sub = parent->add_subcommand(command.name, command.description);
    runners[i] = command.setup(*sub);
    sub->callback([&to_run, &runners, i] { to_run = runners[i]; });
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return to_run ? to_run() : 0;
  } catch (const megamoe::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 3;
  }
}
