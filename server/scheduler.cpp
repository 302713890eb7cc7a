#include "server/scheduler.h"

#include <algorithm>

#include "megamoe/error.h"

namespace megamoe::server {

Scheduler::Scheduler(SchedulerLimits limits, KvBlockManager& blocks) : limits_(limits), blocks_(blocks) {
  MEGAMOE_CHECK(limits.max_num_seqs > 0, "max_num_seqs ", limits.max_num_seqs, " must be > 0");
  MEGAMOE_CHECK(limits.max_num_batched_tokens > 0, "max_num_batched_tokens ", limits.max_num_batched_tokens,
                " must be > 0");
}

void Scheduler::add(std::shared_ptr<Sequence> seq) { waiting_.push_back(std::move(seq)); }

void Scheduler::add_chunk(ScheduledStep& step, const std::shared_ptr<Sequence>& seq, int num_tokens) {
  engine::SequenceChunk chunk;
  chunk.seq_id = seq->id;
  chunk.start_position = seq->num_computed;
  chunk.tokens.assign(seq->tokens.begin() + seq->num_computed, seq->tokens.begin() + seq->num_computed + num_tokens);
  chunk.block_table = seq->block_table;
  // Logits only when the chunk reaches the newest token: that is where the next token is sampled.
  chunk.want_logits = seq->num_computed + num_tokens == seq->num_tokens();
  step.batch.chunks.push_back(std::move(chunk));
  step.sequences.push_back(seq);
}

void Scheduler::preempt(std::shared_ptr<Sequence> seq) {
  // NOTES: recompute-style preemption: its KV blocks are freed and it restarts from position 0
  // (prompt + tokens generated so far) when readmitted, at the front of the waiting line.
  blocks_.release(*seq);
  seq->num_computed = 0;
  ++seq->num_preemptions;
  ++num_preemptions_;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  waiting_.push_front(std::move(seq));
}

ScheduledStep Scheduler::schedule() {
  ScheduledStep step;
  int budget = limits_.max_num_batched_tokens;
  bool preempted = false;
  // 1. Running sequences first, oldest first: decodes and the next chunk of partial prefills.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    std::shared_ptr<Sequence> seq = running_[i];
    const int n = std::min(seq->num_pending(), budget);
    if (n <= 0) {
      ++i;
      continue;
    }
    bool scheduled_self = true;
    while (!blocks_.ensure_capacity(*seq, seq->num_computed + n)) {
      std::shared_ptr<Sequence> victim = running_.back();
      preempted = true;
      preempt(victim);
      if (victim == seq) {
        scheduled_self = false;
        break;
      }
    }
    if (!scheduled_self) break;  // it was the newest; everything after it is gone too
    add_chunk(step, seq, n);
    budget -= n;
    ++i;
  }
  // 2. Admit waiting sequences while budget, sequence slots and KV blocks allow (not in a step that
  //    had to preempt: memory is short, let the running ones finish first).
  while (!preempted && !waiting_.empty() && budget > 0 && int(running_.size()) < limits_.max_num_seqs) {
    std::shared_ptr<Sequence> seq = waiting_.front();
    const int n = std::min(seq->num_pending(), budget);
    if (!blocks_.ensure_capacity(*seq, seq->num_computed + n)) break;
    waiting_.pop_front();
    running_.push_back(seq);
    add_chunk(step, seq, n);
    budget -= n;
  }
  return step;
}

void Scheduler::mark_computed(const ScheduledStep& step) {
  for (size_t i = 0; i < step.sequences.size(); ++i) {
    Sequence& seq = *step.sequences[i];
    seq.num_computed += int(step.batch.chunks[i].tokens.size());
  }
}

bool Scheduler::remove(int64_t seq_id) {
  for (auto* queue : {&running_, &waiting_}) {
    auto found = std::find_if(queue->begin(), queue->end(), [&](const auto& s) { return s->id == seq_id; });
    if (found != queue->end()) {
      blocks_.release(**found);
      queue->erase(found);
      return true;
    }
  }
  return false;
}

int64_t Scheduler::pending_tokens() const {
  int64_t total = 0;
  for (const auto* queue : {&running_, &waiting_})
    for (const auto& s : *queue) total += s->num_pending() + (s->params.max_tokens - s->num_output_tokens());
  return total;
}

}  // namespace megamoe::server
