#include <gtest/gtest.h>

#include "megamoe/error.h"
#include "megamoe/tensor.h"
#include "megamoe/types.h"

using namespace megamoe;

TEST(Types, ParseWeightFormatNormalisesAndRejects) {
  EXPECT_EQ(parse_weight_format("FP8-Block"), WeightFormat::kFp8Block);
  EXPECT_EQ(parse_weight_format("nvfp4"), WeightFormat::kNvfp4);
  try {
    parse_weight_format("int3");
    FAIL() << "expected megamoe::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("int3"), std::string::npos);
  }
}

TEST(Types, CheckTensorNamesFieldAndShape) {
  float data[6];
  const TensorView view = TensorView::make2d(data, DType::kF32, 2, 3, Device::kCpu);
  EXPECT_NO_THROW(check_tensor("hidden", view, DType::kF32, {2, -1}, Device::kCpu));
  try {
    check_tensor("hidden", view, DType::kBF16, {2, 3}, Device::kCpu);
    FAIL() << "expected megamoe::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("hidden"), std::string::npos) << what;
    EXPECT_NE(what.find("bf16 [2, 3]"), std::string::npos) << what;
    EXPECT_NE(what.find("f32 [2, 3]"), std::string::npos) << what;
  }
}
