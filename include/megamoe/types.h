// Element types, weight formats and activations shared by every layer of megamoe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace megamoe {

enum class DType : uint8_t {
  kF64,
  kF32,
  kBF16,
  kF16,
  kFP8E4M3,   // OCP E4M3 "fn": no infinities, 0x7F/0xFF = NaN, max finite 448
  kFP8E5M2,   // OCP E5M2 (IEEE-like, has infinities), max finite 57344
  kFP4E2M1x2, // two E2M1 codes per byte, low nibble = even element
  kUE8M0,     // power-of-two scale: value 2^(byte-127), byte 255 = NaN
  kI32,
  kI64,
  kU8,
};

std::string_view dtype_name(DType dtype);
// Bytes per stored element; kFP4E2M1x2 reports 1 (one byte holds two elements).
int dtype_bytes(DType dtype);

// How one expert's weight matrix is stored (canonical representation, see formats.h).
enum class WeightFormat : uint8_t {
  kBf16,      // BF16 weights, BF16 activations
  kFp8Block,  // FP8 E4M3 weights, one FP32 scale per 128x128 block; FP8 activations per token per 128
  kNvfp4,     // E2M1 + E4M3 scale per 16 + FP32 global; on Hopper run as W4A8 (FP8 activations)
  kMxfp4,     // E2M1 + UE8M0 scale per 32; on Hopper run as W4A8 (FP8 activations)
};

std::string_view weight_format_name(WeightFormat format);
// Accepts "bf16", "fp8", "fp8_block", "fp8-block", "nvfp4", "mxfp4" (case-insensitive); throws otherwise.
WeightFormat parse_weight_format(std::string_view name);
// True when activations entering GEMM 1 and GEMM 2 are quantized to FP8 per token per 128 channels.
inline bool uses_fp8_activations(WeightFormat format) { return format != WeightFormat::kBf16; }

struct Activation {
  enum class Kind : uint8_t {
    kSiluMul,        // silu(gate) * up
    kSwigluClamped,  // gpt-oss: g = min(gate, limit); u = clamp(up, -limit, limit);
                     //          out = g * sigmoid(alpha * g) * (u + 1)
  };
  Kind kind = Kind::kSiluMul;
  float limit = 7.0f;   // kSwigluClamped only
  float alpha = 1.702f; // kSwigluClamped only
};

std::string_view activation_name(Activation::Kind kind);
Activation::Kind parse_activation(std::string_view name);  // "silu", "swiglu_clamped" / "swigluoai"

}  // namespace megamoe
