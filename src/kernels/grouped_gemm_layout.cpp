// Host-side weight-layout transform for the grouped GEMMs (see grouped_gemm.h for the layouts).
#include <cstring>

#include "kernels/grouped_gemm.h"
#include "megamoe/error.h"

namespace megamoe::kernels {

PackedWeightSize packed_weight_bytes(WeightFormat format, int64_t rows, int64_t cols) {
  MEGAMOE_CHECK(format == WeightFormat::kFp8Block || format == WeightFormat::kBf16, "grouped GEMM weight format ",
                weight_format_name(format), " is not supported yet (supported: fp8_block, bf16)");
  MEGAMOE_CHECK(rows > 0 && rows % 128 == 0, "weight rows = ", rows, " must be a positive multiple of 128");
  MEGAMOE_CHECK(cols > 0 && cols % 128 == 0, "weight cols = ", cols, " must be a positive multiple of 128");
  if (format == WeightFormat::kBf16) return {static_cast<size_t>(rows * cols * 2), 0};
  return {static_cast<size_t>(rows * cols), static_cast<size_t>((rows / 128) * (cols / 128))};
}

void pack_expert_weights(const formats::QuantizedMatrix& canonical, GemmRole role, uint8_t* data_out,
                         float* scales_out) {
  const PackedWeightSize size = packed_weight_bytes(canonical.format, canonical.rows, canonical.cols);
  MEGAMOE_CHECK(data_out != nullptr && (scales_out != nullptr || size.scale_count == 0),
                "pack_expert_weights: output pointers must be non-null");
  MEGAMOE_CHECK(canonical.data.size() == size.data_bytes, "canonical.data has ", canonical.data.size(),
                " bytes, expected ", size.data_bytes, " (rows*cols*bytes per element)");
  MEGAMOE_CHECK(canonical.block_scales.size() == size.scale_count, "canonical.block_scales has ",
                canonical.block_scales.size(), " entries, expected ", size.scale_count,
                size.scale_count ? " ((rows/128)*(cols/128))" : " (bf16 has no scales)");
  const int64_t row_bytes = static_cast<int64_t>(size.data_bytes) / canonical.rows;
  const int64_t k_blocks = canonical.cols / 128;
  if (role == GemmRole::kDown) {
    std::memcpy(data_out, canonical.data.data(), size.data_bytes);
    if (size.scale_count) std::memcpy(scales_out, canonical.block_scales.data(), size.scale_count * sizeof(float));
    return;
  }
  // kGateUp: canonical rows [0, I) are gate, [I, 2I) up; packed 256-row tile j = gate block j, up block j.
  MEGAMOE_CHECK(canonical.rows % 256 == 0, "W13 rows = 2I = ", canonical.rows, " must be a multiple of 256");
  const int64_t intermediate = canonical.rows / 2;
  const int64_t blocks = intermediate / 128;
  if (role == GemmRole::kGateUpInterleaved8) {
    // v9 (grouped_gemm.h): rows of tile j in runs of 8: gate 8m..8m+7 then up 8m..8m+7 of block j.
    // fp8_block (v9) and bf16 (BF16 v2): packed_weight_bytes above admits only these two formats.
    const uint8_t* source = canonical.data.data();
    for (int64_t packed_row = 0; packed_row < canonical.rows; ++packed_row) {
      const int64_t j = packed_row / 256, in_tile = packed_row % 256;
      const int64_t half = (in_tile / 8) % 2;  // 0 gate, 1 up
      const int64_t source_row = half * intermediate + 128 * j + 8 * (in_tile / 16) + in_tile % 8;
      std::memcpy(data_out + packed_row * row_bytes, source + source_row * row_bytes, row_bytes);
    }
    for (int64_t j = 0; j < blocks && size.scale_count; ++j)  // scales as kGateUp: 2j = gate, 2j + 1 = up block j
      for (int half = 0; half < 2; ++half)
        std::memcpy(scales_out + (2 * j + half) * k_blocks, canonical.block_scales.data() + (half * blocks + j) * k_blocks,
                    k_blocks * sizeof(float));
    return;
  }
  MEGAMOE_CHECK(role == GemmRole::kGateUp, "pack_expert_weights: role = ", static_cast<int>(role),
                " must be kGateUp, kDown or kGateUpInterleaved8");
  for (int64_t j = 0; j < blocks; ++j) {
    for (int half = 0; half < 2; ++half) {
      const int64_t src_block = half * blocks + j;  // gate block j or up block j
      const int64_t dst_block = 2 * j + half;
      std::memcpy(data_out + dst_block * 128 * row_bytes, canonical.data.data() + src_block * 128 * row_bytes,
                  128 * row_bytes);
      if (size.scale_count)
        std::memcpy(scales_out + dst_block * k_blocks, canonical.block_scales.data() + src_block * k_blocks,
                    k_blocks * sizeof(float));
    }
  }
}

}  // namespace megamoe::kernels
