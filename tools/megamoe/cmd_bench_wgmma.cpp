#include "bench/wgmma_probe_bench.h"
#include "tools/megamoe/command.h"

MEGAMOE_SUBCOMMAND("bench", "wgmma", "wgmma issue-pattern probe: tensor-pipe utilisation of the FP8 GEMM mainloop patterns",
                   [](CLI::App& app) -> std::function<int()> {
                     auto options = std::make_shared<megamoe::bench::WgmmaBenchOptions>();
                     app.add_option("--iterations", options->iterations, "steps (128-K blocks) per warpgroup per launch")
                         ->check(CLI::Range(1, 1 << 26));
                     app.add_option("--repeats", options->repeats, "timed launches per configuration (median)")
                         ->check(CLI::Range(1, 1000));
                     app.add_option("--ctas", options->ctas, "CTAs (0 = one per SM)")->check(CLI::Range(0, 1 << 16));
                     app.add_option("--seed", options->seed, "operand seed");
                     app.add_option("--ceiling", options->ceiling_tflops, "FP8 ceiling in TFLOP/s for the second utilisation");
                     app.add_option("--json", options->json_path, "write results as JSON here");
                     return [options] { return megamoe::bench::run_wgmma_bench(*options); };
                   });
