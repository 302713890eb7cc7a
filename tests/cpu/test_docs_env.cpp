// docs/env.md lists every MEGAMOE_* environment variable the sources read: a variable added to the code without a
// line in that table fails here, naming the variable and the file that reads it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every "MEGAMOE_..." string literal in the C++ / CUDA sources of the library, engine, server and tools (test-only
// variables such as MEGAMOE_TEST_RANKS live in tests/ and are not user-facing).
std::map<std::string, std::string> variables_in_sources(const std::filesystem::path& root) {
  const std::regex literal("\"(MEGAMOE_[A-Z0-9_]+)\"");
  std::map<std::string, std::string> found;  // variable -> first file
  for (const char* dir : {"src", "include", "engine", "server", "tools", "bench"}) {
    if (!std::filesystem::exists(root / dir)) continue;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root / dir)) {
      if (!entry.is_regular_file()) continue;
      const std::string ext = entry.path().extension().string();
      if (ext != ".cpp" && ext != ".cu" && ext != ".h" && ext != ".cuh") continue;
      const std::string text = read_file(entry.path());
      for (std::sregex_iterator it(text.begin(), text.end(), literal), end; it != end; ++it)
        found.emplace((*it)[1].str(), std::filesystem::relative(entry.path(), root).string());
    }
  }
  return found;
}

}  // namespace

TEST(DocsEnv, ListsEveryVariableTheSourcesRead) {
  const std::filesystem::path root(MEGAMOE_SOURCE_DIR);
  const std::string doc = read_file(root / "docs" / "env.md");
  ASSERT_FALSE(doc.empty()) << "docs/env.md missing or empty";
  const auto variables = variables_in_sources(root);
  // The sources read more than a handful (EP, GEMM, W4A8, mega switches): an empty scan is a broken test.
  ASSERT_GE(variables.size(), 20u) << "found only " << variables.size() << " MEGAMOE_* literals under " << root;
  for (const auto& [name, file] : variables)
    EXPECT_NE(doc.find("`" + name + "`"), std::string::npos) << name << " (read in " << file << ") is not in docs/env.md";
}
