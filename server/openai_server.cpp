#include "server/openai_server.h"

#include <httplib.h>
#include <signal.h>
#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "megamoe/error.h"
#include "server/openai_protocol.h"

namespace megamoe::server {

using json = nlohmann::json;

namespace {

// Updates of one request, handed from the engine thread to the HTTP worker serving it.
struct UpdateChannel {
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<GenerationUpdate> updates;
  bool finished = false;

  UpdateCallback callback(std::shared_ptr<UpdateChannel> self) {
    return [self](GenerationUpdate&& update) {
      {
        std::lock_guard lock(self->mutex);
        self->finished = self->finished || update.finished;
        self->updates.push_back(std::move(update));
      }
      self->ready.notify_all();
    };
  }
  // Waits up to `timeout` for updates; returns what arrived (possibly nothing).
  std::deque<GenerationUpdate> take(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex);
    ready.wait_for(lock, timeout, [&] { return !updates.empty(); });
    std::deque<GenerationUpdate> out;
    out.swap(updates);
    return out;
  }
};

void reply_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(error_json(message, status).dump(), "application/json");
}

// NOTES: Debian's compiled cpp-httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG is baked
// into the .so); hundreds of clients connecting at once overflow it and get reset. listen() again on
// the bound socket raises the backlog (Linux caps it at net.core.somaxconn).
class WideBacklogServer : public httplib::Server {
 public:
  void widen_backlog(int backlog) { ::listen(svr_sock_, backlog); }
};

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int status_for(FinishReason reason) { return reason == FinishReason::kAbort ? 503 : 500; }

}  // namespace

OpenAIServer::OpenAIServer(LLMEngine& engine, ServerMetrics& metrics, HttpOptions options)
    : engine_(engine), metrics_(metrics), options_(std::move(options)), http_(std::make_unique<WideBacklogServer>()),
      stopping_(std::make_shared<std::atomic<bool>>(false)) {
  MEGAMOE_CHECK(!options_.served_model_names.empty(), "served_model_names must not be empty");
  MEGAMOE_CHECK(options_.http_threads > 0, "http_threads ", options_.http_threads, " must be > 0");
  // NOTES: a client that disconnects turns our next write into EPIPE; without this the whole process
  // would die of SIGPIPE (httplib does not pass MSG_NOSIGNAL).
  ::signal(SIGPIPE, SIG_IGN);
  const int threads = options_.http_threads;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http_->set_payload_max_length(64u << 20);
  http_->set_keep_alive_max_count(1000);
  install_routes();
}

OpenAIServer::~OpenAIServer() { stop(); }

int OpenAIServer::bind() {
  if (options_.port == 0) {
    port_ = http_->bind_to_any_port(options_.host);
    MEGAMOE_CHECK(port_ > 0, "cannot bind any port on host ", options_.host);
  } else {
    MEGAMOE_CHECK(http_->bind_to_port(options_.host, options_.port), "cannot bind ", options_.host, ":",
                  options_.port, " (in use, or not a local address)");
    port_ = options_.port;
  }
  static_cast<WideBacklogServer*>(http_.get())->widen_backlog(4096);
  return port_;
}

void OpenAIServer::serve() { http_->listen_after_bind(); }

