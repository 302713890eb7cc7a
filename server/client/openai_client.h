// A small client for OpenAI-compatible /v1/completions endpoints (ours, vLLM, ...), used by
// `megamoe bench serve` and `megamoe eval gsm8k`: one call, streamed or not, timed per token.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace httplib {
class Client;
}

namespace megamoe::client {

struct Endpoint {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string path_prefix;  // e.g. "" or "/proxy"; "/v1/completions" is appended
  // Parses "http://host:port[/prefix]" (https is not supported: loopback and cluster use).
  static Endpoint parse(const std::string& base_url);
};

struct CallResult {
  bool ok = false;
  std::string error;            // HTTP status + message, or the transport error
  std::string text;
  int prompt_tokens = 0;        // from usage when the server reports it
  int output_tokens = 0;        // from usage; else the number of streamed chunks carrying text
  double ttft_s = 0;            // first chunk with text (stream), else the whole latency
  std::vector<double> itl_s;    // gaps between later chunks with text (stream only)
  double latency_s = 0;
  std::string finish_reason;
};

class CompletionClient {
 public:
  explicit CompletionClient(const Endpoint& endpoint, double timeout_s = 600);
  ~CompletionClient();
  // POSTs `body` (stream and stream_options are set from `stream`).
  CallResult complete(nlohmann::json body, bool stream);
  // GET /v1/models: the first model id, or "" when the call fails.
  std::string first_model();

 private:
  Endpoint endpoint_;
  std::unique_ptr<httplib::Client> http_;
};

}  // namespace megamoe::client
