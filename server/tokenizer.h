// Byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json` (GPT-2 / Qwen / Llama-3 style):
// added tokens are split out first, the rest is NFC-normalized, split by the pre-tokenizer regex
// (PCRE2, UTF + UCP), mapped byte -> printable char (GPT-2 ByteLevel table) and merged by BPE ranks.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace megamoe::server {

class Tokenizer {
 public:
  // Reads `path` (a tokenizer.json, or a directory holding one). Throws megamoe::Error on anything
  // it does not support (it names the field), never silently tokenizes differently.
  static std::shared_ptr<const Tokenizer> from_file(const std::string& path);
  static std::shared_ptr<const Tokenizer> from_json_text(std::string_view json_text);
  ~Tokenizer();

  // Text -> ids. Added/special tokens in the text become their ids (like HF with
  // add_special_tokens=False: no BOS/EOS is inserted).
  std::vector<int32_t> encode(std::string_view text) const;
  // Ids -> raw bytes (may end inside a UTF-8 character when decoding a prefix of a reply).
  std::string decode_bytes(std::span<const int32_t> ids, bool skip_special = false) const;
  // Ids -> valid UTF-8 (invalid sequences become U+FFFD, like HF's decode).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  int vocab_size() const;                        // max id + 1 over vocab and added tokens
  std::optional<int32_t> token_to_id(std::string_view token) const;  // vocab entry or added token
  bool is_special(int32_t id) const;

 struct Impl;  // opaque; public only so the loader's helpers can fill it

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Length of the longest prefix of `bytes` that ends on a UTF-8 character boundary (an incomplete
// trailing character is held back; invalid bytes count as complete so they never stall a stream).
size_t complete_utf8_prefix(std::string_view bytes);
// Replaces invalid UTF-8 with U+FFFD.
std::string sanitize_utf8(std::string_view bytes);

}  // namespace megamoe::server
