// Host checks of the two-pass GEMM-1 API (swiglu_quant.h). Plain C++: CPU-only builds compile it too, so the
// CPU tests cover the error messages.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/swiglu_quant.h"
#include "megamoe/error.h"

namespace megamoe::kernels {

namespace {
void check_pointer(const void* pointer, const char* field, uintptr_t alignment) {
  MEGAMOE_CHECK(pointer != nullptr, "swiglu_quant_fp8: ", field, " must be non-null");
  MEGAMOE_CHECK(reinterpret_cast<uintptr_t>(pointer) % alignment == 0, "swiglu_quant_fp8: ", field, " must be ",
                alignment, "-byte aligned");
}
}  // namespace

void check_swiglu_quant_fp8_args(const SwigluQuantFp8Args& args) {
  MEGAMOE_CHECK(args.m_capacity >= 1 && args.m_capacity < (int64_t{1} << 31), "swiglu_quant_fp8: m_capacity = ",
                args.m_capacity, " must be in [1, 2^31)");
  MEGAMOE_CHECK(args.num_experts >= 1 && args.num_experts <= 1024, "swiglu_quant_fp8: num_experts = ", args.num_experts,
                " must be in [1, 1024]");
  MEGAMOE_CHECK(args.intermediate > 0 && args.intermediate % 128 == 0, "swiglu_quant_fp8: intermediate = ",
                args.intermediate, " must be a positive multiple of 128");
  MEGAMOE_CHECK(args.m_capacity * 2 * static_cast<int64_t>(args.intermediate) < (int64_t{1} << 62),
                "swiglu_quant_fp8: m_capacity * 2 * intermediate = ", args.m_capacity * 2 * args.intermediate,
                " must be < 2^62");
  check_pointer(args.in, "in", 16);
  check_pointer(args.expert_offsets, "expert_offsets", 16);
  check_pointer(args.out, "out", 16);
  check_pointer(args.out_scales, "out_scales", 16);
  if (args.topk_weights != nullptr)
    MEGAMOE_CHECK(reinterpret_cast<uintptr_t>(args.topk_weights) % 4 == 0,
                  "swiglu_quant_fp8: topk_weights must be 4-byte aligned");
  if (args.activation.kind == Activation::Kind::kSwigluClamped)
    MEGAMOE_CHECK(args.activation.limit > 0.0f, "swiglu_quant_fp8: activation.limit = ", args.activation.limit,
                  " must be > 0");
  else
    MEGAMOE_CHECK(args.activation.kind == Activation::Kind::kSiluMul, "swiglu_quant_fp8: activation.kind = ",
                  static_cast<int>(args.activation.kind), " must be kSiluMul or kSwigluClamped");
}

bool fp8_gemm1_two_pass_from_env() {
  const char* value = std::getenv("MEGAMOE_FP8_GEMM1_TWO_PASS");
  if (value == nullptr || *value == '\0') return false;
  const std::string text(value);
  MEGAMOE_CHECK(text == "0" || text == "1", "MEGAMOE_FP8_GEMM1_TWO_PASS = '", text, "' must be 0 or 1");
  return text == "1";
}

}  // namespace megamoe::kernels
