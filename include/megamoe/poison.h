#pragma once

#include <cstddef>
#include <cstdint>

#include "megamoe/moe.h"

namespace megamoe {
// Fills `bytes` of device memory with `byte` (default 0xFF: NaN in bf16, fp32 and e4m3) on `stream`.
void poison_device_buffer(void* data, size_t bytes, uint8_t byte = 0xFF, StreamHandle stream = nullptr);
}  // namespace megamoe
