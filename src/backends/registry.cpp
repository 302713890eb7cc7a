// MoeConfig validation, capability checks and the backend registry behind make_backend().
#include "backends/registry.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <mutex>
#include <sstream>

#include "megamoe/error.h"
#include "megamoe/moe.h"

namespace megamoe {
namespace {

// Names every build knows about, whether or not their backend is compiled in, so that an error can
// say "not built" rather than "unknown".
struct KnownBackend {
  const char* name;
  const char* when_missing;  // why it may be absent from the registry
};
constexpr KnownBackend kKnownBackends[] = {
    {"reference", "always built; its registration did not run (libmegamoe linked statically?)"},
    {"staged", "not built in this binary (needs MEGAMOE_ENABLE_CUDA=ON and the staged backend sources)"},
    {"mega", "not built in this binary (needs MEGAMOE_ENABLE_CUDA=ON and the mega backend sources)"},
};

struct Registry {
  std::mutex mutex;
  std::vector<backends::BackendEntry> entries;
};
Registry& registry() {
  static Registry instance;  // constructed on first use: safe from any static initialiser
  return instance;
}

const char* missing_reason(const std::string& name) {
  for (const KnownBackend& known : kKnownBackends)
    if (name == known.name) return known.when_missing;
  return nullptr;
}

// Multiple of `step` check for the dimension fields of MoeConfig.
void check_dimension(const char* field, int value, int step, const MoeConfig& config) {
  MEGAMOE_CHECK(value > 0 && value % step == 0, field, " = ", value, " must be a positive multiple of ", step,
                " for weight_format ", weight_format_name(config.weight_format));
}

template <typename T>
bool contains(const std::vector<T>& values, T value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

}  // namespace

void MoeConfig::validate() const {
  // FP8 activations are quantized per 128 channels and FP8 block weights are 128x128 blocks, so
  // every K and N of both GEMMs is a multiple of 128. BF16 rows must be 16-byte aligned (TMA).
  const int step = uses_fp8_activations(weight_format) ? 128 : 8;
  check_dimension("hidden", hidden, step, *this);
  check_dimension("intermediate", intermediate, step, *this);
  MEGAMOE_CHECK(num_experts > 0, "num_experts = ", num_experts, " must be > 0");
  MEGAMOE_CHECK(top_k >= 1 && top_k <= num_experts, "top_k = ", top_k, " must be in [1, num_experts = ", num_experts,
                "]");
  MEGAMOE_CHECK(shared_intermediate >= 0, "shared_intermediate = ", shared_intermediate, " must be >= 0 (0 = none)");
  if (shared_intermediate > 0) check_dimension("shared_intermediate", shared_intermediate, step, *this);
  MEGAMOE_CHECK(max_tokens_per_rank >= 1, "max_tokens_per_rank = ", max_tokens_per_rank, " must be >= 1");
  if (activation.kind == Activation::Kind::kSwigluClamped) {
    MEGAMOE_CHECK(std::isfinite(activation.limit) && activation.limit > 0.0f, "activation.limit = ", activation.limit,
                  " must be finite and > 0 for swiglu_clamped");
    MEGAMOE_CHECK(std::isfinite(activation.alpha) && activation.alpha > 0.0f, "activation.alpha = ", activation.alpha,
                  " must be finite and > 0 for swiglu_clamped");
  }
}

std::string Capabilities::reject_reason(const MoeConfig& config, int num_ranks) const {
  std::vector<std::string> reasons;
  if (!contains(formats, config.weight_format)) {
    std::string supported;
    for (WeightFormat f : formats) supported += (supported.empty() ? "" : ", ") + std::string(weight_format_name(f));
    reasons.push_back("weight_format " + std::string(weight_format_name(config.weight_format)) +
                      " is not supported (supported: " + supported + ")");
  }
  if (!contains(activations, config.activation.kind)) {
    std::string supported;
    for (Activation::Kind a : activations) supported += (supported.empty() ? "" : ", ") + std::string(activation_name(a));
    reasons.push_back("activation " + std::string(activation_name(config.activation.kind)) +
                      " is not supported (supported: " + supported + ")");
  }
  if (num_ranks < min_ranks || num_ranks > max_ranks)
    reasons.push_back("ranks = " + std::to_string(num_ranks) + " must be in [" + std::to_string(min_ranks) + ", " +
                      std::to_string(max_ranks) + "]");
  if (num_ranks > 0 && config.num_experts % num_ranks != 0)
    reasons.push_back("num_experts = " + std::to_string(config.num_experts) + " must be divisible by ranks = " +
                      std::to_string(num_ranks));
  if (config.apply_topk_in_fc1 && !supports_apply_topk_in_fc1) reasons.push_back("apply_topk_in_fc1 is not supported");
  if (config.shared_intermediate > 0 && !supports_shared_expert)
    reasons.push_back("a shared expert (shared_intermediate = " + std::to_string(config.shared_intermediate) +
                      ") is not supported");
  std::string joined;
  for (const std::string& r : reasons) joined += (joined.empty() ? "" : "; ") + r;
  return joined;
}

std::string normalize_backend_name(std::string_view name) {
  std::string n(name);
  for (char& c : n) c = c == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (n == "ref" || n == "cpu") return "reference";
  if (n == "unfused") return "staged";
  if (n == "megamoe" || n == "fused") return "mega";
  return n;
}

namespace backends {
void register_backend(BackendEntry entry) {
  entry.name = normalize_backend_name(entry.name);
  MEGAMOE_CHECK(!entry.name.empty() && entry.create, "register_backend: a backend needs a name and a create function");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const BackendEntry& existing : r.entries)
    MEGAMOE_CHECK(existing.name != entry.name, "register_backend: backend '", entry.name, "' is registered twice");
  r.entries.push_back(std::move(entry));
}

std::vector<BackendEntry> registered_backends() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<BackendEntry> out = r.entries;
  std::sort(out.begin(), out.end(), [](const BackendEntry& a, const BackendEntry& b) { return a.name < b.name; });
  return out;
}
}  // namespace backends

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const backends::BackendEntry& entry : backends::registered_backends()) names.push_back(entry.name);
  return names;
}

