// Test-side SSE client for /v1/completions: collects text, token ids (return_token_ids), the
// finish reason and the usage chunk, and checks the event framing on the way.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace megamoe::server::testing {

using json = nlohmann::json;

struct StreamResult {
  int status = 0;
  std::string text;
  std::vector<int32_t> tokens;
  std::string finish_reason;
  json usage;
  bool done = false;
  std::string error;  // from an error event
  int events = 0;
};

inline StreamResult post_stream(int port, json body) {
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  StreamResult out;
  std::string buffer;
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(std::chrono::seconds(120));
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    buffer.append(data, size);
    for (size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
      std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (!event.empty() && event[0] == ':') continue;  // SSE comment (keep-alive)
      EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
      event.erase(0, 6);
      ++out.events;
      if (event == "[DONE]") {
        out.done = true;
        continue;
      }
      const json chunk = json::parse(event);
      if (chunk.contains("error")) {  // the server ended the stream (abort, error)
        out.error = chunk["error"].value("message", "");
        continue;
      }
      if (chunk.contains("usage")) out.usage = chunk["usage"];
      if (chunk["choices"].empty()) continue;
      out.text += chunk["choices"][0]["text"].get<std::string>();
      const json& choice = chunk["choices"][0];
      if (choice.contains("token_ids"))
        for (int32_t t : choice["token_ids"]) out.tokens.push_back(t);
      if (chunk["choices"][0]["finish_reason"].is_string()) out.finish_reason = chunk["choices"][0]["finish_reason"];
    }
    return true;
  };
  auto res = client.send(req);
  out.status = res ? res->status : -1;
  return out;
}

}  // namespace megamoe::server::testing
