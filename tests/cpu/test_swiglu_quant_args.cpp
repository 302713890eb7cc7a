// Host checks of the two-pass FP8 GEMM 1 (src/kernels/swiglu_quant.h, swiglu_quant_args.cpp): the argument
// validation's messages and the MEGAMOE_FP8_GEMM1_TWO_PASS switch. No GPU, no CUDA call.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kernels/swiglu_quant.h"
#include "megamoe/error.h"

namespace megamoe {
namespace {

alignas(16) uint8_t g_fake[256];

kernels::SwigluQuantFp8Args good_args() {
  kernels::SwigluQuantFp8Args args;
  args.in = reinterpret_cast<const uint16_t*>(g_fake);
  args.expert_offsets = reinterpret_cast<const int32_t*>(g_fake);
  args.out = g_fake;
  args.out_scales = reinterpret_cast<float*>(g_fake);
  args.m_capacity = 16;
  args.num_experts = 2;
  args.intermediate = 256;
  return args;
}

void expect_rejected(const kernels::SwigluQuantFp8Args& args, const std::string& needle) {
  try {
    kernels::check_swiglu_quant_fp8_args(args);
    ADD_FAILURE() << "accepted; expected an error containing '" << needle << "'";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
  }
}

TEST(SwigluQuantArgs, AcceptsValidArguments) {
  kernels::SwigluQuantFp8Args args = good_args();
  EXPECT_NO_THROW(kernels::check_swiglu_quant_fp8_args(args));
  args.topk_weights = reinterpret_cast<const float*>(g_fake + 4);  // 4-byte alignment is enough
  args.activation = Activation{Activation::Kind::kSwigluClamped, 7.0f, 1.702f};
  args.num_experts = 1024;
  args.m_capacity = (int64_t{1} << 31) - 1;
  EXPECT_NO_THROW(kernels::check_swiglu_quant_fp8_args(args));
}

TEST(SwigluQuantArgs, NamesTheFieldAndTheLimit) {
  auto a = good_args();
  a.intermediate = 0;
  expect_rejected(a, "swiglu_quant_fp8: intermediate = 0 must be a positive multiple of 128");
  a = good_args();
  a.intermediate = 192;
  expect_rejected(a, "intermediate = 192 must be a positive multiple of 128");
  a = good_args();
  a.m_capacity = int64_t{1} << 31;
  expect_rejected(a, "m_capacity = 2147483648 must be in [1, 2^31)");
  a = good_args();
  a.num_experts = 0;
  expect_rejected(a, "num_experts = 0 must be in [1, 1024]");
  a = good_args();
  a.in = nullptr;
  expect_rejected(a, "in must be non-null");
  a = good_args();
  a.out = g_fake + 8;
  expect_rejected(a, "out must be 16-byte aligned");
  a = good_args();
  a.out_scales = nullptr;
  expect_rejected(a, "out_scales must be non-null");
  a = good_args();
  a.expert_offsets = reinterpret_cast<const int32_t*>(g_fake + 4);
  expect_rejected(a, "expert_offsets must be 16-byte aligned");
  a = good_args();
  a.topk_weights = reinterpret_cast<const float*>(g_fake + 1);
  expect_rejected(a, "topk_weights must be 4-byte aligned");
  a = good_args();
  a.activation = Activation{Activation::Kind::kSwigluClamped, -1.0f, 1.702f};
  expect_rejected(a, "activation.limit = -1 must be > 0");
  a = good_args();
  a.activation.kind = static_cast<Activation::Kind>(7);
  expect_rejected(a, "activation.kind = 7 must be kSiluMul or kSwigluClamped");
}

TEST(SwigluQuantArgs, TwoPassEnvironmentSwitch) {
  const char* name = "MEGAMOE_FP8_GEMM1_TWO_PASS";
  unsetenv(name);
  EXPECT_FALSE(kernels::fp8_gemm1_two_pass_from_env());
  ASSERT_EQ(setenv(name, "", 1), 0);
  EXPECT_FALSE(kernels::fp8_gemm1_two_pass_from_env());
  ASSERT_EQ(setenv(name, "0", 1), 0);
  EXPECT_FALSE(kernels::fp8_gemm1_two_pass_from_env());
  ASSERT_EQ(setenv(name, "1", 1), 0);
  EXPECT_TRUE(kernels::fp8_gemm1_two_pass_from_env());
  ASSERT_EQ(setenv(name, "on", 1), 0);
  try {
    kernels::fp8_gemm1_two_pass_from_env();
    ADD_FAILURE() << "MEGAMOE_FP8_GEMM1_TWO_PASS=on accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("MEGAMOE_FP8_GEMM1_TWO_PASS = 'on' must be 0 or 1"), std::string::npos)
        << error.what();
  }
  unsetenv(name);
}

}  // namespace
}  // namespace megamoe
