#include "server/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <queue>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "megamoe/error.h"

namespace megamoe::server {
namespace {

using json = nlohmann::json;

// GPT-2's ByteLevel table: printable bytes map to themselves, the other 68 bytes to U+0100.. in order,
// so every token is a printable string and no byte is lost.
struct ByteLevelTable {
  std::string byte_to_utf8[256];
  std::unordered_map<uint32_t, uint8_t> codepoint_to_byte;
  ByteLevelTable() {
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + next++);
      codepoint_to_byte[cp] = uint8_t(b);
      std::string& s = byte_to_utf8[b];
      if (cp < 0x80) {
        s.push_back(char(cp));
      } else {
        s.push_back(char(0xC0 | (cp >> 6)));
        s.push_back(char(0x80 | (cp & 0x3F)));
      }
    }
  }
};
const ByteLevelTable& byte_level() {
  static const ByteLevelTable table;
  return table;
}

// Decodes one UTF-8 character at s[i]; returns its length (1 for an invalid byte, cp = 0xFFFD).
size_t utf8_next(std::string_view s, size_t i, uint32_t& cp) {
  const auto c = uint8_t(s[i]);
  size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || i + len > s.size()) {
    cp = 0xFFFD;
    return 1;
  }
  cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < len; ++k) {
    const auto cc = uint8_t(s[i + k]);
    if ((cc & 0xC0) != 0x80) {
      cp = 0xFFFD;
      return 1;
    }
    cp = (cp << 6) | (cc & 0x3F);
  }
  // Overlong forms and surrogates are invalid.
  if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
      (cp >= 0xD800 && cp <= 0xDFFF)) {
    cp = 0xFFFD;
    return 1;
  }
  return len;
}

std::string nfc(std::string_view text) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return uint8_t(c) < 0x80; })) return std::string(text);
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = icu::Normalizer2::getNFCInstance(status);
  MEGAMOE_CHECK(U_SUCCESS(status), "ICU NFC normalizer unavailable: ", u_errorName(status));
  icu::UnicodeString normalized = normalizer->normalize(
      icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), int32_t(text.size()))), status);
  MEGAMOE_CHECK(U_SUCCESS(status), "NFC normalization failed: ", u_errorName(status));
  std::string out;
  normalized.toUTF8String(out);
  return out;
}

// A compiled PCRE2 pattern; match data is per call so one Regex serves many threads.
class Regex {
 public:
  explicit Regex(const std::string& pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                          &error, &offset, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      MEGAMOE_FAIL("pre_tokenizer regex does not compile at offset ", offset, ": ",
                   reinterpret_cast<const char*>(message));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // best effort: falls back to the interpreter
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the "Isolated" split of `text` to `pieces`: every match and every gap between matches.
  void split_isolated(std::string_view text, std::vector<std::string>& pieces) const {
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t start = 0, gap_start = 0;
    while (start < text.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start,
                                 PCRE2_NO_UTF_CHECK, match, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(match);
        MEGAMOE_FAIL("pre_tokenizer regex match failed with PCRE2 code ", rc);
      }
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
      const size_t begin = ovector[0], end = ovector[1];
      if (end == begin) {  // empty match: step one character forward
        uint32_t cp;
        start = begin + utf8_next(text, begin, cp);
        continue;
      }
      if (begin > gap_start) pieces.emplace_back(text.substr(gap_start, begin - gap_start));
      pieces.emplace_back(text.substr(begin, end - begin));
      start = gap_start = end;
    }
    if (gap_start < text.size()) pieces.emplace_back(text.substr(gap_start));
    pcre2_match_data_free(match);
  }

 private:
  pcre2_code* code_ = nullptr;
};

// GPT-2's own pattern, used by a ByteLevel pre-tokenizer with use_regex = true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

struct Tokenizer::Impl {
  std::unordered_map<std::string, int32_t> vocab;      // byte-level string -> id
  std::vector<std::string> id_to_token;                // id -> byte-level string (or added content)
  std::unordered_map<std::string, int> merge_rank;     // "left\x01right" -> rank
  struct Added {
    std::string content;
    int32_t id;
    bool special;
  };
  std::vector<Added> added;  // longest content first, for leftmost-longest matching
  std::vector<bool> id_is_added, id_is_special;
  bool normalize_nfc = false;
  std::vector<std::unique_ptr<Regex>> splits;  // applied in order, each "Isolated"
  bool add_prefix_space = false;

  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>> piece_cache;

