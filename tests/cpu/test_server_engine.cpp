// Serving core on the CPU with the hash-based fake model: KV block accounting, chunked prefill,
// preemption, data-parallel balancing, sampling and stop handling. Every check compares against
// the fake model's greedy continuation computed straight from the tokens.
#include <gtest/gtest.h>

#include <future>
#include <random>
#include <thread>

#include "server/block_manager.h"
#include "server/llm_engine.h"
#include "server/scheduler.h"
#include "server_fake_runner.h"

using namespace megamoe::server;
using megamoe::server::testing::FakeRunner;
using megamoe::server::testing::reference_greedy;

namespace {

const std::string kTokenizer = std::string(MEGAMOE_SOURCE_DIR) + "/tests/fixtures/tokenizer";
constexpr int kVocab = 2048;
const std::vector<int32_t> kEos = {2045};

struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason reason = FinishReason::kNone;
  std::string error;
};

struct Pending {
  std::shared_ptr<Collected> result = std::make_shared<Collected>();
  std::shared_ptr<std::promise<void>> done = std::make_shared<std::promise<void>>();
  SubmitResult submitted;
};

Pending submit(LLMEngine& engine, std::vector<int32_t> prompt, megamoe::engine::SamplingParams params) {
  Pending p;
  auto result = p.result;
  auto done = p.done;
  p.submitted = engine.submit(std::move(prompt), params, [result, done](GenerationUpdate&& u) {
    result->tokens.insert(result->tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
    result->text += u.new_text;
    if (u.finished) {
      result->reason = u.finish_reason;
      result->error = u.error;
      done->set_value();
    }
  });
  return p;
}

void wait(Pending& p) {
  ASSERT_EQ(p.submitted.status, SubmitResult::kOk) << p.submitted.message;
  ASSERT_EQ(p.done->get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
}

std::vector<std::unique_ptr<megamoe::engine::ModelRunner>> fake_runners(int ranks, int block_size, int num_blocks,
                                                                         int max_positions = 4096) {
  std::vector<std::unique_ptr<megamoe::engine::ModelRunner>> runners;
  for (int r = 0; r < ranks; ++r)
    runners.push_back(std::make_unique<FakeRunner>(kVocab, block_size, num_blocks, max_positions, kEos));
  return runners;
}

std::vector<int32_t> random_prompt(std::mt19937_64& rng, int length) {
  std::vector<int32_t> prompt(static_cast<size_t>(length));
  for (auto& t : prompt) t = int32_t(rng() % 2045);
  return prompt;
}

// Stats are published after each engine step, a moment after the callbacks: poll (bounded).
EngineStats drained_stats(const LLMEngine& engine) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  EngineStats s = engine.stats();
  while (std::chrono::steady_clock::now() < deadline &&
         (s.running + s.waiting > 0 || s.kv_blocks_free != s.kv_blocks_total)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    s = engine.stats();
  }
  return s;
}

}  // namespace

TEST(ServerBlockManager, AllocatesReleasesAndNeverLeaks) {
  KvBlockManager blocks(10, 16);
  Sequence a, b;
  a.id = 1;
  b.id = 2;
  EXPECT_TRUE(blocks.ensure_capacity(a, 33));  // 3 blocks
  EXPECT_EQ(a.block_table.size(), 3u);
  EXPECT_TRUE(blocks.ensure_capacity(a, 48));  // still 3
  EXPECT_EQ(blocks.num_free(), 7);
  EXPECT_FALSE(blocks.ensure_capacity(b, 8 * 16));  // needs 8, 7 free: nothing changes
  EXPECT_TRUE(b.block_table.empty());
  EXPECT_EQ(blocks.num_free(), 7);
  EXPECT_TRUE(blocks.ensure_capacity(b, 7 * 16));
  EXPECT_EQ(blocks.num_free(), 0);
  std::vector<int32_t> all = a.block_table;
  all.insert(all.end(), b.block_table.begin(), b.block_table.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::unique(all.begin(), all.end()), all.end()) << "a block was handed out twice";
  Sequence copy = a;
  blocks.release(a);
  EXPECT_THROW(blocks.release(copy), megamoe::Error);  // double release is caught, not corrupting
  blocks.release(b);
  EXPECT_EQ(blocks.num_free(), 10);
}

