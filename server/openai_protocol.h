// The OpenAI-shaped JSON of /v1/completions: parsing a request body into engine inputs (every
// field type-checked, with a message naming it), and building responses, stream chunks and errors.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/runner.h"
#include "server/tokenizer.h"

namespace megamoe::server {

struct CompletionRequest {
  std::string model;                    // the served name it asked for (or the default)
  std::vector<int32_t> prompt_tokens;
  engine::SamplingParams params;
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  bool return_token_ids = false;        // vLLM extension: token ids of prompt and completion
  bool max_tokens_given = false;        // the body set max_tokens (else the default, cut at the context)
};

// Parses and validates a body; on failure returns nullopt and sets `error` (an HTTP 400 message).
std::optional<CompletionRequest> parse_completion_request(const std::string& body, const Tokenizer& tokenizer,
                                                          const std::vector<std::string>& served_model_names,
                                                          std::string& error);

// {"error": {"message", "type", "param", "code"}}
nlohmann::json error_json(const std::string& message, int http_status);

struct CompletionResult {
  std::string id;        // "cmpl-..."
  int64_t created = 0;   // unix seconds
  std::string model;
  std::string text;
  std::vector<int32_t> prompt_tokens, output_tokens;
  std::string finish_reason;
};
nlohmann::json completion_json(const CompletionResult& result, bool return_token_ids);
// One SSE chunk: text delta (+ token ids) and finish_reason (null until the last).
nlohmann::json completion_chunk_json(const CompletionResult& header, const std::string& text_delta,
                                     const std::vector<int32_t>& token_delta, const std::string& finish_reason,
                                     bool return_token_ids);
nlohmann::json usage_json(int prompt_tokens, int completion_tokens);

}  // namespace megamoe::server
