// safetensors validation and checkpoint errors: truncated / corrupt files, wrong shapes, missing
// tensors and unknown dtypes give a megamoe::Error naming the tensor and the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/safetensors.h"
#include "cpu/engine_test_util.h"
#include "megamoe/error.h"
#include "megamoe/formats.h"

using namespace megamoe;
using namespace megamoe::engine;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using megamoe::engine::testing::fixture;

using megamoe::engine::testing::write_safetensors;
using RawTensor = megamoe::engine::testing::RawSafetensor;

std::vector<RawTensor> read_all(const std::string& path) {
  SafetensorsFile file(path);
  std::vector<RawTensor> out;
  for (const auto& [name, record] : file.tensors()) {
    out.push_back({name, record.dtype_name, record.shape, std::vector<uint8_t>(record.data, record.data + record.bytes)});
  }
  return out;
}

// A scratch copy of a fixture, removed at the end of the test.
class ScratchModel {
 public:
  explicit ScratchModel(const std::string& name) {
    dir_ = fs::temp_directory_path() / ("megamoe_engine_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::copy(fixture(name), dir_);
  }
  ~ScratchModel() { fs::remove_all(dir_); }
  std::string path(const std::string& file = "") const { return file.empty() ? dir_.string() : (dir_ / file).string(); }

 private:
  fs::path dir_;
};

std::string load_error(const std::string& model_dir) {
  RunnerOptions options;
  options.load.progress = false;
  try {
    make_cpu_model_runner(model_dir, options);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_CONTAINS(text, needle) EXPECT_NE((text).find(needle), std::string::npos) << (text)

TEST(EngineCheckpoint, ReadsBf16F16F32Exactly) {
  ScratchModel scratch("tiny-mixtral");
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> values(6 * 5);
  for (float& v : values) v = formats::round_to_bf16(normal(rng));  // exactly representable in all three
  RawTensor bf16{"a", "BF16", {6, 5}, {}}, f16{"b", "F16", {6, 5}, {}}, f32{"c", "F32", {30}, {}};
  for (float v : values) {
    const uint16_t b = formats::f32_to_bf16(v), h = formats::f32_to_f16(v);
    bf16.bytes.insert(bf16.bytes.end(), {static_cast<uint8_t>(b), static_cast<uint8_t>(b >> 8)});
    f16.bytes.insert(f16.bytes.end(), {static_cast<uint8_t>(h), static_cast<uint8_t>(h >> 8)});
    uint8_t raw[4];
    std::memcpy(raw, &v, 4);
    f32.bytes.insert(f32.bytes.end(), raw, raw + 4);
  }
  fs::remove(scratch.path("model.safetensors"));
  write_safetensors(scratch.path("model.safetensors"), {bf16, f16, f32});
  const Checkpoint checkpoint(scratch.path());
  EXPECT_EQ(checkpoint.read_f32("a", {6, 5}), values);
  const std::vector<float> from_f16 = checkpoint.read_f32("b", {6, 5});
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(from_f16[i], formats::f16_to_f32(formats::f32_to_f16(values[i]))) << i;
  }
  EXPECT_EQ(checkpoint.read_f32("c", {30}), values);
  try {
    checkpoint.read_f32("a", {5, 6});
    ADD_FAILURE() << "expected a shape error";
  } catch (const Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "tensor 'a'");
    EXPECT_CONTAINS(std::string(e.what()), "[6, 5]");
    EXPECT_CONTAINS(std::string(e.what()), "[5, 6]");
  }
}

TEST(EngineCheckpoint, TruncatedFileNamesTensorAndFile) {
  ScratchModel scratch("tiny-mixtral");
  const std::string file = scratch.path("model.safetensors");
  fs::resize_file(file, fs::file_size(file) * 6 / 10);
  const std::string error = load_error(scratch.path());
  std::printf("truncated: %s\n", error.c_str());
  EXPECT_CONTAINS(error, "model.safetensors");
  EXPECT_CONTAINS(error, "tensor '");
  EXPECT_CONTAINS(error, "truncated");
  fs::resize_file(file, 5);
  EXPECT_CONTAINS(load_error(scratch.path()), "truncated");
}

TEST(EngineCheckpoint, CorruptHeadersAreErrors) {
  ScratchModel scratch("tiny-mixtral");
  const std::string file = scratch.path("model.safetensors");
  const std::vector<RawTensor> tensors = read_all(fixture("tiny-mixtral") + "/model.safetensors");
  const std::string victim = "model.layers.0.self_attn.k_proj.weight";
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {"unknown dtype", [&](json& h) { h[victim]["dtype"] = "Q7"; }, {victim, "Q7", "model.safetensors"}},
      {"shape vs bytes", [&](json& h) { h[victim]["shape"] = {32, 65}; }, {victim, "[32, 65]", "bytes"}},
      {"offsets past end", [&](json& h) { h[victim]["data_offsets"][1] = 1ull << 40; }, {victim, "data_offsets"}},
      {"reversed offsets", [&](json& h) {
         const auto begin = h[victim]["data_offsets"][0];
         h[victim]["data_offsets"][0] = h[victim]["data_offsets"][1];
         h[victim]["data_offsets"][1] = begin;
       }, {victim, "reversed"}},
      {"overlap", [&](json& h) {
         // Point another tensor of the same size at the victim's bytes.
         for (auto& [name, entry] : h.items()) {
           if (name != victim && entry["shape"] == h[victim]["shape"] && entry["dtype"] == h[victim]["dtype"]) {
             entry["data_offsets"] = h[victim]["data_offsets"];
             break;
           }
         }
       }, {"overlaps", victim}},
      {"missing data_offsets", [&](json& h) { h[victim].erase("data_offsets"); }, {victim, "data_offsets"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    write_safetensors(file, tensors, c.edit);
    const std::string error = load_error(scratch.path());
    for (const auto& needle : c.needles) EXPECT_CONTAINS(error, needle);
  }
  // Not JSON at all, and a header length beyond the file.
  {
    std::ofstream out(file, std::ios::binary);
    const uint64_t length = 9;
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << "{\"a\": [1,";
  }
  EXPECT_CONTAINS(load_error(scratch.path()), "not valid JSON");
  {
    std::ofstream out(file, std::ios::binary);
    const uint64_t length = 1ull << 20;
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << "{}";
  }
  EXPECT_CONTAINS(load_error(scratch.path()), "header length");
}

TEST(EngineCheckpoint, WrongShapeAndMissingTensorNameTheTensor) {
  ScratchModel scratch("tiny-mixtral");
  const std::string file = scratch.path("model.safetensors");
  std::vector<RawTensor> tensors = read_all(fixture("tiny-mixtral") + "/model.safetensors");
  // Same bytes, transposed shape: self-consistent file, inconsistent with the config.
  const std::string wrong = "model.layers.1.block_sparse_moe.experts.3.w2.weight";
  for (auto& t : tensors) {
    if (t.name == wrong) t.shape = {t.shape[1], t.shape[0]};
  }
  write_safetensors(file, tensors);
  std::string error = load_error(scratch.path());
  std::printf("wrong shape: %s\n", error.c_str());
  EXPECT_CONTAINS(error, wrong);
  EXPECT_CONTAINS(error, "[48, 64]");
  EXPECT_CONTAINS(error, "config needs [64, 48]");

  tensors = read_all(fixture("tiny-mixtral") + "/model.safetensors");
  const std::string missing = "model.layers.1.post_attention_layernorm.weight";
  std::erase_if(tensors, [&](const RawTensor& t) { return t.name == missing; });
  write_safetensors(file, tensors);
  error = load_error(scratch.path());
  EXPECT_CONTAINS(error, missing);
  EXPECT_CONTAINS(error, "missing");
}

TEST(EngineCheckpoint, ShardedIndexIsChecked) {
  ScratchModel scratch("tiny-qwen3-moe");
  const json index = read_json_file(scratch.path("model.safetensors.index.json"));
  // An index entry pointing at the wrong shard.
  json bad = index;
  const std::string moved = "model.norm.weight";
  const std::string shard = bad["weight_map"][moved];
  bad["weight_map"][moved] = shard == "model-00001-of-00002.safetensors" ? "model-00002-of-00002.safetensors"
                                                                         : "model-00001-of-00002.safetensors";
  std::ofstream(scratch.path("model.safetensors.index.json")) << bad.dump();
  std::string error = load_error(scratch.path());
  EXPECT_CONTAINS(error, moved);
  // A missing shard.
  std::ofstream(scratch.path("model.safetensors.index.json")) << index.dump();
  fs::remove(scratch.path("model-00002-of-00002.safetensors"));
  error = load_error(scratch.path());
  EXPECT_CONTAINS(error, "model-00002-of-00002.safetensors");
  // The fused expert tensor with the wrong expert count.
  fs::copy_file(fixture("tiny-qwen3-moe") + "/model-00002-of-00002.safetensors",
                scratch.path("model-00002-of-00002.safetensors"));
  for (const char* shard_name : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    std::vector<RawTensor> tensors = read_all(fixture("tiny-qwen3-moe") + "/" + shard_name);
    for (auto& t : tensors) {
      if (t.name == "model.layers.2.mlp.experts.down_proj") t.shape = {4, 2 * t.shape[1], t.shape[2]};
    }
    write_safetensors(scratch.path(shard_name), tensors);
  }
  error = load_error(scratch.path());
  EXPECT_CONTAINS(error, "model.layers.2.mlp.experts.down_proj");
  EXPECT_CONTAINS(error, "[8, 64, 32]");
}

TEST(EngineCheckpoint, MissingModelDirectory) {
  EXPECT_CONTAINS(load_error("/nonexistent/model"), "/nonexistent/model");
}

}  // namespace