// Requests that each finish before the next one arrives find every rank idle (load 0): the tie goes round-robin,
// so they still spread over the ranks (session 11: with ties to rank 0 all of them landed there, and a CLI test that
// expects both worker processes to serve failed whenever its requests happened not to overlap).
TEST(ServerEngine, SequentialRequestsOnIdleRanksGoRoundRobin) {
  auto tokenizer = Tokenizer::from_file(kTokenizer);
  EngineOptions options;
  options.max_model_len = 256;
  LLMEngine engine(fake_runners(3, 16, 64), tokenizer, options);
  megamoe::engine::SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 3;
  params.ignore_eos = true;
  for (int i = 0; i < 7; ++i) {
    Pending p = submit(engine, {5, 6, 7, int32_t(8 + i)}, params);
    wait(p);
    EXPECT_EQ(p.result->tokens, reference_greedy({5, 6, 7, int32_t(8 + i)}, kVocab, 3, kEos, true)) << "request " << i;
  }
  const EngineStats stats = drained_stats(engine);
  ASSERT_EQ(stats.requests_per_rank.size(), 3u);
  EXPECT_EQ(stats.requests_per_rank[0], 3);
  EXPECT_EQ(stats.requests_per_rank[1], 2);
  EXPECT_EQ(stats.requests_per_rank[2], 2);
}

TEST(ServerEngine, GreedyMatchesModelUnderChunkingPreemptionAndTwoRanks) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto tokenizer = Tokenizer::from_file(kTokenizer);
  EngineOptions options;
  options.max_num_seqs = 8;
  options.max_num_batched_tokens = 48;  // long prompts are split into chunks
  options.max_model_len = 256;
  // 24 blocks x 16 = 384 tokens per rank: 40 requests of up to 200 tokens must preempt.
  auto runners = fake_runners(2, 16, 24);
  std::vector<FakeRunner*> fakes;
  for (auto& r : runners) fakes.push_back(static_cast<FakeRunner*>(r.get()));
  LLMEngine engine(std::move(runners), tokenizer, options);
  std::vector<Pending> pending;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> max_tokens;
  for (int i = 0; i < 40; ++i) {
    prompts.push_back(random_prompt(rng, 1 + int(rng() % 150)));
    max_tokens.push_back(1 + int(rng() % 40));
    megamoe::engine::SamplingParams params;
    params.temperature = 0;
    params.max_tokens = max_tokens.back();
    params.ignore_eos = (i % 2) == 0;
    pending.push_back(submit(engine, prompts.back(), params));
  }
  for (size_t i = 0; i < pending.size(); ++i) {
    wait(pending[i]);
    const auto expected = reference_greedy(prompts[i], kVocab, max_tokens[i], kEos, (i % 2) == 0);
    EXPECT_EQ(pending[i].result->tokens, expected) << "request " << i;
    const bool ended_on_eos = !expected.empty() && expected.back() == kEos[0] && (i % 2) == 1;
    EXPECT_EQ(pending[i].result->reason, ended_on_eos ? FinishReason::kStop : FinishReason::kLength);
    EXPECT_EQ(pending[i].result->text, tokenizer->decode(expected, /*skip_special=*/true));
  }
  const EngineStats stats = drained_stats(engine);
  EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total) << "KV blocks leaked";
  EXPECT_EQ(stats.running + stats.waiting, 0);
  EXPECT_GT(stats.preemptions, 0) << "the KV cache was sized to force preemption";
  for (int64_t n : stats.requests_per_rank) EXPECT_GE(n, 10) << "requests not balanced over ranks";
  for (FakeRunner* f : fakes) EXPECT_LE(f->max_tokens_in_step.load(), options.max_num_batched_tokens);
  for (FakeRunner* f : fakes) EXPECT_LE(f->max_chunks_in_step.load(), options.max_num_seqs);
}

