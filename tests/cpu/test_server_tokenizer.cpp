// The byte-level BPE tokenizer against Hugging Face `tokenizers` on the committed golden file
// (scripts/fixtures/make_tokenizer_golden.py), token for token, plus decode round trips.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "megamoe/error.h"
#include "server/detokenizer.h"
#include "server/tokenizer.h"

using megamoe::server::Tokenizer;

namespace {
const std::string kFixture = std::string(MEGAMOE_SOURCE_DIR) + "/tests/fixtures/tokenizer";
}

TEST(ServerTokenizer, MatchesHuggingFaceGoldenTokenForToken) {
  auto tokenizer = Tokenizer::from_file(kFixture);
  EXPECT_EQ(tokenizer->vocab_size(), 2048);
  std::ifstream in(kFixture + "/golden.jsonl");
  ASSERT_TRUE(in.good());
  std::string line;
  int checked = 0, with_special = 0, non_ascii = 0;
  while (std::getline(in, line)) {
    const auto row = nlohmann::json::parse(line);
    const std::string text = row["text"];
    const auto expected = row["ids"].get<std::vector<int32_t>>();
    const auto ids = tokenizer->encode(text);
    EXPECT_EQ(ids, expected) << "text: " << nlohmann::json(text).dump();
    EXPECT_EQ(tokenizer->decode(ids), row["decoded"].get<std::string>()) << nlohmann::json(text).dump();
    for (int32_t id : expected) with_special += tokenizer->is_special(id);
    non_ascii += std::any_of(text.begin(), text.end(), [](char c) { return uint8_t(c) >= 0x80; });
    ++checked;
  }
  EXPECT_GE(checked, 100);
  EXPECT_GT(with_special, 5);
  EXPECT_GT(non_ascii, 15);
}

TEST(ServerTokenizer, SpecialTokensAndSkipping) {
  auto tokenizer = Tokenizer::from_file(kFixture + "/tokenizer.json");
  const auto eos = tokenizer->token_to_id("<|endoftext|>");
  ASSERT_TRUE(eos.has_value());
  EXPECT_TRUE(tokenizer->is_special(*eos));
  const auto ids = tokenizer->encode("hi<|endoftext|>there");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *eos), 1);
  EXPECT_EQ(tokenizer->decode(ids), "hi<|endoftext|>there");
  EXPECT_EQ(tokenizer->decode(ids, /*skip_special=*/true), "hithere");
}

TEST(ServerTokenizer, RandomIdsDecodeAndPartialUtf8IsHeldBack) {
  auto tokenizer = Tokenizer::from_file(kFixture);
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<int32_t> ids(1 + rng() % 40);
    for (auto& id : ids) id = int32_t(rng() % 2045);
    const std::string bytes = tokenizer->decode_bytes(ids);
    const std::string text = tokenizer->decode(ids);
    // Re-encoding valid text and decoding it again gives the same text (BPE is a bijection on bytes).
    EXPECT_EQ(tokenizer->decode(tokenizer->encode(text)), text);
    const size_t complete = megamoe::server::complete_utf8_prefix(bytes);
    EXPECT_LE(complete, bytes.size());
    EXPECT_GE(complete + 3, bytes.size());
  }
  EXPECT_EQ(megamoe::server::complete_utf8_prefix("ab\xE4\xBD"), 2u);
  EXPECT_EQ(megamoe::server::complete_utf8_prefix("ab\xE4\xBD\xA0"), 5u);
  EXPECT_EQ(megamoe::server::sanitize_utf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
}

TEST(ServerTokenizer, RejectsBadInputWithTheField) {
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), megamoe::Error);
  try {
    Tokenizer::from_json_text(R"({"model": {"type": "Unigram", "vocab": []}})");
    FAIL() << "expected megamoe::Error";
  } catch (const megamoe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.type"), std::string::npos) << e.what();
  }
  try {
    Tokenizer::from_json_text(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
        "added_tokens": [{"id": 1, "content": "<x>", "lstrip": true}]})");
    FAIL() << "expected megamoe::Error";
  } catch (const megamoe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("lstrip"), std::string::npos) << e.what();
  }
  auto tokenizer = Tokenizer::from_file(kFixture);
  const std::vector<int32_t> bad{5, 99999};
  EXPECT_THROW(tokenizer->decode(bad), megamoe::Error);
}

// A model vocab padded past the tokenizer's (Qwen3: 151936 rows, 151669 tokens) can sample an id the
// tokenizer lacks: the detokenizer adds no text for it and keeps going; decode() still rejects it.
TEST(ServerTokenizer, DetokenizerGivesNoTextForIdsPastTheTokenizerVocab) {
  auto tokenizer = Tokenizer::from_file(kFixture);
  const std::vector<int32_t> known = tokenizer->encode("hello world");
  ASSERT_FALSE(known.empty());
  megamoe::server::IncrementalDetokenizer detokenizer(*tokenizer, {"zzz"});
  EXPECT_FALSE(detokenizer.add_token(tokenizer->vocab_size()));        // first padding id
  EXPECT_FALSE(detokenizer.add_token(151935));                         // last Qwen3 padding id
  for (int32_t id : known) EXPECT_FALSE(detokenizer.add_token(id));
  EXPECT_FALSE(detokenizer.add_token(tokenizer->vocab_size() + 7));
  EXPECT_EQ(detokenizer.take_new_text(/*finished=*/true), "hello world");
  const std::vector<int32_t> padded{tokenizer->vocab_size()};
  EXPECT_THROW(tokenizer->decode(padded), megamoe::Error);
}
