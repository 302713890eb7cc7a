// End to end: the README's first command, `megamoe bench layer --backend reference --preset tiny`,
// and the bench's JSON and error paths, run as the built binary.
#include <gtest/gtest.h>

#include <algorithm>
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
  EXPECT_EQ(c["floor_nvlink_us"].get<double>(), 0.0) << "one rank moves nothing over NVLink";
  EXPECT_EQ(floor_us, std::max(c["floor_compute_us"].get<double>(), c["floor_weights_us"].get<double>()));
  EXPECT_EQ(c["floor_bound"], "weights");
  // NVLink GB/s and the phase split: one rank moves nothing over NVLink, and `reference` (CPU) has no
  // phases, so the table says "-" in the split column.
  EXPECT_EQ(c["nvlink_bytes_out"].get<double>(), 0.0);
  EXPECT_EQ(c["nvlink_bytes_in"].get<double>(), 0.0);
  EXPECT_EQ(c["nvlink_gbps"].get<double>(), 0.0);
  ASSERT_TRUE(c["phases_us"].is_object()) << c.dump();
  EXPECT_TRUE(c["phases_us"].empty()) << c.dump();
  EXPECT_NE(run.output.find("NVLink GB/s"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("split µs"), std::string::npos) << run.output;
  const size_t row = run.output.find("| reference      |      64 |");
  ASSERT_NE(row, std::string::npos) << run.output;
  const std::string line = run.output.substr(row, run.output.find('\n', row) - row);
  EXPECT_NE(line.find("|         0.0 | -  "), std::string::npos) << line;
  EXPECT_EQ(j["cases"][3]["backend"], "reference_fp32");
  EXPECT_TRUE(j["cases"][3]["check"]["passed"].get<bool>());
}

nlohmann::json read_and_remove(const std::string& path) {
  std::ifstream file(path);
  if (!file.good()) {
    ADD_FAILURE() << path << " was not written";
    return {};
  }
  nlohmann::json j = nlohmann::json::parse(file);
  std::filesystem::remove(path);
  return j;
}

// `--floor-only` on 1, 2 and 8 ranks (no GPU): the floors a timed `--ranks N` run reports, checked
// against closed forms where the routing pins them down.
TEST(BenchLayerCli, FloorsOnEightRanks) {
  const std::string base = (std::filesystem::temp_directory_path() / ("megamoe_floor_" + std::to_string(getpid()))).string();
  const double H = 7168, I = 2048, K = 8, nvlink = 370e9, fp8_flops = 1420e12;
  auto floors = [&](const std::string& args, const std::string& tag) {
    const CommandResult run = run_megamoe("bench layer --preset dsv3 --floor-only --tokens 8,2048,8192 " + args +
                                          " --json " + base + tag + ".json");
    EXPECT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("floor by"), std::string::npos) << run.output;
    return read_and_remove(base + tag + ".json")["floors"];
  };
  const nlohmann::json one = floors("--ranks 1", "1"), two = floors("--ranks 2", "2"), eight = floors("--ranks 8", "8");
  const nlohmann::json skewed = floors("--ranks 8 --routing one-rank", "8one");
  ASSERT_EQ(one.size(), 3u);
  ASSERT_EQ(two.size(), 3u);
  ASSERT_EQ(eight.size(), 3u);
  ASSERT_EQ(skewed.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const double T = one[i]["tokens"].get<double>();
    SCOPED_TRACE(::testing::Message() << T << " tokens per rank");
    // Same routing stream on every rank count: the same rows; no padding (softmax top-8).
    EXPECT_EQ(one[i]["rows"], T * K);
    EXPECT_EQ(eight[i]["rows"], one[i]["rows"]);
    // One rank: every routed row computed here, nothing over NVLink.
    EXPECT_NEAR(one[i]["floor_compute_us"].get<double>(), 2 * T * K * H * I * 3 / fp8_flops * 1e6, 1e-9 * T);
    EXPECT_EQ(one[i]["floor_nvlink_us"].get<double>(), 0.0);
    // Uniform on 8 ranks: each token reaches at most 7 other ranks and gets as many partials back.
    const double upper = 7 * T * ((H + H / 32) + 2 * H) / nvlink * 1e6;
    EXPECT_GT(eight[i]["floor_nvlink_us"].get<double>(), two[i]["floor_nvlink_us"].get<double>());
    EXPECT_GT(two[i]["floor_nvlink_us"].get<double>(), 0.0);
    EXPECT_LE(eight[i]["floor_nvlink_us"].get<double>(), upper * (1 + 1e-12));
    // A rank's share is at least the average: 8 x its slots >= all slots of one rank.
    EXPECT_GE(eight[i]["floor_compute_us"].get<double>(), one[i]["floor_compute_us"].get<double>() * (1 - 1e-12));
    // One-rank routing on 8 ranks: rank 0 computes all 8 ranks' rows and returns 7 x T partial rows
    // (2H bytes each), more than the 7 x T FP8 rows it receives.
    EXPECT_NEAR(skewed[i]["floor_compute_us"].get<double>(), 8 * 2 * T * K * H * I * 3 / fp8_flops * 1e6, 1e-9 * T);
    EXPECT_NEAR(skewed[i]["floor_nvlink_us"].get<double>(), 7 * T * 2 * H / nvlink * 1e6, 1e-9 * T);
    for (const nlohmann::json* f : {&one[i], &two[i], &eight[i], &skewed[i]}) {
      const double top = std::max({(*f)["floor_compute_us"].get<double>(), (*f)["floor_weights_us"].get<double>(),
                                   (*f)["floor_nvlink_us"].get<double>()});
      EXPECT_EQ((*f)["floor_us"].get<double>(), top);
      const std::string by = (*f)["floor_bound"];
      EXPECT_EQ((*f)["floor_" + by + "_us"].get<double>(), top) << by;
    }
  }
  // At 8 tokens per rank the weight read bounds: 64 slots touch at most 64 of the 256 experts.
  EXPECT_EQ(one[0]["floor_bound"], "weights");
  EXPECT_EQ(skewed[2]["floor_bound"], "compute");
}

