// Load-time layout transform of NVFP4 / MXFP4 expert weights for the W4A8 grouped GEMM (the layout and
// the decode rule are documented in grouped_gemm.h, "W4A8", and docs/grouped_gemm.md).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/grouped_gemm.h"
#include "megamoe/error.h"

namespace megamoe::kernels {
namespace {

int group_size(WeightFormat format) {
  return format == WeightFormat::kNvfp4 ? formats::kNvfp4GroupSize : formats::kMxfp4GroupSize;
}

// |scale| of one group scale byte as the format defines it (NaN rejected by the caller).
double group_scale_value(WeightFormat format, uint8_t bits) {
  return format == WeightFormat::kNvfp4 ? std::fabs(static_cast<double>(formats::e4m3_to_f32(bits)))
                                        : std::ldexp(1.0, static_cast<int>(bits) - 127);
}

// The largest p with 6 * max_scale * 2^p <= 448 (exact in double: scales are E4M3 / powers of two).
int decode_exponent(double max_scale) {
  if (max_scale == 0.0) return 0;
  int p = static_cast<int>(std::floor(std::log2(448.0 / (6.0 * max_scale))));
  while (6.0 * max_scale * std::ldexp(1.0, p + 1) <= 448.0) ++p;
  while (6.0 * max_scale * std::ldexp(1.0, p) > 448.0) --p;
  return p;
}

// 8 K-consecutive E2M1 codes -> the kernel's word (see grouped_gemm.h): magnitudes as prmt selectors,
// signs where the decoder's lop3 picks them up.
uint32_t permute_codes(const uint8_t (&codes)[8]) {
  uint32_t word = 0;
  for (int i = 0; i < 4; ++i) {
    word |= static_cast<uint32_t>(codes[i] & 7) << (4 * i);
    word |= static_cast<uint32_t>(codes[i] >> 3) << (8 * i + 7);
    word |= static_cast<uint32_t>(codes[4 + i] & 7) << (16 + 4 * i);
    word |= static_cast<uint32_t>(codes[4 + i] >> 3) << (8 * i + 3);
  }
  return word;
}

}  // namespace

PackedW4a8Size packed_w4a8_size(WeightFormat format, int64_t rows, int64_t cols) {
  MEGAMOE_CHECK(format == WeightFormat::kNvfp4 || format == WeightFormat::kMxfp4, "W4A8 weight format ",
                weight_format_name(format), " is not nvfp4 or mxfp4");
  MEGAMOE_CHECK(rows > 0 && rows % 256 == 0, "W4A8 weight rows = ", rows,
                " must be a positive multiple of 256 (the kernel's 256-column tiles)");
  MEGAMOE_CHECK(cols > 0 && cols % 128 == 0, "W4A8 weight cols = ", cols, " must be a positive multiple of 128");
  return {static_cast<size_t>(rows * cols / 2), static_cast<size_t>(rows * cols / group_size(format)),
          static_cast<size_t>((rows / 128) * (cols / 128))};
}

void pack_w4a8_expert_weights(const formats::QuantizedMatrix& canonical, GemmRole role, uint8_t* data_out,
                              uint8_t* group_scales_out, W4a8BlockScale* blocks_out) {
  const WeightFormat format = canonical.format;
  (void)packed_w4a8_size(format, canonical.rows, canonical.cols);  // validates the shape (named errors)
  MEGAMOE_CHECK(data_out != nullptr && group_scales_out != nullptr && blocks_out != nullptr,
                "pack_w4a8_expert_weights: output pointers must be non-null");
  canonical.validate();
  const int64_t rows = canonical.rows, cols = canonical.cols;
  const int group = group_size(format);
  const int groups_per_block = 128 / group;
  const int64_t groups_per_row = cols / group, k_blocks = cols / 128;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups_per_row; ++g) {
      const uint8_t bits = canonical.group_scales[r * groups_per_row + g];
      const bool nan = format == WeightFormat::kNvfp4 ? (bits & 0x7F) == 0x7F : bits == 0xFF;
      MEGAMOE_CHECK(!nan, "group_scales[", r, ", ", g, "] = byte ", static_cast<int>(bits), " is NaN (",
                    weight_format_name(format), ")");
    }
  // Packed row of canonical row r. kGateUp: W13 interleaves gate/up 128-row blocks (as the FP8 layout does).
  // kGateUpInterleaved8 (W4A8 v10 GEMM 1): inside packed 256-row tile j, runs of 8 rows: gate rows 8m..8m+7 of
  // block j, then up rows 8m..8m+7 (pack_expert_weights' FP8 rule). Block records: per canonical 128-row block
  // (a block's p and factor do not depend on the packing), stored at packed block 2 j = gate block j, 2 j + 1 = up
  // block j for both W13 packings (the kernels read records 2 n_tile, 2 n_tile + 1 of a 256-row tile).
  MEGAMOE_CHECK(role == GemmRole::kDown || role == GemmRole::kGateUp || role == GemmRole::kGateUpInterleaved8,
                "pack_w4a8_expert_weights: role = ", static_cast<int>(role),
                " must be kGateUp, kGateUpInterleaved8 or kDown");
  MEGAMOE_CHECK(role == GemmRole::kDown || rows % 256 == 0, "W13 rows = 2I = ", rows, " must be a multiple of 256");
  const int64_t half_blocks = rows / 256, intermediate = rows / 2;
  auto packed_block = [&](int64_t block) {  // packed 128-row block of canonical block `block`
    if (role == GemmRole::kDown) return block;
    const int64_t half = block / half_blocks, j = block % half_blocks;
    return 2 * j + half;
  };
  auto packed_row = [&](int64_t r) {
    if (role == GemmRole::kGateUpInterleaved8) {
      const int64_t half = r / intermediate, within = r % intermediate;  // half 0 gate, 1 up
      return 256 * (within / 128) + 16 * ((within % 128) / 8) + 8 * half + within % 8;
    }
    return packed_block(r / 128) * 128 + r % 128;
  };
  auto pack_rows = [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t pr = packed_row(r);
      for (int64_t c = 0; c < cols; c += 8) {
        uint8_t codes[8];
        for (int i = 0; i < 8; ++i) codes[i] = canonical.fp4_code(r, c + i);
        const uint32_t word = permute_codes(codes);
        std::memcpy(data_out + pr * (cols / 2) + c / 2, &word, 4);  // little-endian host
      }
      for (int64_t kb = 0; kb < k_blocks; ++kb)
        std::memcpy(group_scales_out + (kb * rows + pr) * groups_per_block,
                    canonical.group_scales.data() + r * groups_per_row + kb * groups_per_block, groups_per_block);
    }
  };
  // NOTES: a dsv3 W13 (4096 x 7168) takes ~0.1 s on one core, and a layer loads it once per local
  // expert and backend (256 experts: ~40 s of `bench layer --format nvfp4` setup); rows are
  // independent (each writes its own packed row), so they are split over the host's cores.
  const int64_t threads = rows * cols >= (int64_t{1} << 22)
                              ? std::min<int64_t>({std::max(1u, std::thread::hardware_concurrency()), 16, rows})
                              : 1;
  const int64_t chunk = (rows + threads - 1) / threads;
  std::vector<std::thread> workers;
  for (int64_t begin = chunk; begin < rows; begin += chunk)
    workers.emplace_back(pack_rows, begin, std::min(rows, begin + chunk));
  pack_rows(0, std::min(rows, chunk));
  for (auto& worker : workers) worker.join();
  for (int64_t rb = 0; rb < rows / 128; ++rb) {
    const double global = format == WeightFormat::kNvfp4 ? canonical.global_scales[rb * 128 < rows / 2 ? 0 : 1] : 1.0;
    for (int64_t kb = 0; kb < k_blocks; ++kb) {
      double max_scale = 0.0;
      for (int64_t r = rb * 128; r < rb * 128 + 128; ++r)
        for (int g = 0; g < groups_per_block; ++g)
          max_scale = std::max(max_scale, group_scale_value(format, canonical.group_scales[r * groups_per_row +
                                                                                           kb * groups_per_block + g]));
      const int p = decode_exponent(max_scale);
      W4a8BlockScale& block = blocks_out[packed_block(rb) * k_blocks + kb];
      block.decode_exponent = p;
      block.factor = static_cast<float>(std::ldexp(global, -p));  // exact unless it leaves FP32's range
    }
  }
}

}  // namespace megamoe::kernels
