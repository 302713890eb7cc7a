// Turns a sequence's generated tokens into text as they arrive: special tokens skipped, stop
// strings found across token boundaries, and text released only when it can no longer change (never
// half a UTF-8 character, never the first bytes of what may still become a stop string), so the
// concatenated stream equals the non-streamed text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/tokenizer.h"

namespace megamoe::server {

class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tokenizer, std::vector<std::string> stop);

  // Adds one generated token. Returns true when a stop string now appears (the text is cut before it).
  // An id at or past the tokenizer's vocab_size (model vocab padding) adds no text.
  bool add_token(int32_t token);
  // Text that became final since the last call. With `finished`, everything left (sanitized UTF-8).
  std::string take_new_text(bool finished);
  const std::string& text() const { return text_; }  // raw bytes so far (cut at a stop string)

 private:
  const Tokenizer& tokenizer_;
  std::vector<std::string> stop_;
  size_t holdback_ = 0;     // longest stop string - 1
  std::string text_;
  size_t emitted_ = 0;      // bytes of text_ already released
  size_t searched_ = 0;     // stop strings were searched in text_[0, searched_)
  bool stopped_ = false;
};

}  // namespace megamoe::server
