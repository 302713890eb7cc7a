// The serving loop: owns one Scheduler + KvBlockManager per data-parallel rank (one ModelRunner
// each), balances new requests over ranks, and on its own thread repeats schedule -> runner.step on
// every rank (in parallel) -> sample -> detokenize/stop -> report to the request's callback.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/runner.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "server/sequence.h"
#include "server/tokenizer.h"

namespace megamoe::server {

struct EngineOptions {
  int max_num_seqs = 256;               // per rank
  int max_num_batched_tokens = 8192;    // per rank and step
  int max_model_len = 0;                // 0: the model's max_position_embeddings
  int max_queued_requests = 4096;       // requests in the engine (all ranks) before submit says overloaded
  uint64_t seed = 0;                    // seeds requests that bring no seed of their own
  // Every rank steps every iteration, with an empty batch when it has nothing (expert parallelism:
  // all ranks must join each forward's collectives).
  bool lockstep_ranks = false;
};

// What a request learns after a step that touched it. Called on the engine thread: must be quick.
struct GenerationUpdate {
  std::vector<int32_t> new_tokens;
  std::string new_text;                 // final text released by this step (see IncrementalDetokenizer)
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;                    // with FinishReason::kError
  int num_prompt_tokens = 0;
  int num_output_tokens = 0;
};
using UpdateCallback = std::function<void(GenerationUpdate&&)>;

struct SubmitResult {
  enum Status { kOk, kInvalid, kOverloaded } status = kOk;
  int64_t id = -1;
  std::string message;
};

struct EngineStats {
  int64_t waiting = 0, running = 0, kv_blocks_free = 0, kv_blocks_total = 0, preemptions = 0, steps = 0;
  std::vector<int64_t> requests_per_rank;  // sequences ever assigned to each rank
};

class LLMEngine {
 public:
  // All runners must agree on vocab size and block size. Starts the loop thread.
  LLMEngine(std::vector<std::unique_ptr<engine::ModelRunner>> runners, std::shared_ptr<const Tokenizer> tokenizer,
            EngineOptions options, ServerMetrics* metrics = nullptr);
  ~LLMEngine();  // stops the loop; unfinished requests get FinishReason::kAbort
  LLMEngine(const LLMEngine&) = delete;
  LLMEngine& operator=(const LLMEngine&) = delete;

  // Validates (prompt length, token ids, max_tokens) and queues the request; kInvalid/kOverloaded
  // carry a message for the client. `on_update` is called until an update with finished = true.
  SubmitResult submit(std::vector<int32_t> prompt, engine::SamplingParams params, UpdateCallback on_update);
  // Frees the request's sequence soon (on the loop thread); its callback then sees kAbort.
  void abort(int64_t id);

  const engine::ModelInfo& model_info() const { return runners_.front()->info(); }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  int max_model_len() const { return max_model_len_; }
  int num_ranks() const { return int(runners_.size()); }
  EngineStats stats() const;
  // Non-empty once some rank can never step again (its worker process died): then every new
  // request is refused (503) and /health answers 503.
  std::string failure() const;

 private:
  struct Request;
  void loop();
  void admit_new_requests();
  void apply_aborts();
  void process_step(int rank, const ScheduledStep& step, const std::vector<int32_t>& sampled, const std::string& error);
  void finish(Request& request, FinishReason reason, GenerationUpdate update);
  void publish_stats();

  std::vector<std::unique_ptr<engine::ModelRunner>> runners_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  EngineOptions options_;
  ServerMetrics* metrics_;
  int max_model_len_ = 0;
  std::vector<std::unique_ptr<KvBlockManager>> blocks_;
  std::vector<std::unique_ptr<Scheduler>> schedulers_;
  std::vector<int32_t> eos_ids_;

  mutable std::mutex mutex_;            // guards the inboxes and stats below
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Request>> inbox_;
  std::vector<int64_t> abort_inbox_;
  std::atomic<int64_t> in_engine_{0};   // submitted and not finished
  bool stopping_ = false;
  EngineStats stats_;
  int64_t next_id_ = 1;
  uint64_t seed_counter_ = 0;

  // Loop-thread state: the requests in the schedulers, by id.
  std::unordered_map<int64_t, std::unique_ptr<Request>> live_;
  int first_rank_to_try_ = 0;  // admit_new_requests: where the least-load scan starts (round-robin ties)
  int64_t steps_ = 0;
  std::thread thread_;
};

}  // namespace megamoe::server