TEST(ServerEngine, SeededSamplingReproducesAndTopPNarrows) {
  auto tokenizer = Tokenizer::from_file(kTokenizer);
  LLMEngine engine(fake_runners(1, 16, 64), tokenizer, EngineOptions{});
  std::mt19937_64 rng(7);
  const auto prompt = random_prompt(rng, 20);
  megamoe::engine::SamplingParams params;
  params.temperature = 1.0f;
  params.top_p = 0.9f;
  params.max_tokens = 30;
  params.ignore_eos = true;
  params.seed = 1234;
  Pending a = submit(engine, prompt, params), b = submit(engine, prompt, params);
  params.seed = 999;
  Pending c = submit(engine, prompt, params);
  wait(a);
  wait(b);
  wait(c);
  EXPECT_EQ(a.result->tokens, b.result->tokens);
  EXPECT_NE(a.result->tokens, c.result->tokens);
  // top_p tiny -> only the most likely token survives: equals greedy.
  params.top_p = 1e-6f;
  Pending d = submit(engine, prompt, params);
  wait(d);
  EXPECT_EQ(d.result->tokens, reference_greedy(prompt, kVocab, 30, kEos, true));
}

TEST(ServerEngine, StopStringCutsTextAndEndsRequest) {
  auto tokenizer = Tokenizer::from_file(kTokenizer);
  LLMEngine engine(fake_runners(1, 16, 64), tokenizer, EngineOptions{});
  std::mt19937_64 rng(11);
  // Find a prompt whose greedy text is long enough to pick a stop string from its middle.
  for (int attempt = 0; attempt < 50; ++attempt) {
    const auto prompt = random_prompt(rng, 10);
    const auto expected = reference_greedy(prompt, kVocab, 40, kEos, true);
    const std::string full = tokenizer->decode(expected, true);
    if (full.size() < 40) continue;
    // A stop string made of printable ASCII from the middle of the text.
    size_t at = full.size() / 2;
    std::string stop = full.substr(at, 3);
    if (std::any_of(stop.begin(), stop.end(), [](char c) { return uint8_t(c) >= 0x80; })) continue;
    const size_t first = full.find(stop);
    megamoe::engine::SamplingParams params;
    params.temperature = 0;
    params.max_tokens = 40;
    params.ignore_eos = true;
    params.stop = {stop};
    Pending p = submit(engine, prompt, params);
    wait(p);
    EXPECT_EQ(p.result->reason, FinishReason::kStop);
    EXPECT_EQ(p.result->text, full.substr(0, first));
    EXPECT_LT(p.result->tokens.size(), expected.size() + 1);
    return;
  }
  FAIL() << "no usable prompt found";
}

TEST(ServerEngine, RejectsBadRequestsAndOverload) {
  auto tokenizer = Tokenizer::from_file(kTokenizer);
  EngineOptions options;
  options.max_model_len = 64;
  options.max_queued_requests = 2;
  std::vector<std::unique_ptr<megamoe::engine::ModelRunner>> runners;
  runners.push_back(std::make_unique<FakeRunner>(kVocab, 16, 64, 4096, kEos, std::chrono::milliseconds(20)));
  LLMEngine engine(std::move(runners), tokenizer, options);
  megamoe::engine::SamplingParams params;
  params.max_tokens = 4;
  auto too_long = engine.submit(std::vector<int32_t>(64, 5), params, nullptr);
  EXPECT_EQ(too_long.status, SubmitResult::kInvalid);
  EXPECT_NE(too_long.message.find("64"), std::string::npos) << too_long.message;
  EXPECT_EQ(engine.submit({}, params, nullptr).status, SubmitResult::kInvalid);
  EXPECT_EQ(engine.submit({kVocab}, params, nullptr).status, SubmitResult::kInvalid);
  params.max_tokens = 0;
  EXPECT_EQ(engine.submit({1, 2}, params, nullptr).status, SubmitResult::kInvalid);
  params.max_tokens = 50;
  params.ignore_eos = true;
  Pending a = submit(engine, {1, 2}, params), b = submit(engine, {3, 4}, params);
  Pending c = submit(engine, {5, 6}, params);
  EXPECT_EQ(c.submitted.status, SubmitResult::kOverloaded);
  engine.abort(a.submitted.id);
  wait(a);
  EXPECT_EQ(a.result->reason, FinishReason::kAbort);
  wait(b);
  EXPECT_EQ(b.result->reason, FinishReason::kLength);
  const EngineStats stats = drained_stats(engine);
  EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total);
}