  void bpe(const std::string& piece, std::vector<int32_t>& out) const {
    {
      std::lock_guard lock(cache_mutex);
      auto hit = piece_cache.find(piece);
      if (hit != piece_cache.end()) {
        out.insert(out.end(), hit->second.begin(), hit->second.end());
        return;
      }
    }
    // Byte-level symbols, one per byte of the piece, in a linked list.
    const size_t n = piece.size();
    std::vector<std::string> symbols(n);
    std::vector<int> prev(n), next(n), version(n, 0);
    for (size_t i = 0; i < n; ++i) {
      symbols[i] = byte_level().byte_to_utf8[uint8_t(piece[i])];
      prev[i] = int(i) - 1;
      next[i] = i + 1 < n ? int(i + 1) : -1;
    }
    // NOTES: merge the lowest-ranked adjacent pair, leftmost on ties, until none applies (the order
    // HF's BPE applies merges in, so the result is the same token for token). A heap of candidate
    // pairs keeps this O(n log n) on long pieces (whitespace runs); entries whose symbols changed
    // since they were pushed are stale and skipped.
    struct Candidate {
      int rank, left, right, left_version, right_version;
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
    std::string key;
    auto push = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      key.assign(symbols[size_t(left)]).push_back('\x01');
      key.append(symbols[size_t(right)]);
      auto found = merge_rank.find(key);
      if (found != merge_rank.end())
        heap.push({found->second, left, right, version[size_t(left)], version[size_t(right)]});
    };
    for (size_t i = 0; i + 1 < n; ++i) push(int(i), int(i + 1));
    std::vector<bool> alive(n, true);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      if (!alive[size_t(c.left)] || !alive[size_t(c.right)] || next[size_t(c.left)] != c.right ||
          version[size_t(c.left)] != c.left_version || version[size_t(c.right)] != c.right_version)
        continue;
      symbols[size_t(c.left)] += symbols[size_t(c.right)];
      ++version[size_t(c.left)];
      alive[size_t(c.right)] = false;
      next[size_t(c.left)] = next[size_t(c.right)];
      if (next[size_t(c.left)] >= 0) prev[size_t(next[size_t(c.left)])] = c.left;
      push(prev[size_t(c.left)], c.left);
      push(c.left, next[size_t(c.left)]);
    }
    std::vector<std::string> merged;
    for (int i = n ? 0 : -1; i >= 0; i = next[size_t(i)]) merged.push_back(std::move(symbols[size_t(i)]));
    symbols = std::move(merged);
    std::vector<int32_t> ids;
    ids.reserve(symbols.size());
    for (const std::string& symbol : symbols) {
      auto found = vocab.find(symbol);
      MEGAMOE_CHECK(found != vocab.end(), "BPE produced symbol '", symbol, "' missing from model.vocab");
      ids.push_back(found->second);
    }
    out.insert(out.end(), ids.begin(), ids.end());
    if (piece.size() > 256) return;  // long runs are rare and would bloat the cache
    std::lock_guard lock(cache_mutex);
    if (piece_cache.size() > 200000) piece_cache.clear();  // bounded memory under random prompts
    piece_cache.emplace(piece, std::move(ids));
  }

  void encode_plain(std::string_view text, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    std::string normalized = normalize_nfc ? nfc(text) : std::string(text);
    if (add_prefix_space && !normalized.empty() && normalized[0] != ' ') normalized = " " + normalized;
    std::vector<std::string> pieces{normalized};
    for (const auto& regex : splits) {
      std::vector<std::string> next;
      for (const std::string& p : pieces) regex->split_isolated(p, next);
      pieces = std::move(next);
    }
    for (const std::string& p : pieces) bpe(p, out);
  }
};

