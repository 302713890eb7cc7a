// Backend registry: every backend registers itself, by name, from its own source file, so adding a
// backend never edits a shared file:
//
//   // src/backends/staged/staged_backend.cpp
//   MEGAMOE_REGISTER_BACKEND(megamoe::backends::BackendEntry{
//       .name = "staged",
//       .capabilities = [] { return staged_capabilities(); },
//       .unavailable_reason = [] { return std::string(); },  // e.g. "no CUDA device visible"
//       .create = [](const MoeConfig& c, EpGroup* ep, std::shared_ptr<MoeWorkspace> ws)
//                     -> std::unique_ptr<MoeBackend> { ... },   // ws may be null: no sharing
//   });
//
// NOTES: registration runs during static initialisation of libmegamoe, which is a SHARED library for
// this reason (a static archive would drop object files that nothing references, and with them their
// registrations). make_backend() checks Capabilities::reject_reason() before calling `create`.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "megamoe/moe.h"

namespace megamoe::backends {

struct BackendEntry {
  std::string name;  // canonical name, lower case with '_' (see normalize_backend_name)
  std::function<Capabilities()> capabilities;
  // Empty when the backend can be created in this process; else why not ("no CUDA device visible").
  std::function<std::string()> unavailable_reason;
  std::function<std::unique_ptr<MoeBackend>(const MoeConfig&, EpGroup*, std::shared_ptr<MoeWorkspace>)> create;
};

void register_backend(BackendEntry entry);
// Registered entries, sorted by name.
std::vector<BackendEntry> registered_backends();

struct BackendRegistrar {
  explicit BackendRegistrar(BackendEntry entry) { register_backend(std::move(entry)); }
};

}  // namespace megamoe::backends

#define MEGAMOE_BACKEND_CONCAT_INNER(a, b) a##b
#define MEGAMOE_BACKEND_CONCAT(a, b) MEGAMOE_BACKEND_CONCAT_INNER(a, b)
#define MEGAMOE_REGISTER_BACKEND(...)                                                         \
  static ::megamoe::backends::BackendRegistrar MEGAMOE_BACKEND_CONCAT(megamoe_backend_, __LINE__)( \
      __VA_ARGS__)
