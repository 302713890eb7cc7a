// The `reference` backend: the CPU oracle of the MoE layer that every GPU backend is tested against.
// make_backend("reference", ...) gives fp64 accumulation; this header adds the fp32 option.
// The exact pipeline and every rounding point are documented in src/backends/reference.cpp (NOTES).
#pragma once

#include <memory>

#include "megamoe/moe.h"

namespace megamoe {

enum class Accumulation : uint8_t {
  kF64,  // GEMM dot products summed in fp64 from exact products, then rounded to fp32 (default)
  kF32,  // fp32 fused multiply-add chain, K ascending (closer to one GPU thread, not to wgmma)
};

struct ReferenceOptions {
  Accumulation accumulation = Accumulation::kF64;
};

// Single rank (no EP group). Throws megamoe::Error when `config` is invalid.
std::unique_ptr<MoeBackend> make_reference_backend(const MoeConfig& config, ReferenceOptions options = {});

class CpuEpGroup;  // cpu_ep.h
// Rank `rank` of an in-process expert-parallel group (CPU / tests only): holds experts
// CpuEpGroup::local_experts(E, N, rank); forward() is collective over the group and gives results
// bit-identical to the single-rank backend (each top-k slot is computed by its expert's owner, then
// summed by the token's rank in slot order). The group must outlive the backend.
std::unique_ptr<MoeBackend> make_reference_backend(const MoeConfig& config, ReferenceOptions options,
                                                   CpuEpGroup& group, int rank);

}  // namespace megamoe
