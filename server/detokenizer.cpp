#include "server/detokenizer.h"

#include <algorithm>

namespace megamoe::server {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, std::vector<std::string> stop)
    : tokenizer_(tokenizer), stop_(std::move(stop)) {
  stop_.erase(std::remove(stop_.begin(), stop_.end(), std::string()), stop_.end());
  for (const std::string& s : stop_) holdback_ = std::max(holdback_, s.size() - 1);
}

bool IncrementalDetokenizer::add_token(int32_t token) {
  if (stopped_) return true;
  // NOTES: a model's vocab may be padded past its tokenizer's (Qwen3: 151936 rows, 151669 tokens;
  // dummy-weight serving with a smaller tokenizer); a sampled id the tokenizer lacks has no text (as
  // in HF / vLLM). The engine already checked it is < the model's vocab_size; throwing here would
  // end the engine's loop thread.
  if (token >= tokenizer_.vocab_size()) return false;
  const int32_t one[1] = {token};
  text_ += tokenizer_.decode_bytes(one, /*skip_special=*/true);
  if (stop_.empty()) return false;
  // A new match must end in the new bytes, so it starts at most (longest stop - 1) bytes earlier.
  const size_t from = searched_ > holdback_ ? searched_ - holdback_ : 0;
  size_t cut = std::string::npos;
  for (const std::string& s : stop_) cut = std::min(cut, text_.find(s, from));
  searched_ = text_.size();
  if (cut == std::string::npos) return false;
  text_.resize(cut);
  stopped_ = true;
  return true;
}

std::string IncrementalDetokenizer::take_new_text(bool finished) {
  size_t end = text_.size();
  if (!finished) {
    end = end > holdback_ ? end - holdback_ : 0;
    end = std::max(emitted_, complete_utf8_prefix(std::string_view(text_).substr(0, end)));
  }
  if (end <= emitted_) return {};
  std::string out = sanitize_utf8(std::string_view(text_).substr(emitted_, end - emitted_));
  emitted_ = end;
  return out;
}

}  // namespace megamoe::server
