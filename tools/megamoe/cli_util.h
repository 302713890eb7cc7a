// Small helpers shared by the `megamoe` subcommands.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace megamoe::tool {

std::vector<std::string> split_commas(const std::string& s);
// Writes `value` pretty-printed; creates parent directories. Throws megamoe::Error when it cannot.
void write_json_file(const std::string& path, const nlohmann::json& value);
// The repository root when the binary runs from <root>/<build dir>/, else "" (for default data paths).
std::string repo_root_from_executable();

}  // namespace megamoe::tool
