#include "server/openai_protocol.h"

#include <algorithm>

namespace megamoe::server {

using json = nlohmann::json;

namespace {

// Reads an optional field of the expected JSON kind; null counts as absent.
template <typename T>
bool read_field(const json& body, const char* name, T& out, std::string& error) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return true;
  bool ok = false;
  const char* want = "";
  if constexpr (std::is_same_v<T, bool>) {
    ok = it->is_boolean(), want = "a boolean";
  } else if constexpr (std::is_integral_v<T>) {
    ok = it->is_number_integer(), want = "an integer";
  } else if constexpr (std::is_floating_point_v<T>) {
    ok = it->is_number(), want = "a number";
  } else {
    ok = it->is_string(), want = "a string";
  }
  if (!ok) {
    error = std::string("'") + name + "' must be " + want + ", got " + it->type_name();
    return false;
  }
  out = it->get<T>();
  return true;
}

bool read_prompt(const json& body, const Tokenizer& tokenizer, std::vector<int32_t>& tokens, std::string& error) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) {
    error = "'prompt' is required";
    return false;
  }
  const json* prompt = &*it;
  // A list holding exactly one prompt (string or token list) is the same as that prompt.
  if (prompt->is_array() && prompt->size() == 1 && ((*prompt)[0].is_string() || (*prompt)[0].is_array()))
    prompt = &(*prompt)[0];
  if (prompt->is_string()) {
    tokens = tokenizer.encode(prompt->get<std::string>());
    return true;
  }
  if (prompt->is_array()) {
    for (const json& t : *prompt) {
      if (t.is_string() || t.is_array()) {
        error = "only one prompt per request is supported (n = 1, no prompt batches)";
        return false;
      }
      if (!t.is_number_integer()) {
        error = std::string("'prompt' token ids must be integers, got ") + t.type_name();
        return false;
      }
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id > INT32_MAX) {
        error = "'prompt' token id " + std::to_string(id) + " is out of range";
        return false;
      }
      tokens.push_back(int32_t(id));
    }
    return true;
  }
  error = std::string("'prompt' must be a string or a list of token ids, got ") + prompt->type_name();
  return false;
}

}  // namespace

std::optional<CompletionRequest> parse_completion_request(const std::string& body_text, const Tokenizer& tokenizer,
                                                          const std::vector<std::string>& served_model_names,
                                                          std::string& error) {
  json body = json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    error = "request body is not valid JSON";
    return std::nullopt;
  }
  if (!body.is_object()) {
    error = "request body must be a JSON object";
    return std::nullopt;
  }
  CompletionRequest request;
  request.model = served_model_names.empty() ? "" : served_model_names.front();
  if (!read_field(body, "model", request.model, error)) return std::nullopt;
  if (std::find(served_model_names.begin(), served_model_names.end(), request.model) == served_model_names.end()) {
    error = "The model '" + request.model + "' does not exist (served: " +
            (served_model_names.empty() ? std::string() : served_model_names.front()) + ")";
    return std::nullopt;
  }
  if (!read_prompt(body, tokenizer, request.prompt_tokens, error)) return std::nullopt;
  engine::SamplingParams& p = request.params;
  int64_t max_tokens = p.max_tokens, seed = -1, n = 1;
  double temperature = p.temperature, top_p = p.top_p;
  if (!read_field(body, "max_tokens", max_tokens, error) || !read_field(body, "temperature", temperature, error) ||
      !read_field(body, "top_p", top_p, error) || !read_field(body, "seed", seed, error) ||
      !read_field(body, "n", n, error) || !read_field(body, "ignore_eos", p.ignore_eos, error) ||
      !read_field(body, "stream", request.stream, error) ||
      !read_field(body, "return_token_ids", request.return_token_ids, error))
    return std::nullopt;
  if (max_tokens <= 0 || max_tokens > INT32_MAX) {
    error = "'max_tokens' must be > 0, got " + std::to_string(max_tokens);
    return std::nullopt;
  }
  if (temperature < 0) {
    error = "'temperature' must be >= 0, got " + std::to_string(temperature);
    return std::nullopt;
  }
  if (!(top_p > 0 && top_p <= 1)) {
    error = "'top_p' must be in (0, 1], got " + std::to_string(top_p);
    return std::nullopt;
  }
  if (n != 1) {
    error = "'n' must be 1, got " + std::to_string(n);
    return std::nullopt;
  }
  p.max_tokens = int(max_tokens);
  if (auto given = body.find("max_tokens"); given != body.end() && !given->is_null()) request.max_tokens_given = true;
  p.temperature = float(temperature);
  p.top_p = float(top_p);
  p.seed = seed;
  if (auto stop = body.find("stop"); stop != body.end() && !stop->is_null()) {
    if (stop->is_string()) {
      p.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array() && std::all_of(stop->begin(), stop->end(), [](const json& s) { return s.is_string(); })) {
      for (const json& s : *stop) p.stop.push_back(s.get<std::string>());
    } else {
      error = "'stop' must be a string or a list of strings";
      return std::nullopt;
    }
  }
  if (auto options = body.find("stream_options"); options != body.end() && !options->is_null()) {
    if (!options->is_object() || !read_field(*options, "include_usage", request.include_usage, error)) {
      if (error.empty()) error = "'stream_options' must be an object";
      return std::nullopt;
    }
  }
  bool echo = false;
  if (!read_field(body, "echo", echo, error)) return std::nullopt;
  if (echo) {
    error = "'echo' is not supported";
    return std::nullopt;
  }
  if (auto logprobs = body.find("logprobs"); logprobs != body.end() && !logprobs->is_null()) {
    error = "'logprobs' is not supported";
    return std::nullopt;
  }
  return request;
}

json error_json(const std::string& message, int http_status) {
  const char* type = http_status == 400 ? "BadRequestError"
                     : http_status == 404 ? "NotFoundError"
                     : http_status == 503 ? "ServiceUnavailableError"
                                          : "InternalServerError";
  return json{{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", http_status}}}};
}

json usage_json(int prompt_tokens, int completion_tokens) {
  return json{{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens}};
}

json completion_json(const CompletionResult& r, bool return_token_ids) {
  json choice{{"index", 0}, {"text", r.text}, {"logprobs", nullptr}, {"finish_reason", r.finish_reason},
              {"stop_reason", nullptr}};
  if (return_token_ids) choice["token_ids"] = r.output_tokens;
  json out{{"id", r.id},
           {"object", "text_completion"},
           {"created", r.created},
           {"model", r.model},
           {"choices", json::array({choice})},
           {"usage", usage_json(int(r.prompt_tokens.size()), int(r.output_tokens.size()))}};
  if (return_token_ids) out["prompt_token_ids"] = r.prompt_tokens;
  return out;
}

json completion_chunk_json(const CompletionResult& header, const std::string& text_delta,
                           const std::vector<int32_t>& token_delta, const std::string& finish_reason,
                           bool return_token_ids) {
  json choice{{"index", 0}, {"text", text_delta}, {"logprobs", nullptr},
              {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}};
  if (return_token_ids) choice["token_ids"] = token_delta;
  return json{{"id", header.id},
              {"object", "text_completion"},
              {"created", header.created},
              {"model", header.model},
              {"choices", json::array({choice})}};
}

}  // namespace megamoe::server
