// Checkpoint conventions -> the canonical per-expert QuantizedMatrix (formats.h).
//
// Each function takes the raw tensors of ONE expert's ONE projection as stored in a checkpoint
// (safetensors, host memory) and produces the canonical matrix, bit for bit where the convention
// allows it. Formulas and worked numbers: docs/formats.md ("Checkpoint conventions").
//
// NOTES: every shape / dtype mismatch throws megamoe::Error naming the tensor (its role and, when
// given, its checkpoint name) and the expected shape, before anything is copied.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "megamoe/formats.h"
#include "megamoe/types.h"

namespace megamoe::formats {

// A non-owning, host-memory, row-major view of one checkpoint tensor.
struct RawTensor {
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;  // [] = scalar
  const void* data = nullptr;
  std::string name;  // checkpoint key, only for error messages (may be empty)

  int64_t numel() const;
  int64_t bytes() const { return numel() * dtype_bytes(dtype); }  // kFP4E2M1x2: shape counts bytes
};

// The [1:] slice of expert `expert` of a stacked [E, ...] tensor (gpt-oss stores
// `*_blocks` [E, N, K/32, 16] and `*_scales` [E, N, K/32]; fused checkpoints store
// `weight_scale_2` [E, 2] -> [2] and `input_scale` [E] -> []). Throws naming the tensor when
// expert is out of [0, E).
RawTensor slice_expert(const RawTensor& stacked, int64_t expert);

// ---- dense ---------------------------------------------------------------------------------------
// BF16 `weight` [N, K] -> kBf16 (a copy of the bit patterns).
QuantizedMatrix from_bf16_checkpoint(const RawTensor& weight);

// ---- DeepSeek FP8 block (DeepSeek-V3/R1, Qwen3 FP8, ...) ------------------------------------------
// `weight` E4M3 [N, K] (kFP8E4M3; kU8 accepted as raw bytes), `weight_scale_inv` F32
// [ceil(N/128), ceil(K/128)], already a DEQUANT factor: value = e4m3(w) * weight_scale_inv[n/128, k/128].
// E5M2 weights are rejected (converting them to E4M3 is not exact).
QuantizedMatrix from_deepseek_fp8(const RawTensor& weight, const RawTensor& weight_scale_inv);

// ---- NVFP4 ---------------------------------------------------------------------------------------
// The two conventions store the FP32 per-tensor ("global") scale inversely:
//   kModelOpt            `weight_scale_2` and `input_scale` are dequant factors (amax / (448*6)).
//   kCompressedTensors   `weight_global_scale` and `input_global_scale` are normalisations
//                        ((448*6) / amax): dequant factor = 1 / stored.
// In both, the per-16 E4M3 `weight_scale` is relative to the global: value = e2m1 * e4m3(ws) * g_dq.
enum class Nvfp4ScaleConvention : uint8_t { kModelOpt, kCompressedTensors };

// FP32 dequant factor of a stored global/input scale: kModelOpt -> stored; kCompressedTensors ->
// fp32(1 / stored) (correctly rounded; exact when stored is a power of two). Throws unless stored is
// finite and > 0.
float nvfp4_dequant_factor(float stored, Nvfp4ScaleConvention convention, const char* what = "global scale");

// GEMM alphas of a W4A4 NVFP4 fc1 (the factor a Blackwell FP4 GEMM applies to the FP4xFP4 dot
// products): alpha = input dequant * weight dequant, computed in FP64 and rounded once to FP32.
// Gate and up may have different weight globals, so there are two. Worked example (compressed-
// tensors): input_global_scale 135, weight globals 2 and 4 -> {1/270, 1/540}.
// NOTES: megamoe on Hopper runs NVFP4 as W4A8: activations are quantized dynamically to FP8 per token
// per 128 channels, so the checkpoint's input scale is validated and recorded but not used by the
// kernels; these alphas are for reference and for Blackwell-style consumers.
std::array<float, 2> nvfp4_fc1_alphas(float input_scale, std::array<float, 2> weight_global_scales,
                                      Nvfp4ScaleConvention convention);

// ModelOpt (`hf_quant_config.json` quant_algo NVFP4): `weight` U8 [N, K/2] (kFP4E2M1x2 accepted),
// low nibble = even k; `weight_scale` E4M3 [N, K/16] (kU8 accepted); `weight_scale_2` F32 [] or [1]
// (one global) or [2] (an already fused W13: index 0 for gate rows [0, N/2), 1 for up rows).
QuantizedMatrix from_modelopt_nvfp4(const RawTensor& weight, const RawTensor& weight_scale,
                                    const RawTensor& weight_scale_2);
// compressed-tensors (format "nvfp4-pack-quantized"): `weight_packed` U8 [N, K/2], `weight_scale`
// E4M3 [N, K/16], `weight_global_scale` F32 [] / [1] / [2] (normalisation: factor = 1 / stored).
QuantizedMatrix from_compressed_tensors_nvfp4(const RawTensor& weight_packed, const RawTensor& weight_scale,
                                              const RawTensor& weight_global_scale);
// A checkpoint's activation scale (ModelOpt `input_scale` / compressed-tensors `input_global_scale`,
// [] or [1]), returned as an FP32 dequant factor. Only validated and recorded on Hopper (see above).
float nvfp4_input_dequant_factor(const RawTensor& input_scale, Nvfp4ScaleConvention convention);

// ---- MXFP4 (OCP MX; compressed-tensors "mxfp4-pack-quantized"; Intel Neural Compressor; gpt-oss) ----
// `blocks` U8 [N, K/2] (compressed-tensors / INC `weight_packed`) or [N, K/32, 16] (gpt-oss
// `*_blocks`, one expert), low nibble = even k; `scales` U8 / kUE8M0 [N, K/32] (E8M0, bias 127,
// 255 = NaN). value = e2m1 * 2^(scale - 127).
QuantizedMatrix from_mxfp4(const RawTensor& blocks, const RawTensor& scales);

// ---- W13 assembly ----------------------------------------------------------------------------------
// [gate; up]: gate rows then up rows, both [I, H] of one format. Exact for every format:
//   bf16 / mxfp4: scales are per row, concatenation is exact;
//   fp8_block: per 128x128 block; exact when I % 128 == 0, otherwise rejected (a scale block would
//              span gate and up rows);
//   nvfp4: each input must carry one global (global_scales[0] == [1]); the result keeps them as
//          global_scales = {gate, up}, so different gate/up globals are exact, never approximated.
QuantizedMatrix fuse_w13(const QuantizedMatrix& gate, const QuantizedMatrix& up);
// gpt-oss stores gate_up rows interleaved (gate i = row 2i, up i = row 2i+1); this returns [gate; up].
// Rows are permuted whole, with their per-row scales: exact for bf16 / mxfp4 / nvfp4 (one global);
// fp8_block is rejected (its 128-row scale blocks cannot be permuted).
QuantizedMatrix deinterleave_gate_up(const QuantizedMatrix& interleaved);

}  // namespace megamoe::formats
