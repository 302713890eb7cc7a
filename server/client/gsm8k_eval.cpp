#include "server/client/gsm8k_eval.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

#include "megamoe/error.h"
#include "server/client/openai_client.h"

namespace megamoe::client {

using json = nlohmann::json;

std::vector<Gsm8kProblem> load_gsm8k(const std::string& path) {
  std::ifstream in(path);
  MEGAMOE_CHECK(in.good(), "GSM8K file '", path, "' cannot be opened (see --data-path)");
  std::vector<Gsm8kProblem> out;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    json row = json::parse(line, nullptr, false);
    MEGAMOE_CHECK(!row.is_discarded() && row.is_object() && row.contains("question") && row["question"].is_string() &&
                      row.contains("answer") && row["answer"].is_string(),
                  path, ":", number, " must be a JSON object with string 'question' and 'answer'");
    out.push_back({row["question"].get<std::string>(), row["answer"].get<std::string>()});
  }
  return out;
}

std::optional<int64_t> extract_last_integer(std::string_view text) {
  std::string cleaned;
  cleaned.reserve(text.size());
  for (char c : text)
    if (c != ',') cleaned.push_back(c);
  std::optional<int64_t> last;
  for (size_t i = 0; i < cleaned.size();) {
    if (!std::isdigit(uint8_t(cleaned[i]))) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < cleaned.size() && std::isdigit(uint8_t(cleaned[end]))) ++end;
    const bool negative = i > 0 && cleaned[i - 1] == '-';
    // NOTES: saturate absurdly long digit runs instead of overflowing; they never equal a gold answer.
    int64_t value = 0;
    for (size_t k = i; k < end; ++k) value = value > (INT64_MAX - 9) / 10 ? INT64_MAX : value * 10 + (cleaned[k] - '0');
    last = negative ? -value : value;
    i = end;
  }
  return last;
}

std::optional<int64_t> gold_answer(std::string_view solution) {
  const size_t mark = solution.rfind("####");
  if (mark == std::string_view::npos) return std::nullopt;
  return extract_last_integer(solution.substr(mark + 4));
}

std::string gsm8k_prompt(const std::vector<Gsm8kProblem>& shots, const std::string& question) {
  std::string prompt;
  for (const Gsm8kProblem& shot : shots) prompt += "Question: " + shot.question + "\nAnswer: " + shot.answer + "\n\n";
  prompt += "Question: " + question + "\nAnswer:";
  return prompt;
}

json run_gsm8k_eval(const Gsm8kOptions& o) {
  MEGAMOE_CHECK(o.num_shots >= 0, "--num-shots ", o.num_shots, " must be >= 0");
  MEGAMOE_CHECK(o.concurrency > 0, "--concurrency ", o.concurrency, " must be > 0");
  MEGAMOE_CHECK(o.max_tokens > 0, "--max-tokens ", o.max_tokens, " must be > 0");
  const std::vector<Gsm8kProblem> train = load_gsm8k(o.data_path + "/train.jsonl");
  std::vector<Gsm8kProblem> test = load_gsm8k(o.data_path + "/test.jsonl");
  MEGAMOE_CHECK(int(train.size()) >= o.num_shots, "train.jsonl has ", train.size(), " problems, --num-shots needs ",
                o.num_shots);
  if (o.num_questions > 0 && o.num_questions < int(test.size())) test.resize(size_t(o.num_questions));
  MEGAMOE_CHECK(!test.empty(), "no GSM8K test questions to evaluate");
  const std::vector<Gsm8kProblem> shots(train.begin(), train.begin() + o.num_shots);
  std::string model = o.model;
  const Endpoint endpoint = Endpoint::parse(o.base_url);
  if (model.empty()) {
    CompletionClient probe(endpoint, 30);
    model = probe.first_model();
    MEGAMOE_CHECK(!model.empty(), "no --model given and GET ", o.base_url, "/v1/models gave none");
  }

  std::vector<CallResult> results(test.size());
  std::atomic<size_t> next{0};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < std::min<int>(o.concurrency, int(test.size())); ++w) {
    workers.emplace_back([&] {
      CompletionClient client(endpoint, o.request_timeout_s);
      for (size_t i; (i = next++) < test.size();) {
        json body{{"model", model},
                  {"prompt", gsm8k_prompt(shots, test[i].question)},
                  {"max_tokens", o.max_tokens},
                  {"temperature", 0.0},
                  {"stop", {"Question", "Assistant:"}}};
        results[i] = client.complete(body, /*stream=*/false);
      }
    });
  }
  for (auto& t : workers) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  int correct = 0, invalid = 0, failed = 0;
  json details = json::array();
  for (size_t i = 0; i < test.size(); ++i) {
    const auto gold = gold_answer(test[i].answer);
    MEGAMOE_CHECK(gold.has_value(), "test question ", i, " has no '#### N' gold answer");
    std::optional<int64_t> predicted;
    if (results[i].ok) predicted = extract_last_integer(results[i].text);
    if (!results[i].ok) ++failed;
    if (!predicted) ++invalid;
    if (predicted && *predicted == *gold) ++correct;
    if (o.save_detailed)
      details.push_back({{"index", i}, {"gold", *gold}, {"predicted", predicted ? json(*predicted) : json(nullptr)},
                         {"reply", results[i].text}, {"error", results[i].error}});
  }
  const double n = double(test.size());
  json out{{"task", "gsm8k"},
           {"model", model},
           {"num_shots", o.num_shots},
           {"max_tokens", o.max_tokens},
           {"num_questions", test.size()},
           {"num_correct", correct},
           {"num_invalid", invalid},
           {"num_failed_requests", failed},
           {"accuracy", correct / n},
           {"invalid_rate", invalid / n},
           {"latency_s", seconds},
           {"questions_per_s", n / seconds}};
  if (o.save_detailed) out["details"] = details;
  return out;
}

}  // namespace megamoe::client
