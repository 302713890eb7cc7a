#include "server/client/openai_client.h"

#include <httplib.h>

#include <chrono>

#include "megamoe/error.h"

namespace megamoe::client {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

Endpoint Endpoint::parse(const std::string& base_url) {
  Endpoint e;
  std::string rest = base_url;
  const std::string scheme = "http://";
  MEGAMOE_CHECK(rest.rfind("https://", 0) != 0, "base url '", base_url, "': https is not supported");
  if (rest.rfind(scheme, 0) == 0) rest = rest.substr(scheme.size());
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  e.path_prefix = slash == std::string::npos ? "" : rest.substr(slash);
  while (!e.path_prefix.empty() && e.path_prefix.back() == '/') e.path_prefix.pop_back();
  if (e.path_prefix.size() >= 3 && e.path_prefix.compare(e.path_prefix.size() - 3, 3, "/v1") == 0)
    e.path_prefix.resize(e.path_prefix.size() - 3);  // accept ".../v1" like the OpenAI SDK
  const size_t colon = authority.rfind(':');
  if (colon != std::string::npos) {
    e.host = authority.substr(0, colon);
    try {
      e.port = std::stoi(authority.substr(colon + 1));
    } catch (const std::exception&) {
      MEGAMOE_FAIL("base url '", base_url, "': port '", authority.substr(colon + 1), "' is not a number");
    }
  } else {
    e.host = authority;
    e.port = 80;
  }
  MEGAMOE_CHECK(!e.host.empty(), "base url '", base_url, "' has no host");
  return e;
}

CompletionClient::CompletionClient(const Endpoint& endpoint, double timeout_s)
    : endpoint_(endpoint), http_(std::make_unique<httplib::Client>(endpoint.host, endpoint.port)) {
  const auto timeout = std::chrono::milliseconds(int64_t(timeout_s * 1000));
  http_->set_connection_timeout(std::chrono::seconds(10));
  http_->set_read_timeout(timeout);
  http_->set_write_timeout(timeout);
  http_->set_keep_alive(true);
}

CompletionClient::~CompletionClient() = default;

std::string CompletionClient::first_model() {
  auto res = http_->Get(endpoint_.path_prefix + "/v1/models");
  if (!res || res->status != 200) return "";
  json body = json::parse(res->body, nullptr, false);
  if (body.is_discarded() || !body.contains("data") || !body["data"].is_array() || body["data"].empty()) return "";
  return body["data"][0].value("id", "");
}

CallResult CompletionClient::complete(json body, bool stream) {
  CallResult out;
  body["stream"] = stream;
  if (stream) body["stream_options"] = {{"include_usage", true}};
  const std::string path = endpoint_.path_prefix + "/v1/completions";
  const auto start = Clock::now();
  auto seconds_since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };

  if (!stream) {
    auto res = http_->Post(path, body.dump(), "application/json");
    out.latency_s = out.ttft_s = seconds_since(start);
    if (!res) {
      out.error = "transport: " + httplib::to_string(res.error());
      return out;
    }
    json reply = json::parse(res->body, nullptr, false);
    if (res->status != 200 || reply.is_discarded() || !reply.contains("choices") || reply["choices"].empty()) {
      out.error = "HTTP " + std::to_string(res->status) + ": " + res->body.substr(0, 300);
      return out;
    }
    out.text = reply["choices"][0].value("text", "");
    out.finish_reason = reply["choices"][0].value("finish_reason", "");
    if (reply.contains("usage") && reply["usage"].is_object()) {
      out.prompt_tokens = reply["usage"].value("prompt_tokens", 0);
      out.output_tokens = reply["usage"].value("completion_tokens", 0);
    }
    out.ok = true;
    return out;
  }

  // Server-sent events: "data: {json}\n\n" ... "data: [DONE]\n\n".
  std::string buffer, error_event;
  int chunks_with_text = 0;
  bool saw_done = false, usage_seen = false;
  double last_token_s = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  int status = 0;
  req.response_handler = [&](const httplib::Response& response) {
    status = response.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    buffer.append(data, size);
    size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      event.erase(0, 6);
      if (event == "[DONE]") {
        saw_done = true;
        continue;
      }
      json chunk = json::parse(event, nullptr, false);
      if (chunk.is_discarded()) continue;
      if (chunk.contains("error")) {
        error_event = chunk["error"].is_object() ? chunk["error"].value("message", event) : event;
        continue;
      }
      if (chunk.contains("usage") && chunk["usage"].is_object()) {
        out.prompt_tokens = chunk["usage"].value("prompt_tokens", 0);
        out.output_tokens = chunk["usage"].value("completion_tokens", 0);
        usage_seen = true;
      }
      if (!chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].empty()) continue;
      const json& choice = chunk["choices"][0];
      const std::string text = choice.value("text", "");
      const bool has_tokens = choice.contains("token_ids") && choice["token_ids"].is_array() && !choice["token_ids"].empty();
      if (choice.contains("finish_reason") && choice["finish_reason"].is_string())
        out.finish_reason = choice["finish_reason"].get<std::string>();
      if (text.empty() && !has_tokens && chunks_with_text > 0) continue;
      if (text.empty() && !has_tokens && !choice["finish_reason"].is_string()) continue;
      const double now = seconds_since(start);
      if (chunks_with_text == 0) {
        out.ttft_s = now;
      } else {
        out.itl_s.push_back(now - last_token_s);
      }
      last_token_s = now;
      ++chunks_with_text;
      out.text += text;
    }
    return true;
  };
  auto res = http_->send(req);
  out.latency_s = seconds_since(start);
  if (!res) {
    out.error = "transport: " + httplib::to_string(res.error());
    return out;
  }
  if (res->status != 200 && status == 0) status = res->status;
  if (status != 200) {
    out.error = "HTTP " + std::to_string(status) + ": " + buffer.substr(0, 300) + res->body.substr(0, 300);
    return out;
  }
  if (!error_event.empty()) {
    out.error = "stream error: " + error_event;
    return out;
  }
  if (!saw_done) {
    out.error = "stream ended without [DONE]";
    return out;
  }
  if (!usage_seen) out.output_tokens = chunks_with_text;
  out.ok = true;
  return out;
}

}  // namespace megamoe::client
