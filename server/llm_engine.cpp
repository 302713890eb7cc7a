#include "server/llm_engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <future>

#include "megamoe/error.h"
#include "server/detokenizer.h"

namespace megamoe::server {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: break;
  }
  return "";
}

struct LLMEngine::Request {
  std::shared_ptr<Sequence> seq;
  UpdateCallback on_update;
  std::unique_ptr<IncrementalDetokenizer> detokenizer;
};

LLMEngine::LLMEngine(std::vector<std::unique_ptr<engine::ModelRunner>> runners,
                     std::shared_ptr<const Tokenizer> tokenizer, EngineOptions options, ServerMetrics* metrics)
    : runners_(std::move(runners)), tokenizer_(std::move(tokenizer)), options_(options), metrics_(metrics) {
  MEGAMOE_CHECK(!runners_.empty(), "LLMEngine needs at least one ModelRunner (one per data-parallel rank)");
  MEGAMOE_CHECK(tokenizer_ != nullptr, "LLMEngine needs a tokenizer");
  const engine::ModelInfo& info = runners_.front()->info();
  MEGAMOE_CHECK(info.vocab_size > 0, "model vocab_size ", info.vocab_size, " must be > 0");
  MEGAMOE_CHECK(tokenizer_->vocab_size() <= info.vocab_size, "tokenizer vocab ", tokenizer_->vocab_size(),
                " must be <= model vocab_size ", info.vocab_size);
  int kv_capacity = INT32_MAX;
  for (size_t r = 0; r < runners_.size(); ++r) {
    const auto& runner = *runners_[r];
    MEGAMOE_CHECK(runner.info().vocab_size == info.vocab_size, "rank ", r, " vocab_size ", runner.info().vocab_size,
                  " must equal rank 0's ", info.vocab_size);
    blocks_.push_back(std::make_unique<KvBlockManager>(runner.num_kv_blocks(), runner.kv_block_size()));
    schedulers_.push_back(std::make_unique<Scheduler>(
        SchedulerLimits{options_.max_num_seqs, options_.max_num_batched_tokens}, *blocks_.back()));
    kv_capacity = std::min(kv_capacity, runner.num_kv_blocks() * runner.kv_block_size());
  }
  // NOTES: one sequence alone must always fit in a rank's KV cache, or preemption could not make
  // progress; so the context limit is capped by the cache.
  max_model_len_ = options_.max_model_len > 0 ? options_.max_model_len : info.max_position_embeddings;
  if (max_model_len_ <= 0) max_model_len_ = kv_capacity;
  if (info.max_position_embeddings > 0 && max_model_len_ > info.max_position_embeddings) {
    MEGAMOE_FAIL("max_model_len ", max_model_len_, " must be <= the model's max_position_embeddings ",
                 info.max_position_embeddings);
  }
  if (max_model_len_ > kv_capacity) {
    std::fprintf(stderr, "megamoe: max_model_len %d lowered to the KV cache capacity of one rank (%d tokens)\n",
                 max_model_len_, kv_capacity);
    max_model_len_ = kv_capacity;
  }
  eos_ids_ = info.eos_token_ids;
  stats_.requests_per_rank.assign(runners_.size(), 0);
  publish_stats();
  thread_ = std::thread([this] { loop(); });
}

LLMEngine::~LLMEngine() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

SubmitResult LLMEngine::submit(std::vector<int32_t> prompt, engine::SamplingParams params, UpdateCallback on_update) {
  SubmitResult result;
  auto invalid = [&](std::string message) {
    result.status = SubmitResult::kInvalid;
    result.message = std::move(message);
    return result;
  };
  const int vocab = model_info().vocab_size;
  if (prompt.empty()) return invalid("prompt must contain at least one token");
  for (int32_t t : prompt)
    if (t < 0 || t >= vocab) return invalid(detail::concat("prompt token id ", t, " must be in [0, ", vocab, ")"));
  if (int(prompt.size()) >= max_model_len_)
    return invalid(detail::concat("This model's maximum context length is ", max_model_len_,
                                  " tokens. However, your prompt has ", prompt.size(),
                                  " tokens (it must leave room for at least one generated token)."));
  if (params.max_tokens <= 0) return invalid(detail::concat("max_tokens ", params.max_tokens, " must be > 0"));
  if (!(params.temperature >= 0.0f && std::isfinite(params.temperature))) return invalid(detail::concat("temperature ", params.temperature, " must be >= 0"));
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f))
    return invalid(detail::concat("top_p ", params.top_p, " must be in (0, 1]"));
  // A rank that can never step again (its worker process died) stops the whole server: with expert
  // parallelism the other ranks cannot run a forward without it.
  if (const std::string failed = failure(); !failed.empty()) {
    result.status = SubmitResult::kOverloaded;
    result.message = "server unavailable: " + failed;
    return result;
  }
  if (in_engine_.load() >= options_.max_queued_requests) {
    result.status = SubmitResult::kOverloaded;
    result.message = detail::concat("server overloaded: ", options_.max_queued_requests,
                                    " requests already in flight; retry later");
    return result;
  }
  auto request = std::make_unique<Request>();
  auto seq = std::make_shared<Sequence>();
  seq->num_prompt_tokens = int(prompt.size());
  seq->tokens = std::move(prompt);
  seq->max_total_tokens = int(std::min<int64_t>(int64_t(seq->num_prompt_tokens) + params.max_tokens, max_model_len_));
  seq->arrival = std::chrono::steady_clock::now();
  request->detokenizer = std::make_unique<IncrementalDetokenizer>(*tokenizer_, params.stop);
  request->on_update = std::move(on_update);
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      result.status = SubmitResult::kOverloaded;
      result.message = "server is shutting down";
      return result;
    }
    seq->id = next_id_++;
    const uint64_t seed = params.seed >= 0 ? uint64_t(params.seed)
                                           : options_.seed * 0x9E3779B97F4A7C15ull + (++seed_counter_);
    params.seed = int64_t(seed & 0x7FFFFFFFFFFFFFFFull);
    seq->params = std::move(params);
    request->seq = seq;
    result.id = seq->id;
    inbox_.push_back(std::move(request));
    ++in_engine_;
  }
  if (metrics_) metrics_->prompt_tokens += seq->num_prompt_tokens;
  wake_.notify_all();
  return result;
}

