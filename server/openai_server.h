// The HTTP front of `megamoe serve`: OpenAI-compatible /v1/completions (JSON or SSE stream),
// /v1/models, /health, /tokenize, /detokenize and Prometheus /metrics over an LLMEngine.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server/llm_engine.h"
#include "server/metrics.h"

namespace httplib {
class Server;
}

namespace megamoe::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                               // 0: any free port (see port())
  std::vector<std::string> served_model_names;   // the first is the default and the one listed
  int http_threads = 512;                        // connections served at once (streams hold one each)
};

class OpenAIServer {
 public:
  OpenAIServer(LLMEngine& engine, ServerMetrics& metrics, HttpOptions options);
  ~OpenAIServer();  // stop()s

  // Binds the socket (throws megamoe::Error when it cannot) and returns the port.
  int bind();
  void serve();             // blocks until stop()
  void start_background();  // bind() + serve() on a thread
  void stop();
  int port() const { return port_; }

 private:
  void install_routes();
  LLMEngine& engine_;
  ServerMetrics& metrics_;
  HttpOptions options_;
  std::unique_ptr<httplib::Server> http_;
  std::shared_ptr<std::atomic<bool>> stopping_;
  std::thread thread_;
  int port_ = -1;
};

}  // namespace megamoe::server
