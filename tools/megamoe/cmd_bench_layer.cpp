// `megamoe bench layer`: one MoE layer forward per (tokens, backend), side by side. See bench/layer_bench.h.
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>

#include "bench/layer_bench.h"
#include "megamoe/ep.h"
#include "megamoe/error.h"
#include "tools/megamoe/command.h"

namespace {

struct LayerArgs {
  std::string preset = "tiny";
  std::optional<int> hidden, intermediate, experts, top_k;
  std::string format = "fp8_block", activation = "silu", routing = "uniform", mega_path = "auto";
  std::vector<int> tokens;
  std::vector<std::string> backends{"reference"};
  int ranks = 1, iters = 5, warmup = 1, distinct_experts = 8, check_tokens = 32;
  bool check = false, apply_topk_in_fc1 = false, floor_only = false;
  std::string json_path;
  uint64_t seed = 1;
};

int run_layer(const LayerArgs& a) {
  using namespace megamoe;
  bench::LayerBenchOptions o;
  o.shape = bench::find_layer_preset(a.preset);
  if (a.hidden || a.intermediate || a.experts || a.top_k) {
    o.shape.name = "custom";
    if (a.hidden) o.shape.hidden = *a.hidden;
    if (a.intermediate) o.shape.intermediate = *a.intermediate;
    if (a.experts) o.shape.experts = *a.experts;
    if (a.top_k) o.shape.top_k = *a.top_k;
  }
  o.format = parse_weight_format(a.format);
  o.activation.kind = parse_activation(a.activation);
  o.apply_topk_in_fc1 = a.apply_topk_in_fc1;
  o.routing = bench::parse_routing_pattern(a.routing);
  o.tokens = a.tokens.empty() ? std::vector<int>{o.shape.name == "tiny" ? 64 : 128} : a.tokens;
  o.backends = a.backends;
  o.ranks = a.ranks;
  o.check = a.check;
  o.check_tokens = a.check_tokens;
  o.iters = a.iters;
  o.warmup = a.warmup;
  o.distinct_experts = a.distinct_experts;
  o.seed = a.seed;
  o.mega_path = a.mega_path;
  auto write_json = [&](const nlohmann::json& j) {
    std::ofstream file(a.json_path);
    MEGAMOE_CHECK(file.good(), "--json ", a.json_path, ": cannot open for writing");
    file << j.dump(2) << "\n";
    std::printf("wrote %s\n", a.json_path.c_str());
  };
  if (a.floor_only) {  // no weights, no backends, no GPUs: the floors a timed run would report
    const std::vector<bench::LayerFloorRow> floors = bench::layer_floors(o);
    bench::print_layer_floors(o, floors);
    if (!a.json_path.empty()) write_json(bench::layer_floors_json(o, floors));
    return 0;
  }
  // Before any process is started: a bad --ranks fails once, here, naming the limit.
  bench::validate_layer_ranks(o);
  // --ranks N > 1: relaunch this command once per GPU; rank 0 prints and writes --json.
  LaunchedRank launched;
  const bool is_rank = launched_rank_from_env(&launched);
  if (a.ranks > 1 && !is_rank) return relaunch_self_on_ranks(a.ranks, 900);
  const bool speak = !is_rank || launched.rank == 0;
  const std::vector<bench::LayerCaseResult> results = bench::run_layer_bench(o);
  if (speak) bench::print_layer_table(o, results);
  if (speak && !a.json_path.empty()) write_json(bench::layer_results_json(o, results));
  for (const bench::LayerCaseResult& r : results)
    if (r.checked && !r.check_passed) return 1;
  return 0;
}

}  // namespace

MEGAMOE_SUBCOMMAND("bench", "layer", "time one MoE layer forward on one or more backends (ratios to the first and to the floor)",
                   [](CLI::App& app) -> std::function<int()> {
                     auto args = std::make_shared<LayerArgs>();
                     app.add_option("--preset", args->preset,
                                    "tiny | dsv3 | ml3 | ms4 | dsv4-flash | qwen3-30b (default tiny)");
                     app.add_option("--hidden", args->hidden, "H (overrides the preset)");
                     app.add_option("--intermediate", args->intermediate, "I per expert (overrides the preset)");
                     app.add_option("--experts", args->experts, "E (overrides the preset)");
                     app.add_option("--top-k", args->top_k, "top-k (overrides the preset)");
                     app.add_option("--format", args->format, "bf16 | fp8_block | nvfp4 | mxfp4 (default fp8_block)");
                     app.add_option("--activation", args->activation, "silu | swiglu_clamped (default silu)");
                     app.add_flag("--apply-topk-in-fc1", args->apply_topk_in_fc1,
                                  "multiply the top-k weight before GEMM 2 (DeepSeek-V4)");
                     app.add_option("--tokens", args->tokens, "tokens per rank, a list (default 64 for tiny, else 128)")
                         ->delimiter(',');
                     app.add_option("--routing", args->routing, "uniform | zipf | one-rank (default uniform)");
                     app.add_option("--backend", args->backends, "backends to run side by side, a list: reference, staged, mega (default reference)")
                         ->delimiter(',');
                     app.add_option("--mega-path", args->mega_path,
                                    "auto | fused | split | both: the path(s) mega rows run (fused kernel, or split = the "
                                    "staged pipeline on mega's weights; both = two rows per token count; default auto)");
                     app.add_option("--ranks", args->ranks, "expert-parallel ranks: one process per GPU via the launcher (default 1)");
                     app.add_flag("--check", args->check, "compare every backend against reference first");
                     app.add_flag("--floor-only", args->floor_only,
                                  "print each token count's floor (compute, weight read, NVLink) on --ranks ranks "
                                  "without running a backend (no GPU needed)");
                     app.add_option("--check-tokens", args->check_tokens, "tokens compared by --check (default 32)");
                     app.add_option("--json", args->json_path, "write the results as JSON to this path");
                     app.add_option("--iters", args->iters, "timed iterations per case (default 5)");
                     app.add_option("--warmup", args->warmup, "untimed iterations per case (default 1)");
                     app.add_option("--distinct-experts", args->distinct_experts,
                                    "random experts generated; expert e uses number e mod this (default 8)");
                     app.add_option("--seed", args->seed, "seed of weights, inputs and routing (default 1)");
                     return [args] { return run_layer(*args); };
                   });