void LLMEngine::abort(int64_t id) {
  {
    std::lock_guard lock(mutex_);
    abort_inbox_.push_back(id);
  }
  wake_.notify_all();
}

EngineStats LLMEngine::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void LLMEngine::publish_stats() {
  EngineStats s;
  for (size_t r = 0; r < schedulers_.size(); ++r) {
    s.waiting += schedulers_[r]->num_waiting();
    s.running += schedulers_[r]->num_running();
    s.kv_blocks_free += blocks_[r]->num_free();
    s.kv_blocks_total += blocks_[r]->num_blocks();
    s.preemptions += schedulers_[r]->num_preemptions();
  }
  s.steps = steps_;
  std::lock_guard lock(mutex_);
  s.waiting += int64_t(inbox_.size());
  s.requests_per_rank = stats_.requests_per_rank;
  stats_ = std::move(s);
}

void LLMEngine::admit_new_requests() {
  std::deque<std::unique_ptr<Request>> incoming;
  {
    std::lock_guard lock(mutex_);
    incoming.swap(inbox_);
  }
  for (auto& request : incoming) {
    // Balance: the rank with the least outstanding work (tokens still to run or generate) gets it; ties go
    // round-robin (the scan starts after the last rank chosen), so requests that each finish before the next
    // one arrives (idle ranks, all at load 0) still spread over the ranks instead of all landing on rank 0.
    int best = first_rank_to_try_;
    int64_t best_load = INT64_MAX;
    for (int i = 0; i < num_ranks(); ++i) {
      const int r = (first_rank_to_try_ + i) % num_ranks();
      const int64_t load = schedulers_[size_t(r)]->pending_tokens();
      if (load < best_load) {
        best_load = load;
        best = r;
      }
    }
    first_rank_to_try_ = (best + 1) % num_ranks();
    request->seq->rank = best;
    schedulers_[size_t(best)]->add(request->seq);
    {
      std::lock_guard lock(mutex_);
      ++stats_.requests_per_rank[size_t(best)];
    }
    const int64_t id = request->seq->id;
    live_.emplace(id, std::move(request));
  }
}

void LLMEngine::apply_aborts() {
  std::vector<int64_t> ids;
  {
    std::lock_guard lock(mutex_);
    ids.swap(abort_inbox_);
  }
  for (int64_t id : ids) {
    auto found = live_.find(id);
    if (found == live_.end()) continue;  // already finished
    finish(*found->second, FinishReason::kAbort, GenerationUpdate{});
  }
}

void LLMEngine::finish(Request& request, FinishReason reason, GenerationUpdate update) {
  Sequence& seq = *request.seq;
  schedulers_[size_t(seq.rank)]->remove(seq.id);
  update.finished = true;
  update.finish_reason = reason;
  update.num_prompt_tokens = seq.num_prompt_tokens;
  update.num_output_tokens = seq.num_output_tokens();
  if (reason == FinishReason::kStop || reason == FinishReason::kLength) update.new_text += request.detokenizer->take_new_text(true);
  if (metrics_) {
    if (reason == FinishReason::kAbort) ++metrics_->requests_aborted;
    if (reason == FinishReason::kError) ++metrics_->requests_error;
  }
  UpdateCallback callback = std::move(request.on_update);
  live_.erase(seq.id);  // destroys `request`
  --in_engine_;
  // Stats first: whoever the callback wakes sees this sequence's blocks already free.
  publish_stats();
  if (callback) callback(std::move(update));
}

std::string LLMEngine::failure() const {
  for (const auto& runner : runners_)
    if (std::string failed = runner->failure(); !failed.empty()) return failed;
  return {};
}

