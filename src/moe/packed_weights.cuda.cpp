#include "moe/packed_weights.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "megamoe/error_cuda.h"

namespace megamoe {

void upload_packed_expert(const char* field, const formats::QuantizedMatrix& m, WeightFormat format, int64_t rows,
                          int64_t cols, int expert, kernels::GemmRole role, void* data_slab, float* scales_slab) {
  MEGAMOE_CHECK(m.format == format, field, ".format = ", weight_format_name(m.format), " but the config says ",
                weight_format_name(format));
  MEGAMOE_CHECK(m.rows == rows && m.cols == cols, field, ": expected [", rows, ", ", cols, "], got [", m.rows, ", ",
                m.cols, "]");
  const size_t bytes = static_cast<size_t>(rows) * cols * (format == WeightFormat::kBf16 ? 2 : 1);
  MEGAMOE_CHECK(m.data.size() == bytes, field, ".data has ", m.data.size(), " bytes, expected ", bytes);
  // The grouped GEMM's packed layout (W13 gate/up interleaved by 128 rows), made once here.
  const kernels::PackedWeightSize packed = kernels::packed_weight_bytes(m.format, rows, cols);
  std::vector<uint8_t> packed_data(packed.data_bytes);
  std::vector<float> packed_scales(packed.scale_count);
  kernels::pack_expert_weights(m, role, packed_data.data(), packed.scale_count ? packed_scales.data() : nullptr);
  MEGAMOE_CUDA_CHECK(cudaMemcpy(static_cast<uint8_t*>(data_slab) + packed.data_bytes * expert, packed_data.data(),
                                packed.data_bytes, cudaMemcpyHostToDevice));
  if (packed.scale_count)  // bf16 has none
    MEGAMOE_CUDA_CHECK(cudaMemcpy(scales_slab + packed.scale_count * expert, packed_scales.data(),
                                  packed.scale_count * sizeof(float), cudaMemcpyHostToDevice));
  // NOTES: cudaMemcpy from pageable memory may return before the DMA lands; forward() runs on a
  // possibly non-blocking stream.
  MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
}

void upload_packed_w4a8_expert(const char* field, const formats::QuantizedMatrix& m, WeightFormat format,
                               int64_t rows, int64_t cols, int expert, kernels::GemmRole role, void* data_slab,
                               uint8_t* group_scales_slab, kernels::W4a8BlockScale* blocks_slab) {
  MEGAMOE_CHECK(m.format == format, field, ".format = ", weight_format_name(m.format), " but the config says ",
                weight_format_name(format));
  MEGAMOE_CHECK(m.rows == rows && m.cols == cols, field, ": expected [", rows, ", ", cols, "], got [", m.rows, ", ",
                m.cols, "]");
  const kernels::PackedW4a8Size size = kernels::packed_w4a8_size(m.format, rows, cols);
  std::vector<uint8_t> packed_data(size.data_bytes), packed_scales(size.group_scale_bytes);
  std::vector<kernels::W4a8BlockScale> packed_blocks(size.block_count);
  kernels::pack_w4a8_expert_weights(m, role, packed_data.data(), packed_scales.data(), packed_blocks.data());
  MEGAMOE_CUDA_CHECK(cudaMemcpy(static_cast<uint8_t*>(data_slab) + size.data_bytes * expert, packed_data.data(),
                                size.data_bytes, cudaMemcpyHostToDevice));
  MEGAMOE_CUDA_CHECK(cudaMemcpy(group_scales_slab + size.group_scale_bytes * expert, packed_scales.data(),
                                size.group_scale_bytes, cudaMemcpyHostToDevice));
  MEGAMOE_CUDA_CHECK(cudaMemcpy(blocks_slab + size.block_count * expert, packed_blocks.data(),
                                size.block_count * sizeof(kernels::W4a8BlockScale), cudaMemcpyHostToDevice));
  MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());  // as upload_packed_expert (pageable copies)
}

}  // namespace megamoe