TEST(BenchLayerCli, RankCountErrorsBeforeAnyProcessStarts) {
  for (const std::string ranks : {"0", "9"}) {
    const CommandResult run = run_megamoe("bench layer --backend staged --preset dsv3 --ranks " + ranks);
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_NE(run.output.find("--ranks " + ranks + " must be in [1, 8]"), std::string::npos) << run.output;
  }
  const CommandResult odd = run_megamoe("bench layer --backend staged --preset dsv3 --ranks 3");
  EXPECT_EQ(odd.exit_code, 2) << odd.output;
  EXPECT_NE(odd.output.find("experts = 256 (preset dsv3) must be a multiple of the ranks"), std::string::npos) << odd.output;
  const CommandResult one_rank = run_megamoe("bench layer --preset tiny --ranks 8 --routing one-rank --floor-only");
  EXPECT_EQ(one_rank.exit_code, 2) << one_rank.output;
  EXPECT_NE(one_rank.output.find("experts / ranks = 1 must be >= top_k = 2"), std::string::npos) << one_rank.output;
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
  // --mega-path is checked before any backend is built, whichever backends run.
  const CommandResult path = run_megamoe("bench layer --backend reference --mega-path sideways");
  EXPECT_EQ(path.exit_code, 2) << path.output;
  EXPECT_NE(path.output.find("--mega-path = 'sideways' must be one of auto, fused, split, both"), std::string::npos)
      << path.output;
}

// --mega-path only expands `mega` rows; a one-path backend's rows keep their name and an empty path.
TEST(BenchLayerCli, MegaPathLeavesOtherBackendsAlone) {
  const std::string json_path =
      (std::filesystem::temp_directory_path() / ("megamoe_bench_path_" + std::to_string(getpid()) + ".json")).string();
  const CommandResult run =
      run_megamoe("bench layer --backend reference --preset tiny --tokens 16 --iters 1 --mega-path both --json " + json_path);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::ifstream file(json_path);
  ASSERT_TRUE(file.good()) << json_path;
  const nlohmann::json j = nlohmann::json::parse(file);
  std::filesystem::remove(json_path);
  ASSERT_EQ(j["cases"].size(), 1u);
  EXPECT_EQ(j["cases"][0]["backend"], "reference");
  EXPECT_EQ(j["cases"][0]["path"], "");
}
