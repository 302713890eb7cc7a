// Data parallel + expert parallel on the CPU: N runners (threads) share one in-process CpuEpGroup,
// each holding E/N experts, and step together (idle ranks run empty steps). Their logits must be
// BIT-IDENTICAL to one runner holding every expert, for the same sequences: the collective reference
// backend computes each top-k slot on its expert's owner and sums slots in the single-rank order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cpu/engine_test_util.h"
#include "engine/config.h"
#include "engine/model.h"
#include "megamoe/cpu_ep.h"
#include "megamoe/error.h"

using namespace megamoe;
using namespace megamoe::engine;
using megamoe::engine::testing::fixture;

namespace {

RunnerOptions quiet_options() {
  RunnerOptions options;
  options.load.progress = false;
  options.num_kv_blocks = 64;
  options.kv_block_size = 4;
  return options;
}

struct RankResult {
  StepOutput output;
  std::string error;  // what the rank's step() threw
};

// One collective step: every rank's runner steps on its own thread with its batch (maybe empty).
std::vector<RankResult> step_all(std::vector<std::unique_ptr<ModelRunner>>& runners, const std::vector<StepBatch>& batches) {
  std::vector<RankResult> results(runners.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < runners.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        results[r].output = runners[r]->step(batches[r]);
      } catch (const std::exception& e) {
        results[r].error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

// A sequence with its own block table in one runner's cache.
struct Seq {
  std::vector<int32_t> tokens;
  int32_t computed = 0;  // tokens already in the KV cache
  std::vector<int32_t> blocks;
};

SequenceChunk next_chunk(Seq& seq, int64_t id, int block_size, int& next_block) {
  SequenceChunk chunk;
  chunk.seq_id = id;
  chunk.start_position = seq.computed;
  chunk.tokens.assign(seq.tokens.begin() + seq.computed, seq.tokens.end());
  while (static_cast<int64_t>(seq.blocks.size()) * block_size < static_cast<int64_t>(seq.tokens.size()))
    seq.blocks.push_back(next_block++);
  chunk.block_table = seq.blocks;
  seq.computed = static_cast<int32_t>(seq.tokens.size());
  return chunk;
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

std::vector<std::unique_ptr<ModelRunner>> make_ep_runners(const std::string& model, int ranks, double timeout = 120) {
  RunnerOptions options = quiet_options();
  options.max_tokens_per_step = 8;  // long prefills take several MoE pieces; idle ranks must match the count
  options.cpu_ep = std::make_shared<CpuEpGroup>(ranks, timeout);
  std::vector<std::unique_ptr<ModelRunner>> runners;
  for (int r = 0; r < ranks; ++r) {
    options.ep_rank = r;
    runners.push_back(make_cpu_model_runner(fixture(model), options));
  }
  return runners;
}

class ExpertParallel : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(ExpertParallel, LogitsBitIdenticalToOneRankWithIdleRanks) {
  const auto [model, ranks] = GetParam();
  const nlohmann::json golden = read_json_file(fixture(model) + "/golden.json");
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& p : golden.at("prompts")) prompts.push_back(p.at("token_ids").get<std::vector<int32_t>>());

  auto oracle = make_cpu_model_runner(fixture(model), quiet_options());
  auto runners = make_ep_runners(model, ranks);
  const int block_size = runners[0]->kv_block_size();

  // Phase 1: the prompts go to ranks 0 .. ranks-2 (round robin); the last rank stays idle.
  // Phase 2: one more sequence on the last rank only, every other rank idle.
  std::vector<Seq> ep_seqs(prompts.size() + 1), oracle_seqs(prompts.size() + 1);
  std::vector<int> owner(prompts.size() + 1);
  for (size_t i = 0; i < prompts.size(); ++i) owner[i] = static_cast<int>(i) % (ranks - 1);
  owner.back() = ranks - 1;
  for (size_t i = 0; i < prompts.size(); ++i) ep_seqs[i].tokens = oracle_seqs[i].tokens = prompts[i];
  ep_seqs.back().tokens = oracle_seqs.back().tokens = prompts[0];  // same tokens, another rank's experts mix
  std::vector<int> next_block(ranks, 0);
  int oracle_next_block = 0;
  int compared_rows = 0;

  auto run_phase = [&](const std::vector<size_t>& seqs, int decode_steps) {
    for (int step = 0; step <= decode_steps; ++step) {
      std::vector<StepBatch> batches(ranks);
      std::vector<std::vector<size_t>> rows(ranks);
      for (size_t i : seqs) {
        batches[owner[i]].chunks.push_back(next_chunk(ep_seqs[i], static_cast<int64_t>(i), block_size, next_block[owner[i]]));
        rows[owner[i]].push_back(i);
      }
      const auto results = step_all(runners, batches);
      for (int r = 0; r < ranks; ++r) {
        ASSERT_EQ(results[r].error, "") << "rank " << r;
        ASSERT_EQ(results[r].output.logits.size(), rows[r].size()) << "rank " << r;
        for (size_t k = 0; k < rows[r].size(); ++k) {
          const size_t i = rows[r][k];
          StepBatch alone;
          alone.chunks.push_back(next_chunk(oracle_seqs[i], static_cast<int64_t>(i), block_size, oracle_next_block));
          const std::vector<float> want = oracle->step(alone).logits.at(0);
          const std::vector<float>& got = results[r].output.logits[k];
          ASSERT_EQ(got.size(), want.size());
          EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
              << model << " DP" << ranks << " seq " << i << " (rank " << r << ") step " << step
              << ": max |diff| " << megamoe::engine::testing::compare(got, want).max_abs;
          ++compared_rows;
          const int32_t token = argmax(want);
          ep_seqs[i].tokens.push_back(token);
          oracle_seqs[i].tokens.push_back(token);
        }
      }
    }
  };
  std::vector<size_t> first(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) first[i] = i;
  run_phase(first, 3);
  run_phase({prompts.size()}, 2);
  EXPECT_EQ(compared_rows, static_cast<int>(prompts.size()) * 4 + 3);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, ExpertParallel,
                         ::testing::Combine(::testing::Values("tiny-qwen3-moe", "tiny-mixtral"), ::testing::Values(2, 3, 4, 8)),
                         [](const auto& info) {
                           std::string name = std::get<0>(info.param) + "_dp" + std::to_string(std::get<1>(info.param));
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(ExpertParallelEngine, EachRankLoadsOnlyItsExpertsSplitUnevenly) {
  // 8 experts over 3 ranks: [0, 2), [2, 5), [5, 8).
  EXPECT_EQ(CpuEpGroup::local_experts(8, 3, 0), std::make_pair(0, 2));
  EXPECT_EQ(CpuEpGroup::local_experts(8, 3, 1), std::make_pair(2, 3));
  EXPECT_EQ(CpuEpGroup::local_experts(8, 3, 2), std::make_pair(5, 3));
  EXPECT_EQ(CpuEpGroup::local_experts(8, 2, 1), std::make_pair(4, 4));
  try {
    CpuEpGroup::local_experts(2, 3, 0);
    FAIL() << "2 experts over 3 ranks must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_experts = 2 must be >= the expert-parallel ranks = 3"), std::string::npos)
        << e.what();
  }
  // A runner rank of a group larger than the expert count fails to build, naming the limit.
  RunnerOptions options = quiet_options();
  options.cpu_ep = std::make_shared<CpuEpGroup>(9);
  EXPECT_THROW(make_cpu_model_runner(fixture("tiny-mixtral"), options), Error);
  options.cpu_ep = std::make_shared<CpuEpGroup>(2);
  options.moe_backend = "staged";
  try {
    make_cpu_model_runner(fixture("tiny-mixtral"), options);
    FAIL() << "a GPU backend with a CPU EP group must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reference backend only"), std::string::npos) << e.what();
  }
}

TEST(ExpertParallelEngine, BadBatchOnOneRankFailsThereWhileTheOtherRankCompletes) {
  auto runners = make_ep_runners("tiny-qwen3-moe", 2);
  auto oracle = make_cpu_model_runner(fixture("tiny-qwen3-moe"), quiet_options());
  const int block_size = runners[0]->kv_block_size();
  std::vector<StepBatch> batches(2);
  Seq good, good_oracle, bad;
  good.tokens = good_oracle.tokens = {11, 500, 1200, 7, 42, 1999, 3};
  bad.tokens = {5, 6, 1 << 20};  // token outside the vocabulary
  int next0 = 0, next1 = 0, next_oracle = 0;
  batches[0].chunks.push_back(next_chunk(good, 0, block_size, next0));
  batches[1].chunks.push_back(next_chunk(bad, 1, block_size, next1));
  const auto results = step_all(runners, batches);
  EXPECT_EQ(results[0].error, "");
  EXPECT_NE(results[1].error.find("outside [0, 2048)"), std::string::npos) << results[1].error;
  StepBatch alone;
  alone.chunks.push_back(next_chunk(good_oracle, 0, block_size, next_oracle));
  ASSERT_EQ(results[0].output.logits.size(), 1u);
  EXPECT_EQ(results[0].output.logits[0], oracle->step(alone).logits.at(0));
  // The group is still usable: both ranks step again (rank 1 now idle).
  good.tokens.push_back(9);
  good_oracle.tokens.push_back(9);
  batches[0].chunks = {next_chunk(good, 0, block_size, next0)};
  batches[1].chunks.clear();
  const auto again = step_all(runners, batches);
  ASSERT_EQ(again[0].error, "");
  alone.chunks = {next_chunk(good_oracle, 0, block_size, next_oracle)};
  EXPECT_EQ(again[0].output.logits.at(0), oracle->step(alone).logits.at(0));
}

TEST(ExpertParallelEngine, ARankThatSkipsTheCollectiveTimesOutInsteadOfHanging) {
  auto runners = make_ep_runners("tiny-mixtral", 2, /*timeout=*/0.3);
  StepBatch batch;
  batch.chunks.push_back(SequenceChunk{0, {1, 2, 3}, 0, {0}, true});
  try {
    runners[0]->step(batch);  // rank 1 never steps
    FAIL() << "a lone rank must not complete a collective step";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ranks {1} never reached"), std::string::npos) << e.what();
  }
  EXPECT_THROW(runners[1]->step(StepBatch{}), Error);  // the group stays aborted
}

// Eight ranks (one expert each), the last two never step: both stepping ranks fail within the
// timeout, naming exactly the missing ranks.
TEST(ExpertParallelEngine, TwoOfEightRanksSkipTheCollectiveAndAreNamed) {
  auto runners = make_ep_runners("tiny-qwen3-moe", 8, /*timeout=*/0.3);
  std::vector<std::string> errors(6);
  std::vector<std::thread> threads;
  for (int r = 0; r < 6; ++r)
    threads.emplace_back([&, r] {
      StepBatch batch;
      if (r == 0) batch.chunks.push_back(SequenceChunk{0, {1, 2, 3}, 0, {0}, true});
      try {
        runners[r]->step(batch);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 6; ++r)
    EXPECT_NE(errors[r].find("ranks {6, 7} never reached"), std::string::npos) << "rank " << r << ": " << errors[r];
}

}  // namespace
