#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "engine/config.h"
#include "megamoe/error.h"
#include "megamoe/formats.h"

namespace megamoe::engine {
namespace {

// Header sizes above this are rejected before allocation (real headers are a few MB at most).
constexpr uint64_t kMaxHeaderBytes = 256ull << 20;

bool parse_dtype(const std::string& name, DType* dtype) {
  static const std::pair<const char*, DType> table[] = {
      {"F64", DType::kF64},      {"F32", DType::kF32},         {"BF16", DType::kBF16},
      {"F16", DType::kF16},      {"F8_E4M3", DType::kFP8E4M3}, {"F8_E5M2", DType::kFP8E5M2},
      {"F8_E8M0", DType::kUE8M0}, {"I32", DType::kI32},         {"I64", DType::kI64},
      {"U8", DType::kU8},        {"F4", DType::kFP4E2M1x2}};
  for (const auto& [text, value] : table) {
    if (name == text) {
      *dtype = value;
      return true;
    }
  }
  return false;
}

}  // namespace

int64_t TensorRecord::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

std::string TensorRecord::shape_string() const { return engine::shape_string(shape); }

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  MEGAMOE_CHECK(fd >= 0, "cannot open safetensors file ", path, ": ", std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    ::close(fd);
    MEGAMOE_FAIL("cannot stat ", path, ": ", std::strerror(errno));
  }
  mapped_bytes_ = static_cast<uint64_t>(info.st_size);
  if (mapped_bytes_ < 8) {
    ::close(fd);
    MEGAMOE_FAIL("safetensors file ", path, " is truncated: ", mapped_bytes_, " bytes, less than the 8-byte header length");
  }
  mapping_ = ::mmap(nullptr, mapped_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  MEGAMOE_CHECK(mapping_ != MAP_FAILED, "cannot mmap ", path, ": ", std::strerror(errno));
  try {
    const auto* bytes = static_cast<const uint8_t*>(mapping_);
    uint64_t header_bytes = 0;
    for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | bytes[i];
    MEGAMOE_CHECK(header_bytes <= kMaxHeaderBytes && header_bytes <= mapped_bytes_ - 8, "safetensors file ", path,
                  ": header length ", header_bytes, " exceeds the file (", mapped_bytes_,
                  " bytes): truncated or not a safetensors file");
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_bytes);
    } catch (const nlohmann::json::exception& e) {
      MEGAMOE_FAIL("safetensors file ", path, ": header is not valid JSON: ", e.what());
    }
    MEGAMOE_CHECK(header.is_object(), "safetensors file ", path, ": header must be a JSON object");
    const uint8_t* data_section = bytes + 8 + header_bytes;
    const uint64_t data_bytes = mapped_bytes_ - 8 - header_bytes;
    std::vector<std::pair<uint64_t, uint64_t>> spans;  // [begin, end) for the overlap check
    std::vector<std::string> span_names;
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") continue;
      const std::string where = "tensor '" + name + "' in " + path;
      MEGAMOE_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                        entry.contains("data_offsets"),
                    where, ": header entry needs dtype, shape and data_offsets");
      TensorRecord record;
      record.name = name;
      record.file = path;
      MEGAMOE_CHECK(entry.at("dtype").is_string(), where, ": dtype must be a string");
      record.dtype_name = entry.at("dtype").get<std::string>();
      MEGAMOE_CHECK(parse_dtype(record.dtype_name, &record.dtype), where, ": dtype '", record.dtype_name,
                    "' is not supported (F64, F32, BF16, F16, F8_E4M3, F8_E5M2, F8_E8M0, I32, I64, U8)");
      const auto& shape = entry.at("shape");
      MEGAMOE_CHECK(shape.is_array() && shape.size() <= 8, where, ": shape must be a list of at most 8 sizes");
      uint64_t numel = 1;
      for (const auto& dim : shape) {
        MEGAMOE_CHECK(dim.is_number_unsigned() && dim.get<uint64_t>() < (1ull << 40), where, ": shape ",
                      shape.dump(), " has an invalid size");
        record.shape.push_back(dim.get<int64_t>());
        numel *= dim.get<uint64_t>();
        MEGAMOE_CHECK(numel < (1ull << 48), where, ": shape ", shape.dump(), " is too large");
      }
      const auto& offsets = entry.at("data_offsets");
      MEGAMOE_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                        offsets[1].is_number_unsigned(),
                    where, ": data_offsets must be [begin, end]");
      const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
      MEGAMOE_CHECK(begin <= end, where, ": data_offsets [", begin, ", ", end, "] are reversed");
      MEGAMOE_CHECK(end <= data_bytes, where, ": data_offsets [", begin, ", ", end, "] end past the data section (",
                    data_bytes, " bytes): the file is truncated or corrupt");
      const uint64_t element_bytes = record.dtype == DType::kFP4E2M1x2 ? 0 : dtype_bytes(record.dtype);
      const uint64_t expected = record.dtype == DType::kFP4E2M1x2 ? (numel + 1) / 2 : numel * element_bytes;
      MEGAMOE_CHECK(end - begin == expected, where, ": shape ", record.shape_string(), " of ", record.dtype_name,
                    " needs ", expected, " bytes but data_offsets span ", end - begin);
      record.data = data_section + begin;
      record.bytes = end - begin;
      if (end > begin) {
        spans.emplace_back(begin, end);
        span_names.push_back(name);
      }
      tensors_.emplace(name, std::move(record));
    }
    std::vector<size_t> order(spans.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return spans[a] < spans[b]; });
    for (size_t i = 1; i < order.size(); ++i) {
      const auto& prev = spans[order[i - 1]];
      const auto& cur = spans[order[i]];
      MEGAMOE_CHECK(cur.first >= prev.second, "safetensors file ", path, ": tensor '", span_names[order[i]],
                    "' [", cur.first, ", ", cur.second, ") overlaps tensor '", span_names[order[i - 1]], "' [",
                    prev.first, ", ", prev.second, ")");
    }
  } catch (...) {
    ::munmap(mapping_, mapped_bytes_);
    mapping_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapped_bytes_);
}

