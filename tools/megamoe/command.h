// Subcommand registry of the `megamoe` tool. Each subcommand lives in its own file and registers
// itself with a static MEGAMOE_SUBCOMMAND(...) object, so adding one touches no shared file.
//   megamoe bench layer | bench gemm | bench serve | serve | eval gsm8k
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace megamoe::tool {

struct Subcommand {
  std::string group;        // "" for a top-level command ("serve"), else its parent ("bench", "eval")
  std::string name;         // "layer"
  std::string description;
  // Adds options to `app` and returns the function to run after parsing (its exit code).
  std::function<std::function<int()>(CLI::App& app)> setup;
};

std::vector<Subcommand>& subcommands();

struct Registrar {
  explicit Registrar(Subcommand command) { subcommands().push_back(std::move(command)); }
};

}  // namespace megamoe::tool

#define MEGAMOE_CONCAT_INNER(a, b) a##b
#define MEGAMOE_CONCAT(a, b) MEGAMOE_CONCAT_INNER(a, b)
#define MEGAMOE_SUBCOMMAND(...) \
  static ::megamoe::tool::Registrar MEGAMOE_CONCAT(megamoe_registrar_, __LINE__)(::megamoe::tool::Subcommand{__VA_ARGS__})