TEST(ServerScheduler, ChunksPrefillCapsSeqsAndPreemptsTheNewest) {
  KvBlockManager blocks(6, 4);  // 24 token slots
  Scheduler scheduler(SchedulerLimits{2, 10}, blocks);
  auto make = [](int64_t id, int prompt_len) {
    auto seq = std::make_shared<Sequence>();
    seq->id = id;
    seq->tokens.assign(static_cast<size_t>(prompt_len), int32_t(id));
    seq->num_prompt_tokens = prompt_len;
    seq->params.max_tokens = 100;
    return seq;
  };
  auto a = make(1, 13), b = make(2, 3), c = make(3, 2);
  scheduler.add(a);
  scheduler.add(b);
  scheduler.add(c);
  // Step 1: a's first 10-token chunk uses the whole budget; no logits yet.
  ScheduledStep step = scheduler.schedule();
  ASSERT_EQ(step.sequences.size(), 1u);
  EXPECT_EQ(step.batch.chunks[0].tokens.size(), 10u);
  EXPECT_EQ(step.batch.chunks[0].start_position, 0);
  EXPECT_FALSE(step.batch.chunks[0].want_logits);
  EXPECT_EQ(step.batch.chunks[0].block_table.size(), 3u);
  scheduler.mark_computed(step);
  // Step 2: a's last 3 tokens (logits wanted), then b admitted whole; c waits (max_num_seqs = 2).
  step = scheduler.schedule();
  ASSERT_EQ(step.sequences.size(), 2u);
  EXPECT_EQ(step.batch.chunks[0].start_position, 10);
  EXPECT_EQ(step.batch.chunks[0].tokens.size(), 3u);
  EXPECT_TRUE(step.batch.chunks[0].want_logits);
  EXPECT_EQ(step.sequences[1]->id, 2);
  EXPECT_EQ(scheduler.num_waiting(), 1);
  scheduler.mark_computed(step);
  EXPECT_EQ(blocks.num_free(), 6 - 4 - 1);
  // Decodes grow a past 16 tokens and b past 4 until the 6 blocks run out: b (newest) is preempted,
  // its blocks freed and it waits at the front, ahead of c.
  int64_t preempted_before = scheduler.num_preemptions();
  for (int i = 0; i < 8 && scheduler.num_preemptions() == preempted_before; ++i) {
    a->tokens.push_back(7);
    if (scheduler.num_running() == 2) b->tokens.push_back(7);
    step = scheduler.schedule();
    scheduler.mark_computed(step);
  }
  EXPECT_EQ(scheduler.num_preemptions(), preempted_before + 1);
  EXPECT_EQ(b->num_computed, 0);
  EXPECT_TRUE(b->block_table.empty());
  EXPECT_EQ(scheduler.num_running(), 1);
  EXPECT_EQ(scheduler.num_waiting(), 2);
  EXPECT_TRUE(scheduler.remove(1));
  EXPECT_EQ(blocks.num_free(), 6);
  step = scheduler.schedule();  // b comes back first, recomputing prompt + its output so far
  ASSERT_FALSE(step.empty());
  EXPECT_EQ(step.sequences[0]->id, 2);
  EXPECT_EQ(step.batch.chunks[0].start_position, 0);
  EXPECT_EQ(int(step.batch.chunks[0].tokens.size()), b->num_tokens());
  EXPECT_TRUE(scheduler.remove(2));
  EXPECT_TRUE(scheduler.remove(3));
  EXPECT_FALSE(scheduler.remove(3));
  EXPECT_EQ(blocks.num_free(), 6);
}