Checkpoint::Checkpoint(const std::string& model_dir) : dir_(model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  const fs::path index_path = dir / "model.safetensors.index.json";
  std::map<std::string, std::string> expected_file;  // tensor -> shard (from the index)
  std::vector<std::string> files;
  if (fs::exists(index_path)) {
    const nlohmann::json index = read_json_file(index_path.string());
    MEGAMOE_CHECK(index.is_object() && index.contains("weight_map") && index.at("weight_map").is_object(),
                  index_path.string(), ": needs a 'weight_map' object");
    std::set<std::string> shards;
    for (const auto& [name, shard] : index.at("weight_map").items()) {
      MEGAMOE_CHECK(shard.is_string(), index_path.string(), ": weight_map['", name, "'] must be a file name");
      const std::string file = shard.get<std::string>();
      MEGAMOE_CHECK(file.find('/') == std::string::npos && file.find("..") == std::string::npos,
                    index_path.string(), ": weight_map['", name, "'] = '", file, "' must be a plain file name");
      expected_file[name] = (dir / file).string();
      shards.insert(file);
    }
    for (const auto& shard : shards) files.push_back((dir / shard).string());
  } else if (fs::exists(dir / "model.safetensors")) {
    files.push_back((dir / "model.safetensors").string());
  } else {
    MEGAMOE_CHECK(fs::is_directory(dir), "model directory ", model_dir, " does not exist");
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.path().extension() == ".safetensors") files.push_back(entry.path().string());
    }
    std::sort(files.begin(), files.end());
    MEGAMOE_CHECK(!files.empty(), "model directory ", model_dir,
                  " has no model.safetensors, model.safetensors.index.json or *.safetensors file");
  }
  for (const auto& file : files) {
    MEGAMOE_CHECK(fs::exists(file), "checkpoint shard ", file, " (listed in ", index_path.string(), ") is missing");
    files_.push_back(std::make_unique<SafetensorsFile>(file));
    for (const auto& [name, record] : files_.back()->tensors()) {
      const auto [it, inserted] = records_.emplace(name, &record);
      MEGAMOE_CHECK(inserted, "tensor '", name, "' appears in both ", it->second->file, " and ", file);
    }
  }
  for (const auto& [name, file] : expected_file) {
    const auto it = records_.find(name);
    MEGAMOE_CHECK(it != records_.end() && it->second->file == file, index_path.string(), ": tensor '", name,
                  "' is listed in ", file, " but that file does not hold it");
  }
}

const TensorRecord& Checkpoint::get(const std::string& name) const {
  const auto it = records_.find(name);
  MEGAMOE_CHECK(it != records_.end(), "checkpoint ", dir_, ": tensor '", name, "' is missing");
  return *it->second;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, record] : records_) out.push_back(name);
  return out;
}

void convert_to_f32(const TensorRecord& record, int64_t first_element, int64_t count, float* out) {
  MEGAMOE_CHECK(first_element >= 0 && count >= 0 && first_element + count <= record.numel(), "tensor '",
                record.name, "' in ", record.file, ": elements [", first_element, ", ", first_element + count,
                ") out of range ", record.numel());
  switch (record.dtype) {
    case DType::kF32:
      std::memcpy(out, record.data + first_element * 4, static_cast<size_t>(count) * 4);
      return;
    case DType::kBF16:
    case DType::kF16: {
      const uint8_t* src = record.data + first_element * 2;
      for (int64_t i = 0; i < count; ++i) {
        const uint16_t bits = static_cast<uint16_t>(src[2 * i] | (src[2 * i + 1] << 8));
        out[i] = record.dtype == DType::kBF16 ? formats::bf16_to_f32(bits) : formats::f16_to_f32(bits);
      }
      return;
    }
    default:
      MEGAMOE_FAIL("tensor '", record.name, "' in ", record.file, ": dtype ", record.dtype_name,
                   " cannot be read as a floating-point weight (BF16, F16, F32)");
  }
}

std::vector<float> Checkpoint::read_f32(const std::string& name, const std::vector<int64_t>& expected_shape) const {
  const TensorRecord& record = get(name);
  MEGAMOE_CHECK(record.shape == expected_shape, "tensor '", name, "' in ", record.file, ": shape ",
                record.shape_string(), " but the config needs ", shape_string(expected_shape));
  std::vector<float> out(static_cast<size_t>(record.numel()));
  convert_to_f32(record, 0, record.numel(), out.data());
  return out;
}

}  // namespace megamoe::engine
