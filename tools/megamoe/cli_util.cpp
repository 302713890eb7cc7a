#include "tools/megamoe/cli_util.h"

#include <filesystem>
#include <fstream>

#include "megamoe/error.h"

namespace megamoe::tool {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(std::move(item));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

void write_json_file(const std::string& path, const nlohmann::json& value) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p);
  MEGAMOE_CHECK(out.good(), "cannot write '", path, "'");
  out << value.dump(2) << "\n";
  MEGAMOE_CHECK(out.good(), "writing '", path, "' failed");
}

std::string repo_root_from_executable() {
  std::error_code error;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return "";
  const auto root = exe.parent_path().parent_path();
  return std::filesystem::exists(root / "CMakeLists.txt") ? root.string() : "";
}

}  // namespace megamoe::tool