std::unique_ptr<MoeBackend> make_backend(std::string_view name, const MoeConfig& config, EpGroup* ep,
                                         std::shared_ptr<MoeWorkspace> workspace) {
  const std::string canonical = normalize_backend_name(name);
  const std::vector<backends::BackendEntry> entries = backends::registered_backends();
  auto describe_all = [&] {
    std::ostringstream s;
    s << "known backends: ";
    bool first = true;
    for (const backends::BackendEntry& entry : entries) {
      const std::string why = entry.unavailable_reason ? entry.unavailable_reason() : std::string();
      s << (first ? "" : ", ") << entry.name << (why.empty() ? " (available)" : " (unavailable: " + why + ")");
      first = false;
    }
    for (const KnownBackend& known : kKnownBackends) {
      const bool registered = std::any_of(entries.begin(), entries.end(),
                                          [&](const backends::BackendEntry& e) { return e.name == known.name; });
      if (!registered) s << (first ? "" : ", ") << known.name << " (" << known.when_missing << ")", first = false;
    }
    return s.str();
  };
  auto found = std::find_if(entries.begin(), entries.end(),
                            [&](const backends::BackendEntry& e) { return e.name == canonical; });
  if (found == entries.end()) {
    const char* missing = missing_reason(canonical);
    if (missing != nullptr) MEGAMOE_FAIL("backend '", name, "' is ", missing, "; ", describe_all());
    MEGAMOE_FAIL("backend '", name, "' is unknown; ", describe_all());
  }
  const std::string unavailable = found->unavailable_reason ? found->unavailable_reason() : std::string();
  MEGAMOE_CHECK(unavailable.empty(), "backend '", canonical, "' is unavailable: ", unavailable, "; ", describe_all());
  config.validate();
  // EpGroup is opaque here (ep.h belongs to the EP runtime): with a group, everything but the rank
  // count is checked here, and the backend's `create` checks the group size against its capabilities.
  const Capabilities capabilities = found->capabilities();
  const std::string reject = capabilities.reject_reason(config, ep == nullptr ? 1 : capabilities.min_ranks);
  MEGAMOE_CHECK(reject.empty(), "backend '", canonical, "' cannot run this configuration: ", reject);
  return found->create(config, ep, std::move(workspace));
}

}  // namespace megamoe
