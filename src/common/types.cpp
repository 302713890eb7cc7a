#include "megamoe/types.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "megamoe/error.h"
#include "megamoe/tensor.h"

namespace megamoe {
namespace {
std::string normalized(std::string_view name) {
  std::string out(name);
  for (char& c : out) c = c == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
}  // namespace

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF64: return "f64";
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kFP8E4M3: return "fp8_e4m3";
    case DType::kFP8E5M2: return "fp8_e5m2";
    case DType::kFP4E2M1x2: return "fp4_e2m1x2";
    case DType::kUE8M0: return "ue8m0";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
  }
  return "?";
}

int dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::kF64: case DType::kI64: return 8;
    case DType::kF32: case DType::kI32: return 4;
    case DType::kBF16: case DType::kF16: return 2;
    default: return 1;
  }
}

std::string_view weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kBf16: return "bf16";
    case WeightFormat::kFp8Block: return "fp8_block";
    case WeightFormat::kNvfp4: return "nvfp4";
    case WeightFormat::kMxfp4: return "mxfp4";
  }
  return "?";
}

WeightFormat parse_weight_format(std::string_view name) {
  const std::string n = normalized(name);
  if (n == "bf16") return WeightFormat::kBf16;
  if (n == "fp8" || n == "fp8_block") return WeightFormat::kFp8Block;
  if (n == "nvfp4") return WeightFormat::kNvfp4;
  if (n == "mxfp4") return WeightFormat::kMxfp4;
  MEGAMOE_FAIL("weight format '", name, "' is unknown; expected one of bf16, fp8_block, nvfp4, mxfp4");
}

std::string_view activation_name(Activation::Kind kind) {
  switch (kind) {
    case Activation::Kind::kSiluMul: return "silu";
    case Activation::Kind::kSwigluClamped: return "swiglu_clamped";
  }
  return "?";
}

Activation::Kind parse_activation(std::string_view name) {
  const std::string n = normalized(name);
  if (n == "silu" || n == "silu_and_mul" || n == "swiglu") return Activation::Kind::kSiluMul;
  if (n == "swiglu_clamped" || n == "swigluoai" || n == "swiglu_oai") return Activation::Kind::kSwigluClamped;
  MEGAMOE_FAIL("activation '", name, "' is unknown; expected silu or swiglu_clamped");
}

void check_tensor(std::string_view field, const TensorView& view, DType dtype,
                  std::initializer_list<int64_t> shape, Device device) {
  auto describe = [](DType d, int rank, const int64_t* dims, Device dev) {
    std::string s = std::string(dtype_name(d)) + " [";
    for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + (dims[i] < 0 ? std::string("*") : std::to_string(dims[i]));
    return s + "] on " + (dev == Device::kCpu ? "cpu" : "cuda");
  };
  const std::vector<int64_t> want(shape);
  bool ok = view.dtype == dtype && view.rank == static_cast<int>(want.size()) && view.device == device;
  for (size_t i = 0; ok && i < want.size(); ++i) ok = want[i] < 0 || want[i] == view.shape[i];
  MEGAMOE_CHECK(ok, field, ": expected ", describe(dtype, static_cast<int>(want.size()), want.data(), device),
                ", got ", describe(view.dtype, view.rank, view.shape.data(), view.device));
  MEGAMOE_CHECK(view.data != nullptr || view.numel() == 0, field, ": data pointer is null");
}

}  // namespace megamoe
