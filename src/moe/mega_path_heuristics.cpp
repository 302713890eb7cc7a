// The `mega` backend's per-forward path choice (mega_path_heuristics.h).
#include "moe/mega_path_heuristics.h"

#include <algorithm>
#include <cstdlib>

#include "megamoe/error.h"

namespace megamoe {

const char* mega_path_name(MegaPath path) { return path == MegaPath::kSplit ? "split" : "fused"; }

const char* mega_path_mode_name(MegaPathMode mode) {
  switch (mode) {
    case MegaPathMode::kFused: return "fused";
    case MegaPathMode::kSplit: return "split";
    default: return "auto";
  }
}

MegaPathMode parse_mega_path_mode(std::string_view text, std::string_view field) {
  if (text == "auto") return MegaPathMode::kAuto;
  if (text == "fused") return MegaPathMode::kFused;
  if (text == "split") return MegaPathMode::kSplit;
  MEGAMOE_FAIL(field, " = '", text, "' must be one of auto, fused, split");
}

MegaPathMode mega_path_mode_from_env_value(const char* value) {
  return value == nullptr || *value == 0 ? MegaPathMode::kAuto : parse_mega_path_mode(value, "MEGAMOE_MEGA_PATH");
}

MegaPathMode mega_path_mode_from_env() {
  static const MegaPathMode mode = mega_path_mode_from_env_value(std::getenv("MEGAMOE_MEGA_PATH"));
  return mode;
}

int64_t mega_rows_per_local_expert(int64_t tokens, int top_k, int local_experts) {
  return std::max<int64_t>(0, tokens) * std::max(1, top_k) / std::max(1, local_experts);
}

int64_t mega_agreed_tokens(int ranks, int64_t tokens, int64_t max_tokens_any_rank, int64_t capacity) {
  if (ranks <= 1) return tokens;
  if (max_tokens_any_rank >= 0) return max_tokens_any_rank;
  (void)capacity;  // not a per-step size: see the header's NOTES
  return 0;        // the fused kernel
}

int64_t mega_fused_max_rows_per_expert(bool w4a8_weights) {
  return w4a8_weights ? kMegaFusedMaxRowsPerExpertW4a8 : kMegaFusedMaxRowsPerExpert;
}

MegaPath choose_mega_path(MegaPathMode mode, int64_t agreed_tokens, int top_k, int local_experts,
                          int64_t fused_max_rows) {
  if (mode == MegaPathMode::kFused) return MegaPath::kFused;
  if (mode == MegaPathMode::kSplit) return MegaPath::kSplit;
  if (agreed_tokens <= 0) return MegaPath::kFused;
  return mega_rows_per_local_expert(agreed_tokens, top_k, local_experts) <= fused_max_rows ? MegaPath::kFused
                                                                                          : MegaPath::kSplit;
}

bool mega_split_reachable(MegaPathMode mode, int64_t capacity, int top_k, int local_experts, int64_t fused_max_rows) {
  // The agreed count never exceeds the capacity (forward checks max_tokens_any_rank against it), and
  // the heuristic is monotone in it.
  return choose_mega_path(mode, capacity, top_k, local_experts, fused_max_rows) == MegaPath::kSplit;
}

}  // namespace megamoe
