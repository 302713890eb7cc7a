#include "bench/grouped_gemm_bench.h"
#include "tools/megamoe/command.h"

MEGAMOE_SUBCOMMAND("bench", "gemm", "grouped expert GEMMs (FP8 block, W4A8 or BF16) vs cuBLAS dense on the same FLOPs",
                   [](CLI::App& app) -> std::function<int()> {
                     auto options = std::make_shared<megamoe::bench::GemmBenchOptions>();
                     app.add_option("--models", options->models, "dsv3 ml3 ms4 dsv4-flash qwen3-30b");
                     app.add_option("--rows", options->rows_per_expert, "rows per expert");
                     app.add_option("--experts", options->experts, "experts per rank");
                     app.add_option("--gemms", options->gemms, "which GEMMs to time: 1 (gate/up), 2 (down)")
                         ->check(CLI::IsMember({1, 2}));
                     app.add_option("--repeats", options->repeats, "timed launches per point (median)");
                     app.add_option("--rows-hint", options->rows_hint,
                                    "rows_per_expert_hint for the tile choice (0 = the rows run)");
                     app.add_flag("--no-cublas", options->skip_cublas, "skip the cuBLAS baselines");
                     app.add_option("--format", options->format,
                                    "fp8 or nvfp4 / mxfp4 (W4A8; vs cuBLASLt FP8), bf16 (vs cuBLAS BF16)")
                         ->check(CLI::IsMember({"fp8", "bf16", "nvfp4", "mxfp4"}));
                     app.add_option("--schedule", options->schedule,
                                    "FP8 schedule: auto, serial (v4), pingpong / overlap (v5), all (A/B per point)")
                         ->check(CLI::IsMember({"auto", "serial", "pingpong", "overlap", "all"}));
                     app.add_option("--gemm1-v9", options->gemm1_v9,
                                    "FP8 GEMM 1 kernel: off (split-N, v8c), on (v9, interleaved weights), both "
                                    "(off in the main columns, v9 timed right after it per point)")
                         ->check(CLI::IsMember({"off", "on", "both"}));
                     app.add_option("--v9-skews", options->v9_skews,
                                    "with --gemm1-v9 on/both: v9 skews (k-blocks, 0..4) to time; on: the first");
                     app.add_option("--gemm1-v11", options->gemm1_v11,
                                    "FP8 GEMM 1 v11 (interleaved weights): off, on (main column; needs --gemm1-v9 "
                                    "on), both (v11 timed right after the main column and the v9 rows per point)")
                         ->check(CLI::IsMember({"off", "on", "both"}));
                     app.add_option("--gemm1-v11-small", options->gemm1_v11_small,
                                    "FP8 GEMM 1 v11 small tile (64 x 256, split-N): off, on (every v11 run), both "
                                    "(row v11_small right after the v11 row; needs --gemm1-v11 on or both)")
                         ->check(CLI::IsMember({"off", "on", "both"}));
                     app.add_option("--rows-spread", options->rows_spread,
                                    "rows per expert: none (exactly --rows each) or multinomial (rows x experts rows "
                                    "routed to uniformly drawn experts, fixed seed)")
                         ->check(CLI::IsMember({"none", "multinomial"}));
                     app.add_option("--spread-seed", options->spread_seed, "seed of --rows-spread multinomial");
                     app.add_option("--bf16-v2", options->bf16_v2,
                                    "BF16 kernels (--format bf16): auto (library default), off (v1), on (v2: wide "
                                    "128 x 256 tiles, bulk stores), both (off in the main columns, v2 right after it)")
                         ->check(CLI::IsMember({"auto", "off", "on", "both"}));
                     app.add_option("--fp8-v11", options->fp8_v11,
                                    "FP8 GEMM 2 v11 kernel: auto (MEGAMOE_FP8_GEMM_V11), off, on, both (off in the "
                                    "main columns, v11 timed right after it per point)")
                         ->check(CLI::IsMember({"auto", "off", "on", "both"}));
                     app.add_option("--v11-bn", options->v11_bn,
                                    "v11 tile width: 128 or 192 (0 = MEGAMOE_FP8_GEMM_V11_BN, else 192)")
                         ->check(CLI::IsMember({0, 128, 192}));
                     app.add_option("--gemm1-two-pass", options->gemm1_two_pass,
                                    "FP8 GEMM 1 in two passes: off, both (fused in the main columns; two_pass, "
                                    "two_pass_gemm and two_pass_swiglu timed right after it per point)")
                         ->check(CLI::IsMember({"off", "both"}));
                     app.add_option("--json", options->json_path, "write results as JSON here");
                     return [options] { return megamoe::bench::run_gemm_bench(*options); };
                   });
