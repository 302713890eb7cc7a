// `megamoe eval gsm8k`: 5-shot GSM8K accuracy of any OpenAI-compatible completion endpoint.
// Prompt: the first `num_shots` training problems as "Question: ...\nAnswer: ...\n\n", then
// "Question: <test question>\nAnswer:". Greedy, 256 tokens, stop at "Question" / "Assistant:".
// The answer is the last integer in the reply (commas removed); no integer = invalid.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace megamoe::client {

struct Gsm8kProblem {
  std::string question;
  std::string answer;  // full solution text, ending in "#### N"
};

// Reads a GSM8K jsonl file ({"question", "answer"} per line). Throws megamoe::Error naming the line.
std::vector<Gsm8kProblem> load_gsm8k(const std::string& path);
// The last integer in `text` after removing commas ("1,234" -> 1234, "-5" -> -5); nullopt if none.
std::optional<int64_t> extract_last_integer(std::string_view text);
// The gold answer: the integer after "####" in a solution.
std::optional<int64_t> gold_answer(std::string_view solution);
std::string gsm8k_prompt(const std::vector<Gsm8kProblem>& shots, const std::string& question);

struct Gsm8kOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string model;            // "" -> the endpoint's first model
  std::string data_path;        // directory with train.jsonl and test.jsonl
  int num_questions = 0;        // 0: all test questions
  int num_shots = 5;
  int max_tokens = 256;
  int concurrency = 64;
  bool save_detailed = false;
  double request_timeout_s = 600;
};

// Runs the evaluation; the JSON holds accuracy, invalid_rate, questions_per_s and counts.
nlohmann::json run_gsm8k_eval(const Gsm8kOptions& options);

}  // namespace megamoe::client
