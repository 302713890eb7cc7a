// Decoding of the CUDA routers' device error word (routing_cuda.h). Plain C++ so that CPU-only
// builds (and the kernel's CPU emulation test) have it too.
#include <cstdint>
#include <ios>
#include <string>

#include "megamoe/error.h"
#include "megamoe/routing_cuda.h"

namespace megamoe {

std::string describe_router_status(uint64_t status, const RouterConfig& config, int64_t hash_vocab) {
  if (status == kRouterStatusOk) return "";
  const int64_t token = static_cast<int64_t>(status >> 32);
  const auto error = static_cast<RouterDeviceError>((status >> 28) & 0xF);
  const int64_t index = static_cast<int64_t>(status & 0x0fffffff);
  switch (error) {
    case RouterDeviceError::kBadCorrectionBias:
      return detail::concat("router correction_bias[", index, "] must be finite (all ", config.num_experts,
                            " entries); every row was routed to ids -1, weights 0");
    case RouterDeviceError::kPositiveInfLogit:
      return detail::concat("router logits[", token, ", ", index,
                            "] = +inf; logits must be finite, -inf or NaN (the row was routed to ids -1, weights 0)");
    case RouterDeviceError::kTokenIdOutOfRange:
      return detail::concat("router token_ids[", token, "] must be in [0, hash_vocab = ", hash_vocab,
                            ") (the row was routed to ids -1, weights 0)");
    case RouterDeviceError::kHashEntryOutOfRange:
      return detail::concat("router hash_table[token_ids[", token, "], ", index, "] must be in [0, num_experts = ",
                            config.num_experts, ") (the row was routed to ids -1, weights 0)");
  }
  return detail::concat("router status word 0x", std::hex, status, " is not a known error");
}

}  // namespace megamoe
