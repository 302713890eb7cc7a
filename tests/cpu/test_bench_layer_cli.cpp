// End to end: the README's first command, `megamoe bench layer --backend reference --preset tiny`,
// and the bench's JSON and error paths, run as the built binary.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/megamoe_cli.h"

namespace {

using megamoe::testing::CommandResult;
using megamoe::testing::run_megamoe;

}  // namespace

TEST(BenchLayerCli, TinyReferenceRunsChecksAndWritesJson) {
  const std::string json_path =
      (std::filesystem::temp_directory_path() / ("megamoe_bench_layer_" + std::to_string(getpid()) + ".json")).string();
  const CommandResult run = run_megamoe("bench layer --backend reference,reference-fp32 --preset tiny --tokens 0,64 --check "
                              "--iters 2 --json " + json_path);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("| reference "), std::string::npos) << run.output;
  std::ifstream file(json_path);
  ASSERT_TRUE(file.good()) << json_path;
  const nlohmann::json j = nlohmann::json::parse(file);
  std::filesystem::remove(json_path);
  EXPECT_EQ(j["shape"]["hidden"], 256);
  EXPECT_EQ(j["shape"]["experts"], 8);
  ASSERT_EQ(j["cases"].size(), 4u);
  const nlohmann::json& c = j["cases"][2];  // reference, 64 tokens
  EXPECT_EQ(c["backend"], "reference");
  EXPECT_EQ(c["tokens"], 64);
  EXPECT_EQ(c["rows"], 128);  // uniform routing, no padding: 64 tokens x top-2
  EXPECT_GT(c["median_us"].get<double>(), 0.0);
  EXPECT_GT(c["tflops"].get<double>(), 0.0);
  EXPECT_TRUE(c["check"]["passed"].get<bool>());
  // Floor: 64 tokens hit all 8 experts of the one rank almost surely; weights dominate at this size:
  // 8 * 3 * 256 * 128 FP8 bytes (+ scales) over 4.2 TB/s.
  const double floor_us = c["floor_us"].get<double>();
  EXPECT_GT(floor_us, 0.0);
  EXPECT_LE(floor_us, 8 * 3 * 256 * 128 * (1.0 + 4.0 / 16384) / 4.2e12 * 1e6 * (1 + 1e-9));
  EXPECT_NEAR(c["ratio_to_floor"].get<double>(), c["median_us"].get<double>() / floor_us, 1e-6 * c["ratio_to_floor"].get<double>());
  EXPECT_NE(run.output.find("vs floor"), std::string::npos) << run.output;
  EXPECT_EQ(j["cases"][3]["backend"], "reference_fp32");
  EXPECT_TRUE(j["cases"][3]["check"]["passed"].get<bool>());
}

TEST(BenchLayerCli, ClearErrors) {
  const CommandResult ranks = run_megamoe("bench layer --ranks 2");
  EXPECT_EQ(ranks.exit_code, 2);
  EXPECT_NE(ranks.output.find("--ranks 2"), std::string::npos) << ranks.output;
  const CommandResult preset = run_megamoe("bench layer --preset nope");
  EXPECT_EQ(preset.exit_code, 2);
  EXPECT_NE(preset.output.find("dsv4-flash"), std::string::npos) << preset.output;
  const CommandResult shape = run_megamoe("bench layer --hidden 100");
  EXPECT_NE(shape.output.find("hidden = 100 must be a positive multiple of 128"), std::string::npos) << shape.output;
}