void OpenAIServer::start_background() {
  bind();
  thread_ = std::thread([this] { serve(); });
  // Bounded wait until the accept loop runs.
  for (int i = 0; i < 500 && !http_->is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

void OpenAIServer::stop() {
  stopping_->store(true);
  http_->stop();
  if (thread_.joinable()) thread_.join();
}

void OpenAIServer::install_routes() {
  const std::string default_model = options_.served_model_names.front();

  http_->set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string message = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
    }
    reply_error(res, 500, message);
  });

  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const std::string failed = engine_.failure();
    if (failed.empty()) {
      res.status = 200;
    } else {
      reply_error(res, 503, "server unavailable: " + failed);
    }
  });

  http_->Get("/v1/models", [this, default_model](const httplib::Request&, httplib::Response& res) {
    json data = json::array();
    for (const std::string& name : options_.served_model_names)
      data.push_back({{"id", name}, {"object", "model"}, {"created", unix_now()}, {"owned_by", "megamoe"},
                      {"root", default_model}, {"max_model_len", engine_.max_model_len()}});
    res.set_content(json{{"object", "list"}, {"data", data}}.dump(), "application/json");
  });

  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const EngineStats s = engine_.stats();
    std::string text = metrics_.render(s.waiting, s.running, s.kv_blocks_free, s.kv_blocks_total);
    text += "# HELP megamoe_rank_requests_total Sequences ever assigned to each data-parallel rank.\n"
            "# TYPE megamoe_rank_requests_total counter\n";
    for (size_t r = 0; r < s.requests_per_rank.size(); ++r)
      text += "megamoe_rank_requests_total{rank=\"" + std::to_string(r) + "\"} " +
              std::to_string(s.requests_per_rank[r]) + "\n";
    res.set_content(text, "text/plain; version=0.0.4");
  });

  http_->Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object() || !body.contains("prompt") || !body["prompt"].is_string())
      return reply_error(res, 400, "body must be a JSON object with a string 'prompt'");
    const auto tokens = engine_.tokenizer().encode(body["prompt"].get<std::string>());
    res.set_content(json{{"tokens", tokens}, {"count", tokens.size()}, {"max_model_len", engine_.max_model_len()}}.dump(),
                    "application/json");
  });

  http_->Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object() || !body.contains("tokens") || !body["tokens"].is_array())
      return reply_error(res, 400, "body must be a JSON object with a list 'tokens'");
    std::vector<int32_t> tokens;
    const int vocab = engine_.tokenizer().vocab_size();
    for (const json& t : body["tokens"]) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
        return reply_error(res, 400, "'tokens' must be integers in [0, " + std::to_string(vocab) + ")");
      tokens.push_back(t.get<int32_t>());
    }
    res.set_content(json{{"prompt", engine_.tokenizer().decode(tokens)}}.dump(), "application/json");
  });

  http_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    std::string error;
    auto parsed = parse_completion_request(req.body, engine_.tokenizer(), options_.served_model_names, error);
    if (!parsed) {
      ++metrics_.requests_bad;
      return reply_error(res, 400, error);
    }
    // As vLLM: an explicit max_tokens that cannot fit beside the prompt is the client's error; the
    // default max_tokens is cut at the context instead.
    if (parsed->max_tokens_given &&
        int64_t(parsed->prompt_tokens.size()) + parsed->params.max_tokens > engine_.max_model_len()) {
      ++metrics_.requests_bad;
      return reply_error(res, 400, detail::concat("This model's maximum context length is ", engine_.max_model_len(),
                                                  " tokens. However, you requested ",
                                                  parsed->prompt_tokens.size() + parsed->params.max_tokens,
                                                  " tokens (", parsed->prompt_tokens.size(), " in the prompt, ",
                                                  parsed->params.max_tokens, " in the completion ('max_tokens')).",
                                                  " Please reduce the length of the prompt or max_tokens."));
    }
    auto request = std::make_shared<CompletionRequest>(std::move(*parsed));
    auto channel = std::make_shared<UpdateChannel>();
    const SubmitResult submitted = engine_.submit(request->prompt_tokens, request->params, channel->callback(channel));
    if (submitted.status == SubmitResult::kInvalid) {
      ++metrics_.requests_bad;
      return reply_error(res, 400, submitted.message);
    }
    if (submitted.status == SubmitResult::kOverloaded) {
      ++metrics_.requests_overloaded;
      return reply_error(res, 503, submitted.message);
    }
    auto result = std::make_shared<CompletionResult>();
    result->id = "cmpl-" + std::to_string(submitted.id);
    result->created = unix_now();
    result->model = request->model;
    result->prompt_tokens = request->prompt_tokens;
    const int64_t id = submitted.id;

    if (!request->stream) {
      // NOTES: bounded waits so a stopping server never hangs on a worker thread.
      while (true) {
        for (GenerationUpdate& u : channel->take(std::chrono::milliseconds(200))) {
          result->text += u.new_text;
          result->output_tokens.insert(result->output_tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
          if (!u.finished) continue;
          if (u.finish_reason == FinishReason::kAbort || u.finish_reason == FinishReason::kError) {
            return reply_error(res, status_for(u.finish_reason),
                               u.error.empty() ? "request aborted (server stopping)" : u.error);
          }
          result->finish_reason = finish_reason_name(u.finish_reason);
          ++metrics_.requests_ok;
          res.set_content(completion_json(*result, request->return_token_ids).dump(), "application/json");
          return;
        }
        if (stopping_->load()) {
          engine_.abort(id);
          return reply_error(res, 503, "server stopping");
        }
      }
    }

    auto stopping = stopping_;
    auto done = std::make_shared<bool>(false);
    auto last_write = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
    LLMEngine* engine = &engine_;
    ServerMetrics* metrics = &metrics_;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [request, channel, result, stopping, done, last_write, engine, metrics, id](size_t, httplib::DataSink& sink) {
          auto send = [&](const json& event) {
            const std::string line = "data: " + event.dump() + "\n\n";
            *last_write = std::chrono::steady_clock::now();
            return sink.write(line.data(), line.size());
          };
          for (GenerationUpdate& u : channel->take(std::chrono::milliseconds(200))) {
            result->output_tokens.insert(result->output_tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
            if (u.finished && (u.finish_reason == FinishReason::kAbort || u.finish_reason == FinishReason::kError)) {
              send(error_json(u.error.empty() ? "request aborted" : u.error, status_for(u.finish_reason)));
              *done = true;
              sink.done();
              return true;
            }
            const std::string reason = u.finished ? finish_reason_name(u.finish_reason) : "";
            if ((!u.new_text.empty() || !u.new_tokens.empty() || u.finished) &&
                !send(completion_chunk_json(*result, u.new_text, u.new_tokens, reason, request->return_token_ids))) {
              engine->abort(id);  // client went away: free its sequence now
              return false;
            }
            if (u.finished) {
              if (request->include_usage) {
                json usage_chunk{{"id", result->id}, {"object", "text_completion"}, {"created", result->created},
                                 {"model", result->model}, {"choices", json::array()},
                                 {"usage", usage_json(u.num_prompt_tokens, u.num_output_tokens)}};
                send(usage_chunk);
              }
              static const std::string kDone = "data: [DONE]\n\n";
              sink.write(kDone.data(), kDone.size());
              ++metrics->requests_ok;
              *done = true;
              sink.done();
              return true;
            }
          }
          if (stopping->load()) {
            engine->abort(id);
            return false;
          }
          // NOTES: a request still queued writes nothing, so a client that left would go unnoticed;
          // an SSE comment after a second of silence finds out (clients ignore ':' lines).
          if (std::chrono::steady_clock::now() - *last_write > std::chrono::seconds(1)) {
            static const std::string kKeepAlive = ":\n\n";
            *last_write = std::chrono::steady_clock::now();
            if (!sink.write(kKeepAlive.data(), kKeepAlive.size())) {
              engine->abort(id);
              return false;
            }
          }
          return true;
        },
        [engine, id, done](bool) {
          // Whatever ended the response (client gone, server stopping), the sequence must not linger.
          if (!*done) engine->abort(id);
        });
  });
}

}  // namespace megamoe::server
