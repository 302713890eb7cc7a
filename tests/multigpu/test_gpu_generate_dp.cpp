// `megamoe generate` with DP2 attention + EP2 MoE (staged, one process per GPU through our launcher)
// against DP1 (one GPU holding every expert): each rank's greedy tokens equal the DP1 run of that
// rank's prompt. Run as the built binary, on dummy weights of a staged-capable geometry.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>

#include "common/gpu_skip.h"

namespace {

struct CommandResult {
  int exit_code = -1;
  std::string output;
};

CommandResult run_megamoe(const std::string& args) {
  const std::string binary = std::string(MEGAMOE_BINARY_DIR) + "/megamoe";
  CommandResult run;
  if (!std::filesystem::exists(binary)) {
    ADD_FAILURE() << binary << " is missing: build the megamoe target before running the tests";
    return run;
  }
  FILE* pipe = popen((binary + " " + args + " 2>&1").c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed";
    return run;
  }
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.output.append(buffer, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// The token list after "<prefix>generated:" in the output ("" when absent).
std::string generated(const std::string& output, const std::string& prefix) {
  const std::regex line("(^|\n)" + prefix + "generated:([ 0-9]*)");
  std::smatch match;
  return std::regex_search(output, match, line) ? match[2].str() : std::string();
}

TEST(GpuGenerate, DataParallel2ExpertParallel2MatchesOneGpu) {
  MEGAMOE_REQUIRE_GPUS(2);
  const std::string model = std::string(MEGAMOE_SOURCE_DIR) + "/tests/fixtures/tiny-qwen3-moe";
  const std::string common =
      "generate " + model +
      " --moe-backend staged --load-format dummy --seed 5 --max-tokens 12 --ignore-eos --block-size 16"
      " --max-num-batched-tokens 256 --hf-overrides '{\"hidden_size\": 256, \"moe_intermediate_size\": 128,"
      " \"intermediate_size\": 256, \"head_dim\": 128, \"num_attention_heads\": 4, \"num_key_value_heads\": 2}'";
  const std::string prompts[2] = {"3,14,15,92,65,35,89,79,32,38,46", "271,828,182,845,904,523,536,28,747,135,266"};
  std::string single[2];
  for (int r = 0; r < 2; ++r) {
    const CommandResult one = run_megamoe(common + " --prompt-ids " + prompts[r]);
    ASSERT_EQ(one.exit_code, 0) << one.output;
    single[r] = generated(one.output, "");
    ASSERT_FALSE(single[r].empty()) << one.output;
  }
  const CommandResult dp = run_megamoe(common + " --data-parallel-size 2 --enable-expert-parallel --prompt-ids " +
                                       prompts[0] + " --prompt-ids " + prompts[1]);
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  std::printf("%s", dp.output.c_str());
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(generated(dp.output, "rank " + std::to_string(r) + " "), single[r]) << "rank " << r << "\n" << dp.output;
  }
}

// Decode steps replay CUDA graphs by default (one per batch-size bucket, every MoE layer's collective
// inside); --enforce-eager runs them eagerly: same tokens on every rank, staged and mega (FP8 experts).
TEST(GpuGenerate, DataParallel2DecodeGraphsEqualEager) {
  MEGAMOE_REQUIRE_GPUS(2);
  const std::string model = std::string(MEGAMOE_SOURCE_DIR) + "/tests/fixtures/tiny-qwen3-moe";
  for (const std::string backend : {"staged", "mega"}) {
    const std::string common =
        "generate " + model + " --moe-backend " + backend +
        " --quantization fp8 --load-format dummy --seed 6 --max-tokens 16 --ignore-eos --block-size 16"
        " --max-num-batched-tokens 256 --gpu-memory-utilization 0.3 --data-parallel-size 2 --enable-expert-parallel"
        " --hf-overrides '{\"hidden_size\": 256, \"moe_intermediate_size\": 128, \"intermediate_size\": 256,"
        " \"head_dim\": 128, \"num_attention_heads\": 4, \"num_key_value_heads\": 2}'"
        " --prompt-ids 3,14,15,92,65,35 --prompt-ids 271,828,182,845,904,523,536,28,747";
    const CommandResult graphs = run_megamoe(common);
    const CommandResult eager = run_megamoe(common + " --enforce-eager");
    ASSERT_EQ(graphs.exit_code, 0) << graphs.output;
    ASSERT_EQ(eager.exit_code, 0) << eager.output;
    std::printf("%s", graphs.output.c_str());
    for (int r = 0; r < 2; ++r) {
      const std::string prefix = "rank " + std::to_string(r) + " ";
      ASSERT_FALSE(generated(graphs.output, prefix).empty()) << graphs.output;
      EXPECT_EQ(generated(graphs.output, prefix), generated(eager.output, prefix)) << backend << " rank " << r;
    }
    EXPECT_NE(graphs.output.find("decode graphs"), std::string::npos) << graphs.output;
  }
}

}  // namespace
