// Helpers shared by the engine tests (tests/cpu/test_engine_*.cpp).
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "megamoe/formats.h"

namespace megamoe::engine::testing {

inline std::string fixture(const std::string& name) {
  return std::string(MEGAMOE_SOURCE_DIR) + "/tests/fixtures/" + name;
}

struct RawSafetensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Writes a safetensors file (tensors back to back in the given order); `edit` may change the header
// JSON before it is written, to make corrupt files.
inline void write_safetensors(const std::string& path, const std::vector<RawSafetensor>& tensors,
                              const std::function<void(nlohmann::json&)>& edit = nullptr) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  if (edit) edit(header);
  const std::string text = header.dump();
  std::ofstream out(path, std::ios::binary);
  const uint64_t length = text.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((length >> (8 * i)) & 0xFF));  // little-endian
  out << text;
  for (const auto& t : tensors) out.write(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
}

struct Comparison {
  double rel_l2 = 0, max_abs = 0, ref_max = 0;
};
inline Comparison compare(const std::vector<float>& got, const std::vector<float>& want) {
  Comparison c;
  double diff_sq = 0, ref_sq = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    diff_sq += d * d;
    ref_sq += static_cast<double>(want[i]) * want[i];
    c.max_abs = std::max(c.max_abs, std::abs(d));
    c.ref_max = std::max(c.ref_max, std::abs(static_cast<double>(want[i])));
  }
  c.rel_l2 = std::sqrt(diff_sq / ref_sq);
  return c;
}

// Canonical matrices equal: codes and scales bit for bit; globals within `global_rel_tol` (an
// ulp for compressed-tensors NVFP4, which stores fp32(1/global)).
inline void expect_same_matrix(const formats::QuantizedMatrix& got, const formats::QuantizedMatrix& want,
                               double global_rel_tol = 0.0) {
  EXPECT_EQ(got.format, want.format);
  EXPECT_EQ(got.rows, want.rows);
  EXPECT_EQ(got.cols, want.cols);
  EXPECT_EQ(got.data, want.data);
  EXPECT_EQ(got.block_scales, want.block_scales);
  EXPECT_EQ(got.group_scales, want.group_scales);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(got.global_scales[i], want.global_scales[i], global_rel_tol * std::abs(want.global_scales[i]));
  }
}

// Greedy continuation of one golden prompt (golden.json "prompts" entry) vs transformers' greedy
// tokens, up to the first step whose golden top-1 margin is below `clear_margin` (after a near tie the
// continuations may diverge legitimately). Returns the number of tokens compared.
inline int expect_greedy_tokens_match(ModelRunner& runner, const nlohmann::json& prompt, double clear_margin,
                                      const std::string& what, const GenerateOptions& options = {}) {
  const auto ids = prompt.at("token_ids").get<std::vector<int32_t>>();
  const auto want = prompt.at("greedy_tokens").get<std::vector<int32_t>>();
  const auto margins = prompt.at("greedy_top1_margins").get<std::vector<double>>();
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = static_cast<int>(want.size());
  params.ignore_eos = true;
  const std::vector<int32_t> got = generate(runner, ids, params, options);
  EXPECT_EQ(got.size(), want.size()) << what;
  if (got.size() != want.size()) return 0;
  int compared = 0;
  for (size_t i = 0; i < want.size() && margins[i] >= clear_margin; ++i, ++compared)
    EXPECT_EQ(got[i], want[i]) << what << " token " << i << " (margin " << margins[i] << ")";
  return compared;
}

}  // namespace megamoe::engine::testing