namespace {

void parse_pre_tokenizer(const json& node, Tokenizer::Impl& impl);

void parse_one_pre_tokenizer(const json& node, Tokenizer::Impl& impl) {
  const std::string type = node.at("type").get<std::string>();
  if (type == "Sequence") {
    for (const json& child : node.at("pretokenizers")) parse_pre_tokenizer(child, impl);
  } else if (type == "Split") {
    const json& pattern = node.at("pattern");
    MEGAMOE_CHECK(pattern.contains("Regex"), "pre_tokenizer.Split.pattern: only {\"Regex\": ...} is supported");
    const std::string behavior = node.value("behavior", "Isolated");
    MEGAMOE_CHECK(behavior == "Isolated", "pre_tokenizer.Split.behavior '", behavior, "' unsupported (Isolated only)");
    MEGAMOE_CHECK(!node.value("invert", false), "pre_tokenizer.Split.invert = true is unsupported");
    impl.splits.push_back(std::make_unique<Regex>(pattern.at("Regex").get<std::string>()));
  } else if (type == "ByteLevel") {
    // NOTES: the byte mapping itself happens inside bpe(); here only the options matter.
    impl.add_prefix_space = node.value("add_prefix_space", false);
    if (node.value("use_regex", true)) impl.splits.push_back(std::make_unique<Regex>(kGpt2Pattern));
  } else {
    MEGAMOE_FAIL("pre_tokenizer type '", type, "' is unsupported (Sequence, Split, ByteLevel)");
  }
}

void parse_pre_tokenizer(const json& node, Tokenizer::Impl& impl) {
  if (!node.is_null()) parse_one_pre_tokenizer(node, impl);
}

void parse_normalizer(const json& node, Tokenizer::Impl& impl) {
  if (node.is_null()) return;
  const std::string type = node.at("type").get<std::string>();
  if (type == "NFC") {
    impl.normalize_nfc = true;
  } else if (type == "Sequence") {
    for (const json& child : node.at("normalizers")) parse_normalizer(child, impl);
  } else {
    MEGAMOE_FAIL("normalizer type '", type, "' is unsupported (NFC or none)");
  }
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::shared_ptr<const Tokenizer> Tokenizer::from_file(const std::string& path) {
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(file)) file /= "tokenizer.json";
  std::ifstream in(file, std::ios::binary);
  MEGAMOE_CHECK(in.good(), "tokenizer file '", file.string(), "' cannot be opened");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return from_json_text(buffer.str());
}

std::shared_ptr<const Tokenizer> Tokenizer::from_json_text(std::string_view json_text) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    MEGAMOE_FAIL("tokenizer.json is not valid JSON: ", e.what());
  }
  auto impl = std::make_unique<Impl>();
  try {
    const json& model = root.at("model");
    const std::string type = model.value("type", "BPE");
    MEGAMOE_CHECK(type == "BPE", "tokenizer model.type '", type, "' is unsupported (BPE only)");
    MEGAMOE_CHECK(!model.value("byte_fallback", false), "tokenizer model.byte_fallback = true is unsupported");
    int32_t max_id = -1;
    for (const auto& [token, id] : model.at("vocab").items()) {
      impl->vocab.emplace(token, id.get<int32_t>());
      max_id = std::max(max_id, id.get<int32_t>());
    }
    int rank = 0;
    for (const json& merge : model.at("merges")) {
      std::string left, right;
      if (merge.is_string()) {  // "left right" (older files)
        const std::string s = merge.get<std::string>();
        const size_t space = s.find(' ');
        MEGAMOE_CHECK(space != std::string::npos, "model.merges[", rank, "] '", s, "' has no space");
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else {  // ["left", "right"] (tokenizers >= 0.20)
        MEGAMOE_CHECK(merge.is_array() && merge.size() == 2, "model.merges[", rank, "] must be a pair");
        left = merge[0].get<std::string>();
        right = merge[1].get<std::string>();
      }
      impl->merge_rank.emplace(left + '\x01' + right, rank++);
    }
    if (root.contains("added_tokens")) {
      for (const json& token : root.at("added_tokens")) {
        Impl::Added added{token.at("content").get<std::string>(), token.at("id").get<int32_t>(),
                          token.value("special", false)};
        MEGAMOE_CHECK(!added.content.empty(), "added_tokens entry with id ", added.id, " has empty content");
        // NOTES: normalized = true tokens are matched on the raw text too; that differs from HF only
        // for text that NFC changes right at the token. Whitespace-absorbing flags are not supported.
        for (const char* flag : {"lstrip", "rstrip", "single_word"})
          MEGAMOE_CHECK(!token.value(flag, false), "added_tokens entry '", added.content, "': ", flag,
                        " = true is unsupported");
        max_id = std::max(max_id, added.id);
        impl->added.push_back(std::move(added));
      }
    }
    std::stable_sort(impl->added.begin(), impl->added.end(),
                     [](const Impl::Added& a, const Impl::Added& b) { return a.content.size() > b.content.size(); });
    impl->id_to_token.assign(size_t(max_id + 1), "");
    impl->id_is_added.assign(size_t(max_id + 1), false);
    impl->id_is_special.assign(size_t(max_id + 1), false);
    for (const auto& [token, id] : impl->vocab) impl->id_to_token[size_t(id)] = token;
    for (const Impl::Added& a : impl->added) {
      impl->id_to_token[size_t(a.id)] = a.content;
      impl->id_is_added[size_t(a.id)] = true;
      impl->id_is_special[size_t(a.id)] = a.special;
    }
    parse_normalizer(root.value("normalizer", json()), *impl);
    parse_pre_tokenizer(root.value("pre_tokenizer", json()), *impl);
    const json decoder = root.value("decoder", json());
    MEGAMOE_CHECK(decoder.is_null() || decoder.value("type", "") == "ByteLevel",
                  "tokenizer decoder type '", decoder.value("type", ""), "' is unsupported (ByteLevel only)");
  } catch (const json::exception& e) {
    MEGAMOE_FAIL("tokenizer.json has an unexpected shape: ", e.what());
  }
  return std::shared_ptr<const Tokenizer>(new Tokenizer(std::move(impl)));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  // NOTES: added tokens are matched on the raw text, leftmost first and longest at a position (HF
  // matches them before normalization for normalized = false, which special tokens are).
  size_t plain_start = 0, i = 0;
  while (i < text.size()) {
    const Impl::Added* hit = nullptr;
    if (!impl_->added.empty()) {
      for (const Impl::Added& a : impl_->added) {
        if (text.compare(i, a.content.size(), a.content) == 0) {
          hit = &a;
          break;
        }
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    impl_->encode_plain(text.substr(plain_start, i - plain_start), out);
    out.push_back(hit->id);
    i += hit->content.size();
    plain_start = i;
  }
  impl_->encode_plain(text.substr(plain_start), out);
  return out;
}

std::string Tokenizer::decode_bytes(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  const auto& table = byte_level().codepoint_to_byte;
  for (int32_t id : ids) {
    MEGAMOE_CHECK(id >= 0 && size_t(id) < impl_->id_to_token.size(), "token id ", id, " must be in [0, ",
                  impl_->id_to_token.size(), ")");
    const std::string& token = impl_->id_to_token[size_t(id)];
    if (impl_->id_is_added[size_t(id)]) {
      if (!(skip_special && impl_->id_is_special[size_t(id)])) out += token;
      continue;
    }
    for (size_t k = 0; k < token.size();) {
      uint32_t cp;
      k += utf8_next(token, k, cp);
      auto found = table.find(cp);
      MEGAMOE_CHECK(found != table.end(), "token id ", id, " holds a character outside the ByteLevel alphabet");
      out.push_back(char(found->second));
    }
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  return sanitize_utf8(decode_bytes(ids, skip_special));
}

int Tokenizer::vocab_size() const { return int(impl_->id_to_token.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  for (const Impl::Added& a : impl_->added)
    if (a.content == token) return a.id;
  auto found = impl_->vocab.find(std::string(token));
  if (found == impl_->vocab.end()) return std::nullopt;
  return found->second;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->id_is_special.size() && impl_->id_is_special[size_t(id)];
}

size_t complete_utf8_prefix(std::string_view bytes) {
  // Look back at most 3 bytes for the start of a character that is not yet complete.
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = uint8_t(bytes[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead byte
    const size_t need = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

std::string sanitize_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    uint32_t cp;
    const size_t len = utf8_next(bytes, i, cp);
    if (cp == 0xFFFD && !(len == 3 && bytes.compare(i, 3, "\xEF\xBF\xBD") == 0)) {
      out += "\xEF\xBF\xBD";
    } else {
      out.append(bytes.substr(i, len));
    }
    i += len;
  }
  return out;
}

}  // namespace megamoe::server
