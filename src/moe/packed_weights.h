// Upload of one expert's canonical weight matrix into a GPU backend's packed device slab (the grouped
// GEMM layout of kernels/grouped_gemm.h), shared by the staged and mega backends.
#pragma once

#include <cstdint>

#include "kernels/grouped_gemm.h"
#include "megamoe/formats.h"

namespace megamoe {

// Checks `m` (format == `format`, shape [rows, cols], data size; errors name `field`), packs it for
// `role` and copies it to expert `expert`'s slot of `data_slab` (and `scales_slab` for formats with
// scales). Synchronous.
void upload_packed_expert(const char* field, const formats::QuantizedMatrix& m, WeightFormat format, int64_t rows,
                          int64_t cols, int expert, kernels::GemmRole role, void* data_slab, float* scales_slab);

// W4A8 (nvfp4 / mxfp4): the same checks, then pack_w4a8_expert_weights (grouped_gemm.h "W4A8") into
// expert `expert`'s slots of the data, group-scale and block-record slabs (per-expert sizes:
// packed_w4a8_size). Synchronous.
void upload_packed_w4a8_expert(const char* field, const formats::QuantizedMatrix& m, WeightFormat format,
                               int64_t rows, int64_t cols, int expert, kernels::GemmRole role, void* data_slab,
                               uint8_t* group_scales_slab, kernels::W4a8BlockScale* blocks_slab);

}  // namespace megamoe
