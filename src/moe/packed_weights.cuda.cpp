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

}  // namespace megamoe