void LLMEngine::process_step(int rank, const ScheduledStep& step, const std::vector<int32_t>& sampled,
                             const std::string& error) {
  size_t wanted = 0;
  for (const auto& chunk : step.batch.chunks) wanted += chunk.want_logits;
  std::string failure = error;
  if (failure.empty() && sampled.size() != wanted)
    failure = detail::concat("rank ", rank, " runner returned ", sampled.size(), " sampled tokens, expected ", wanted);
  if (!failure.empty()) {
    std::fprintf(stderr, "megamoe: step failed on rank %d: %s\n", rank, failure.c_str());
    for (const auto& seq : step.sequences) {
      auto found = live_.find(seq->id);
      if (found == live_.end()) continue;
      GenerationUpdate update;
      update.error = failure;
      finish(*found->second, FinishReason::kError, std::move(update));
    }
    return;
  }
  schedulers_[size_t(rank)]->mark_computed(step);
  const int vocab = model_info().vocab_size;
  size_t row = 0;
  for (size_t i = 0; i < step.sequences.size(); ++i) {
    if (!step.batch.chunks[i].want_logits) continue;
    const int32_t token = sampled[row++];
    auto found = live_.find(step.sequences[i]->id);
    if (found == live_.end()) continue;
    Request& request = *found->second;
    Sequence& seq = *request.seq;
    GenerationUpdate update;
    if (token < 0 || token >= vocab) {
      update.error = detail::concat("sampled token ", token, " must be in [0, vocab_size ", vocab, ")");
      finish(request, FinishReason::kError, std::move(update));
      continue;
    }
    if (seq.params.temperature > 0.0f) ++seq.sampler_draws;
    seq.tokens.push_back(token);
    update.new_tokens.push_back(token);
    if (metrics_) {
      ++metrics_->generation_tokens;
      if (!seq.first_token_emitted)
        metrics_->observe_ttft(std::chrono::duration<double>(std::chrono::steady_clock::now() - seq.arrival).count());
    }
    seq.first_token_emitted = true;
    FinishReason reason = FinishReason::kNone;
    const bool is_eos = std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end();
    if (is_eos && !seq.params.ignore_eos) {
      reason = FinishReason::kStop;
    } else if (request.detokenizer->add_token(token)) {
      reason = FinishReason::kStop;
    } else if (seq.num_output_tokens() >= seq.params.max_tokens || seq.num_tokens() >= seq.max_total_tokens) {
      reason = FinishReason::kLength;
    }
    if (reason != FinishReason::kNone) {
      finish(request, reason, std::move(update));
      continue;
    }
    update.new_text = request.detokenizer->take_new_text(false);
    update.num_prompt_tokens = seq.num_prompt_tokens;
    update.num_output_tokens = seq.num_output_tokens();
    if (request.on_update) request.on_update(std::move(update));
  }
}

void LLMEngine::loop() {
  const size_t ranks = runners_.size();
  while (true) {
    bool busy = false;
    for (const auto& s : schedulers_) busy = busy || s->has_work();
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || busy || !inbox_.empty() || !abort_inbox_.empty(); });
      if (stopping_) break;
    }
    admit_new_requests();
    apply_aborts();
    std::vector<ScheduledStep> steps(ranks);
    bool any = false;
    for (size_t r = 0; r < ranks; ++r) {
      steps[r] = schedulers_[r]->schedule();
      any = any || !steps[r].empty();
    }
    if (!any) {
      publish_stats();
      continue;
    }
    std::vector<std::vector<int32_t>> outputs(ranks);
    std::vector<std::string> errors(ranks);
    auto run_rank = [&](size_t r) {
      try {
        std::vector<engine::ChunkSampling> sampling;
        for (size_t i = 0; i < steps[r].sequences.size(); ++i) {
          if (!steps[r].batch.chunks[i].want_logits) continue;
          const Sequence& seq = *steps[r].sequences[i];
          sampling.push_back({seq.params.temperature, seq.params.top_p, seq.params.seed, seq.sampler_draws});
        }
        outputs[r] = runners_[r]->step_and_sample(steps[r].batch, sampling);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    };
    std::vector<std::future<void>> others;
    for (size_t r = 1; r < ranks; ++r)
      if (options_.lockstep_ranks || !steps[r].empty()) others.push_back(std::async(std::launch::async, run_rank, r));
    if (options_.lockstep_ranks || !steps[0].empty()) run_rank(0);
    for (auto& f : others) f.get();
    ++steps_;
    for (size_t r = 0; r < ranks; ++r)
      if (!steps[r].empty()) process_step(int(r), steps[r], outputs[r], errors[r]);
    if (metrics_) {
      int64_t preemptions = 0;
      for (const auto& s : schedulers_) preemptions += s->num_preemptions();
      metrics_->preemptions = preemptions;
    }
    publish_stats();
  }
  // Shutting down: every unfinished request learns it was aborted.
  admit_new_requests();
  std::vector<int64_t> ids;
  for (const auto& [id, request] : live_) ids.push_back(id);
  for (int64_t id : ids) finish(*live_.at(id), FinishReason::kAbort, GenerationUpdate{});
  publish_stats();
}

}  // namespace megamoe::server
