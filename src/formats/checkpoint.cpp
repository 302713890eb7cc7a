// Checkpoint conventions -> canonical QuantizedMatrix (see checkpoint.h and docs/formats.md).
#include "megamoe/checkpoint.h"

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>

#include "megamoe/error.h"

namespace megamoe::formats {
namespace {

std::string label(const char* role, const RawTensor& t) {
  return t.name.empty() ? std::string(role) : std::string(role) + " '" + t.name + "'";
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string dtypes_string(std::initializer_list<DType> dtypes) {
  std::string s;
  for (DType d : dtypes) s += (s.empty() ? "" : " or ") + std::string(dtype_name(d));
  return s;
}

// Checks dtype (one of `dtypes`) and exact shape; names the tensor in the message.
void check_raw(const char* role, const RawTensor& t, std::initializer_list<DType> dtypes,
               const std::vector<int64_t>& shape) {
  bool dtype_ok = false;
  for (DType d : dtypes) dtype_ok = dtype_ok || d == t.dtype;
  MEGAMOE_CHECK(dtype_ok && t.shape == shape, label(role, t), ": expected ", dtypes_string(dtypes), " ",
                shape_string(shape), ", got ", dtype_name(t.dtype), " ", shape_string(t.shape));
  MEGAMOE_CHECK(t.data != nullptr || t.numel() == 0, label(role, t), ": data pointer is null");
}

void check_rank2(const char* role, const RawTensor& t) {
  MEGAMOE_CHECK(t.shape.size() == 2 && t.shape[0] >= 0 && t.shape[1] >= 0, label(role, t),
                ": expected a 2-D tensor [N, ...], got shape ", shape_string(t.shape));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename T>
void copy_bytes(std::vector<T>& dst, const RawTensor& src) {
  dst.resize(static_cast<size_t>(src.bytes() / static_cast<int64_t>(sizeof(T))));
  if (!dst.empty()) std::memcpy(dst.data(), src.data, static_cast<size_t>(src.bytes()));
}

// F32 [] / [1] -> {v, v}; [2] -> {v0, v1}.
std::array<float, 2> read_global_pair(const char* role, const RawTensor& t) {
  const bool scalar = t.shape.empty() || t.shape == std::vector<int64_t>{1};
  MEGAMOE_CHECK(t.dtype == DType::kF32 && (scalar || t.shape == std::vector<int64_t>{2}), label(role, t),
                ": expected f32 [] or [1] (one global) or [2] (gate, up), got ", dtype_name(t.dtype), " ",
                shape_string(t.shape));
  MEGAMOE_CHECK(t.data != nullptr, label(role, t), ": data pointer is null");
  const float* v = static_cast<const float*>(t.data);
  return scalar ? std::array<float, 2>{v[0], v[0]} : std::array<float, 2>{v[0], v[1]};
}

// A matrix of `format` whose codes are a copy of `codes` (scales are filled in by the caller).
QuantizedMatrix adopt_codes(WeightFormat format, int64_t rows, int64_t cols, const RawTensor& codes) {
  QuantizedMatrix m;
  m.format = format;
  m.rows = rows;
  m.cols = cols;
  copy_bytes(m.data, codes);
  return m;
}

QuantizedMatrix nvfp4_from(const char* weight_role, const RawTensor& weight, const RawTensor& weight_scale,
                           const char* global_role, const RawTensor& global, Nvfp4ScaleConvention convention) {
  check_rank2(weight_role, weight);
  const int64_t n = weight.shape[0], k = 2 * weight.shape[1];
  check_raw(weight_role, weight, {DType::kU8, DType::kFP4E2M1x2}, {n, k / 2});
  MEGAMOE_CHECK(k % kNvfp4GroupSize == 0, label(weight_role, weight), ": K = 2 * shape[1] = ", k,
                " must be a multiple of ", kNvfp4GroupSize, " (one E4M3 scale per 16 elements)");
  check_raw("weight_scale", weight_scale, {DType::kFP8E4M3, DType::kU8}, {n, k / kNvfp4GroupSize});
  const std::array<float, 2> stored = read_global_pair(global_role, global);
  if (stored[0] != stored[1] || global.shape == std::vector<int64_t>{2}) {
    MEGAMOE_CHECK(n % 2 == 0, label(global_role, global), ": 2 globals (gate, up) need an even row count N, got N = ", n);
  }
  QuantizedMatrix m = adopt_codes(WeightFormat::kNvfp4, n, k, weight);
  copy_bytes(m.group_scales, weight_scale);
  const std::string g0 = label(global_role, global) + "[0]", g1 = label(global_role, global) + "[1]";
  m.global_scales = {nvfp4_dequant_factor(stored[0], convention, g0.c_str()),
                     nvfp4_dequant_factor(stored[1], convention, g1.c_str())};
  m.validate();
  return m;
}

int64_t row_bytes(const QuantizedMatrix& m) {
  switch (m.format) {
    case WeightFormat::kBf16: return 2 * m.cols;
    case WeightFormat::kFp8Block: return m.cols;
    case WeightFormat::kNvfp4:
    case WeightFormat::kMxfp4: return ceil_div(m.cols, 2);
  }
  return 0;
}

int64_t group_scales_per_row(const QuantizedMatrix& m) {
  return m.rows == 0 ? 0 : m.expected_group_scales() / m.rows;
}

}  // namespace

int64_t RawTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

RawTensor slice_expert(const RawTensor& stacked, int64_t expert) {
  MEGAMOE_CHECK(!stacked.shape.empty(), label("stacked tensor", stacked), ": expected [E, ...], got a scalar");
  MEGAMOE_CHECK(expert >= 0 && expert < stacked.shape[0], label("stacked tensor", stacked), ": expert ", expert,
                " must be in [0, E = ", stacked.shape[0], ")");
  RawTensor slice;
  slice.dtype = stacked.dtype;
  slice.shape.assign(stacked.shape.begin() + 1, stacked.shape.end());
  slice.name = stacked.name.empty() ? std::string() : stacked.name + "[" + std::to_string(expert) + "]";
  MEGAMOE_CHECK(stacked.data != nullptr, label("stacked tensor", stacked), ": data pointer is null");
  slice.data = static_cast<const uint8_t*>(stacked.data) + expert * slice.bytes();
  return slice;
}

QuantizedMatrix from_bf16_checkpoint(const RawTensor& weight) {
  check_rank2("weight", weight);
  check_raw("weight", weight, {DType::kBF16}, weight.shape);
  // Little-endian host: the checkpoint's bytes are the canonical layout.
  QuantizedMatrix m = adopt_codes(WeightFormat::kBf16, weight.shape[0], weight.shape[1], weight);
  m.validate();
  return m;
}

QuantizedMatrix from_deepseek_fp8(const RawTensor& weight, const RawTensor& weight_scale_inv) {
  check_rank2("weight", weight);
  MEGAMOE_CHECK(weight.dtype != DType::kFP8E5M2, label("weight", weight),
                ": fp8_e5m2 block weights are not supported (E5M2 -> E4M3 is not exact); expected fp8_e4m3");
  const int64_t n = weight.shape[0], k = weight.shape[1];
  check_raw("weight", weight, {DType::kFP8E4M3, DType::kU8}, {n, k});
  check_raw("weight_scale_inv", weight_scale_inv, {DType::kF32}, {ceil_div(n, kFp8BlockSize), ceil_div(k, kFp8BlockSize)});
  QuantizedMatrix m = adopt_codes(WeightFormat::kFp8Block, n, k, weight);
  copy_bytes(m.block_scales, weight_scale_inv);
  m.validate();
  return m;
}

float nvfp4_dequant_factor(float stored, Nvfp4ScaleConvention convention, const char* what) {
  MEGAMOE_CHECK(std::isfinite(stored) && stored > 0.0f, what, " = ", stored, " must be finite and > 0");
  if (convention == Nvfp4ScaleConvention::kModelOpt) return stored;
  const float factor = static_cast<float>(1.0 / static_cast<double>(stored));
  MEGAMOE_CHECK(std::isfinite(factor) && factor > 0.0f, what, " = ", stored,
                ": its reciprocal (the dequant factor) is not a finite positive FP32");
  return factor;
}

std::array<float, 2> nvfp4_fc1_alphas(float input_scale, std::array<float, 2> weight_global_scales,
                                      Nvfp4ScaleConvention convention) {
  std::array<float, 2> alphas{};
  nvfp4_dequant_factor(input_scale, convention, "input scale");  // validates
  for (int i = 0; i < 2; ++i) {
    nvfp4_dequant_factor(weight_global_scales[i], convention, i == 0 ? "gate weight global" : "up weight global");
    // The product of two FP32 values is exact in FP64, so ModelOpt alphas are correctly rounded; the
    // compressed-tensors alpha is 1 / (input * weight) from that exact product, rounded once.
    const double product = static_cast<double>(input_scale) * weight_global_scales[i];
    alphas[i] = static_cast<float>(convention == Nvfp4ScaleConvention::kModelOpt ? product : 1.0 / product);
  }
  return alphas;
}

QuantizedMatrix from_modelopt_nvfp4(const RawTensor& weight, const RawTensor& weight_scale,
                                    const RawTensor& weight_scale_2) {
  return nvfp4_from("weight", weight, weight_scale, "weight_scale_2", weight_scale_2, Nvfp4ScaleConvention::kModelOpt);
}

QuantizedMatrix from_compressed_tensors_nvfp4(const RawTensor& weight_packed, const RawTensor& weight_scale,
                                              const RawTensor& weight_global_scale) {
  return nvfp4_from("weight_packed", weight_packed, weight_scale, "weight_global_scale", weight_global_scale,
                    Nvfp4ScaleConvention::kCompressedTensors);
}

float nvfp4_input_dequant_factor(const RawTensor& input_scale, Nvfp4ScaleConvention convention) {
  const char* role = convention == Nvfp4ScaleConvention::kModelOpt ? "input_scale" : "input_global_scale";
  const std::array<float, 2> stored = read_global_pair(role, input_scale);
  MEGAMOE_CHECK(input_scale.shape.size() <= 1 && input_scale.numel() == 1, label(role, input_scale),
                ": expected f32 [] or [1], got ", shape_string(input_scale.shape));
  return nvfp4_dequant_factor(stored[0], convention, label(role, input_scale).c_str());
}

QuantizedMatrix from_mxfp4(const RawTensor& blocks, const RawTensor& scales) {
  MEGAMOE_CHECK(blocks.shape.size() == 2 || blocks.shape.size() == 3, label("blocks", blocks),
                ": expected [N, K/2] or [N, K/32, 16], got ", shape_string(blocks.shape));
  const int64_t n = blocks.shape[0];
  int64_t k = 0;
  if (blocks.shape.size() == 3) {
    MEGAMOE_CHECK(blocks.shape[2] == kMxfp4GroupSize / 2, label("blocks", blocks),
                  ": gpt-oss layout [N, K/32, 16] needs a last dimension of 16, got ", shape_string(blocks.shape));
    k = blocks.shape[1] * kMxfp4GroupSize;
  } else {
    k = 2 * blocks.shape[1];
    MEGAMOE_CHECK(k % kMxfp4GroupSize == 0, label("blocks", blocks), ": K = 2 * shape[1] = ", k,
                  " must be a multiple of ", kMxfp4GroupSize, " (one E8M0 scale per 32 elements)");
  }
  check_raw("blocks", blocks, {DType::kU8, DType::kFP4E2M1x2}, blocks.shape);
  check_raw("scales", scales, {DType::kU8, DType::kUE8M0}, {n, k / kMxfp4GroupSize});
  // [N, K/32, 16] bytes are the [N, K/2] bytes in the same order.
  QuantizedMatrix m = adopt_codes(WeightFormat::kMxfp4, n, k, blocks);
  copy_bytes(m.group_scales, scales);
  m.validate();
  return m;
}

QuantizedMatrix fuse_w13(const QuantizedMatrix& gate, const QuantizedMatrix& up) {
  gate.validate();
  up.validate();
  MEGAMOE_CHECK(gate.format == up.format, "fuse_w13: gate format ", weight_format_name(gate.format),
                " differs from up format ", weight_format_name(up.format));
  MEGAMOE_CHECK(gate.rows == up.rows && gate.cols == up.cols, "fuse_w13: gate [", gate.rows, ", ", gate.cols,
                "] and up [", up.rows, ", ", up.cols, "] must have the same shape [I, H]");
  if (gate.format == WeightFormat::kFp8Block) {
    MEGAMOE_CHECK(gate.rows % kFp8BlockSize == 0, "fuse_w13: gate rows I = ", gate.rows,
                  " must be a multiple of 128 for fp8_block (a 128x128 scale block would span gate and up rows)");
  }
  if (gate.format == WeightFormat::kNvfp4) {
    MEGAMOE_CHECK(gate.global_scales[0] == gate.global_scales[1], "fuse_w13: gate global_scales {",
                  gate.global_scales[0], ", ", gate.global_scales[1], "} must be one global (already fused?)");
    MEGAMOE_CHECK(up.global_scales[0] == up.global_scales[1], "fuse_w13: up global_scales {", up.global_scales[0],
                  ", ", up.global_scales[1], "} must be one global (already fused?)");
  }
  QuantizedMatrix w13;
  w13.format = gate.format;
  w13.rows = 2 * gate.rows;
  w13.cols = gate.cols;
  auto concat = [](auto a, const auto& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  w13.data = concat(gate.data, up.data);
  w13.block_scales = concat(gate.block_scales, up.block_scales);  // row-major [ceil(2I/128), ceil(H/128)]
  w13.group_scales = concat(gate.group_scales, up.group_scales);
  if (gate.format == WeightFormat::kNvfp4) w13.global_scales = {gate.global_scales[0], up.global_scales[0]};
  w13.validate();
  return w13;
}

QuantizedMatrix deinterleave_gate_up(const QuantizedMatrix& interleaved) {
  interleaved.validate();
  MEGAMOE_CHECK(interleaved.format != WeightFormat::kFp8Block,
                "deinterleave_gate_up: fp8_block rows cannot be permuted (128-row scale blocks); de-interleave before quantizing");
  MEGAMOE_CHECK(interleaved.rows % 2 == 0, "deinterleave_gate_up: rows = ", interleaved.rows, " must be even (2I)");
  MEGAMOE_CHECK(interleaved.global_scales[0] == interleaved.global_scales[1],
                "deinterleave_gate_up: nvfp4 global_scales must be one global, got {", interleaved.global_scales[0],
                ", ", interleaved.global_scales[1], "}");
  QuantizedMatrix out = interleaved;
  const int64_t half = interleaved.rows / 2, data_row = row_bytes(interleaved), scale_row = group_scales_per_row(interleaved);
  for (int64_t src = 0; src < interleaved.rows; ++src) {
    const int64_t dst = (src % 2 == 0) ? src / 2 : half + src / 2;
    std::memcpy(out.data.data() + dst * data_row, interleaved.data.data() + src * data_row, static_cast<size_t>(data_row));
    if (scale_row > 0) {
      std::memcpy(out.group_scales.data() + dst * scale_row, interleaved.group_scales.data() + src * scale_row,
                  static_cast<size_t>(scale_row));
    }
  }
  return out;
}

}  // namespace megamoe::formats
