// Continuous batching for one data-parallel rank (one ModelRunner, one KV cache): every step it
// picks which sequences run and how many of their pending tokens, within a token budget (chunked
// prefill) and a sequence cap, and preempts (recompute) the newest running sequence when KV blocks
// run out. Balancing requests over ranks is the engine's job (it owns one Scheduler per rank).
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "engine/runner.h"
#include "server/block_manager.h"
#include "server/sequence.h"

namespace megamoe::server {

struct SchedulerLimits {
  int max_num_seqs = 256;             // sequences running at once
  int max_num_batched_tokens = 8192;  // tokens in one step (prefill chunks + decodes)
};

struct ScheduledStep {
  engine::StepBatch batch;                       // chunk i belongs to sequences[i]
  std::vector<std::shared_ptr<Sequence>> sequences;
  bool empty() const { return sequences.empty(); }
};

class Scheduler {
 public:
  Scheduler(SchedulerLimits limits, KvBlockManager& blocks);

  void add(std::shared_ptr<Sequence> seq);  // queued at the back of the waiting line
  ScheduledStep schedule();
  // After the runner ran `step`: the scheduled tokens are now in the KV cache.
  void mark_computed(const ScheduledStep& step);
  // Removes a sequence (finished or aborted) and frees its blocks. False if it is not here.
  bool remove(int64_t seq_id);

  int num_waiting() const { return int(waiting_.size()); }
  int num_running() const { return int(running_.size()); }
  // Tokens still to run over all sequences here (the balancing metric across ranks).
  int64_t pending_tokens() const;
  int64_t num_preemptions() const { return num_preemptions_; }
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }

 private:
  void preempt(std::shared_ptr<Sequence> seq);
  static void add_chunk(ScheduledStep& step, const std::shared_ptr<Sequence>& seq, int num_tokens);

  SchedulerLimits limits_;
  KvBlockManager& blocks_;
  std::deque<std::shared_ptr<Sequence>> waiting_;
  std::deque<std::shared_ptr<Sequence>> running_;  // oldest first; the newest is preempted first
  int64_t num_preemptions_ = 0;
};

}  // namespace megamoe::server
