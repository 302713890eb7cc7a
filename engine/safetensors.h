// Memory-mapped safetensors checkpoints: one file or shards listed in model.safetensors.index.json.
//
// NOTES: every header is validated before any tensor is touched: 8-byte little-endian header length
// inside the file, JSON object, known dtype, shape product * element size == byte span, spans inside
// the data section and pairwise disjoint. A corrupt or truncated file is a megamoe::Error naming the
// tensor and the file, never a read outside the mapping.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "megamoe/types.h"

namespace megamoe::engine {

struct TensorRecord {
  std::string name;
  std::string file;              // path of the file holding it
  DType dtype = DType::kF32;
  std::string dtype_name;        // as written in the header ("BF16", ...)
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr; // inside the mapping
  uint64_t bytes = 0;

  int64_t numel() const;
  std::string shape_string() const;
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // maps and validates
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorRecord>& tensors() const { return tensors_; }

 private:
  std::string path_;
  void* mapping_ = nullptr;
  uint64_t mapped_bytes_ = 0;
  std::map<std::string, TensorRecord> tensors_;
};

// All tensors of a checkpoint directory (model.safetensors, or the shards of
// model.safetensors.index.json, or every *.safetensors file when neither exists).
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& model_dir);

  bool has(const std::string& name) const { return records_.count(name) != 0; }
  // Throws "checkpoint <dir>: tensor '<name>' is missing".
  const TensorRecord& get(const std::string& name) const;
  // Checks the shape ("tensor 'x' in file f: shape [a, b] but the config needs [c, d]") and
  // converts BF16 / F16 / F32 to fp32.
  std::vector<float> read_f32(const std::string& name, const std::vector<int64_t>& expected_shape) const;
  const std::string& dir() const { return dir_; }
  std::vector<std::string> names() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorRecord*> records_;
};

// Element conversion of a record's bytes (BF16 / F16 / F32 only) into fp32.
void convert_to_f32(const TensorRecord& record, int64_t first_element, int64_t count, float* out);
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace megamoe::engine
