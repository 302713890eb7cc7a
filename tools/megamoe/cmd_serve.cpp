// `megamoe serve MODEL`: the OpenAI-compatible server (flags shaped like `vllm serve`). One model
// runner per data-parallel rank, the serving loop in server/llm_engine.h, HTTP in
// server/openai_server.h. This build runs the CPU reference runner (engine/model.h).
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "engine/cli_options.h"
#include "engine/config.h"
#include "engine/model.h"
#include "megamoe/cpu_ep.h"
#include "megamoe/ep.h"
#include "megamoe/error.h"
#include "megamoe/moe.h"
#include "megamoe/types.h"
#include "server/openai_server.h"
#include "server/worker_process.h"
#include "tools/megamoe/command.h"

namespace {

struct ServeFlags {
  megamoe::engine::EngineCliOptions engine;  // MODEL, --moe-backend, --load-format, --seed, --block-size, ...
  bool kv_blocks_given = false;               // --num-kv-blocks on the command line
  std::string served_model_name, host = "127.0.0.1", tokenizer;
  int port = 8000, data_parallel_size = 1, max_model_len = 0, max_num_seqs = 256;
  int max_queued_requests = 4096, http_threads = 512;
  bool enable_expert_parallel = false;
  bool worker_processes = false;              // one worker process per rank (server/worker_process.h)
  int worker_start_timeout_s = 600;
};

// The command line of this process, to start its workers with (they see kServeWorkerSocketEnv).
std::vector<std::string> own_command_line() {
  std::vector<std::string> argv{std::filesystem::read_symlink("/proc/self/exe").string()};
  std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);
  std::string arg;
  for (bool first = true; std::getline(cmdline, arg, '\0'); first = false)
    if (!first) argv.push_back(arg);
  return argv;
}

// Worker side of --worker-processes: builds rank r's runner (bootstrapping the GPU EP group when
// expert parallel on the GPU) and serves its steps until the front-end says stop or goes away.
int run_worker(const ServeFlags& f, megamoe::engine::RunnerOptions runner_options, const std::string& device,
               const char* socket_path) {
  megamoe::LaunchedRank launched;
  MEGAMOE_CHECK(megamoe::launched_rank_from_env(&launched), "serve worker: ", megamoe::kEpRankEnv, " / ",
                megamoe::kEpRanksEnv, " / ", megamoe::kEpRendezvousEnv, " not set (workers are started by serve)");
  MEGAMOE_CHECK(launched.ranks == f.data_parallel_size, "serve worker: launched with ", launched.ranks,
                " ranks but --data-parallel-size is ", f.data_parallel_size);
  runner_options.load.progress = launched.rank == 0;
  runner_options.ep_rank = launched.rank;
  runner_options.cuda_device = launched.rank;
#ifdef MEGAMOE_WITH_CUDA
  std::unique_ptr<megamoe::EpGroup> group;
  if (f.enable_expert_parallel && f.data_parallel_size > 1 && device == "cuda") {
    group = megamoe::EpGroup::bootstrap(launched.rank, launched.ranks, launched.rendezvous);
    runner_options.ep = group.get();
  }
#else
  (void)device;
#endif
  auto runner = megamoe::engine::make_model_runner(f.engine.model, runner_options);
  megamoe::server::serve_worker_steps(*runner, socket_path);
  return 0;
}

int run(const ServeFlags& f) {
  const char* worker_socket = std::getenv(megamoe::server::kServeWorkerSocketEnv);
  // SIGINT / SIGTERM stop the server cleanly: blocked before any thread starts (threads inherit the
  // mask), then taken by one waiting thread.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  // A worker ends when the front-end closes its socket (or dies: PR_SET_PDEATHSIG), not on signals.
  if (!worker_socket) pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  MEGAMOE_CHECK(f.data_parallel_size >= 1, "--data-parallel-size ", f.data_parallel_size, " must be >= 1");
  const std::string backend = megamoe::normalize_backend_name(f.engine.runner.moe_backend);
  const std::string device = megamoe::engine::resolve_runner_device(f.engine.runner);
  const bool expert_parallel = f.enable_expert_parallel && f.data_parallel_size > 1;
  // NOTES: the GPU runner's expert parallelism needs one process per GPU (EpGroup, src/ep/launcher.cpp);
  // serve runs its ranks as threads of one process, so it does GPU DP without EP only.
  MEGAMOE_CHECK(!expert_parallel || device == "cpu" || f.worker_processes, "--enable-expert-parallel with --data-parallel-size ",
                f.data_parallel_size, " on the GPU (--moe-backend ", f.engine.runner.moe_backend,
                ") needs one process per GPU: add --worker-processes (not yet verified on GPUs), use `megamoe generate` "
                "for GPU DP+EP, or serve GPU DP without --enable-expert-parallel, or the CPU reference backend");
  // NOTES: the CPU runner's expert parallelism is an in-process group (CpuEpGroup): it cannot span
  // worker processes.
  MEGAMOE_CHECK(!expert_parallel || device == "cuda" || !f.worker_processes, "--worker-processes with "
                "--enable-expert-parallel needs the GPU runner: the CPU runner shards experts over in-process ranks only");
  MEGAMOE_CHECK(!expert_parallel || f.worker_processes || backend == "reference" || backend == "reference_fp32",
                "--enable-expert-parallel with --data-parallel-size ", f.data_parallel_size, " and --moe-backend ",
                f.engine.runner.moe_backend, ": the CPU runner shards experts over in-process ranks with --moe-backend "
                "reference only");
  const bool cpu_expert_parallel = expert_parallel && !f.worker_processes;
  const std::string& model = f.engine.model;
  auto tokenizer = megamoe::server::Tokenizer::from_file(f.tokenizer.empty() ? model : f.tokenizer);
  megamoe::engine::RunnerOptions runner_options = f.engine.resolve();
  if (!f.kv_blocks_given && device == "cpu") {
    // NOTES: the CPU runner's cache lives in host memory; by default it holds four sequences of the
    // full context (the scheduler preempts beyond that), not a GPU-sized pool.
    const int context = f.max_model_len > 0 ? f.max_model_len
                                            : megamoe::engine::load_model_config(model, runner_options.hf_overrides)
                                                  .max_position_embeddings;
    runner_options.num_kv_blocks = 4 * ((std::max(context, 1) + runner_options.kv_block_size - 1) / runner_options.kv_block_size);
  }
  if (worker_socket) return run_worker(f, runner_options, device, worker_socket);
  std::vector<std::unique_ptr<megamoe::engine::ModelRunner>> runners;
  // DP + EP on the CPU: the ranks are threads of this process sharing one in-process EP group; the
  // engine steps them in lockstep (empty steps for idle ranks).
  if (cpu_expert_parallel) runner_options.cpu_ep = std::make_shared<megamoe::CpuEpGroup>(f.data_parallel_size);
  // --worker-processes: each rank's runner in a process of its own, stepped over a Unix socket.
  if (f.worker_processes)
    runners = megamoe::server::start_worker_processes(f.data_parallel_size, own_command_line(), f.worker_start_timeout_s);
  for (int rank = 0; rank < f.data_parallel_size && !f.worker_processes; ++rank) {
    runner_options.load.progress = rank == 0;
    runner_options.ep_rank = rank;
    runner_options.cuda_device = rank;  // GPU DP: one device per rank
    runners.push_back(megamoe::engine::make_model_runner(model, runner_options));
  }
  const auto& info = runners.front()->info();
  // What the runners (or their workers) report, not what was asked.
  const int kv_blocks = runners.front()->num_kv_blocks(), kv_block_size = runners.front()->kv_block_size();

  megamoe::server::EngineOptions engine_options;
  engine_options.max_num_seqs = f.max_num_seqs;
  engine_options.max_num_batched_tokens = runner_options.max_tokens_per_step;  // --max-num-batched-tokens
  engine_options.max_model_len = f.max_model_len;
  engine_options.max_queued_requests = f.max_queued_requests;
  engine_options.seed = runner_options.load.seed;
  engine_options.lockstep_ranks = f.enable_expert_parallel;  // EP: every rank joins every forward
  megamoe::server::ServerMetrics metrics;
  megamoe::server::LLMEngine engine(std::move(runners), tokenizer, engine_options, &metrics);

  megamoe::server::HttpOptions http_options;
  http_options.host = f.host;
  http_options.port = f.port;
  http_options.served_model_names = {f.served_model_name.empty() ? model : f.served_model_name};
  http_options.http_threads = f.http_threads;

  megamoe::server::OpenAIServer server(engine, metrics, http_options);
  const int port = server.bind();
  std::atomic<bool> signalled{false};
  std::thread signal_waiter([&] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    signalled = true;
    std::fprintf(stderr, "megamoe serve: signal %d, stopping\n", signal);
    server.stop();
  });
  std::fprintf(stderr,
               "megamoe serve: %s (%s, vocab %d) as '%s' on http://%s:%d | runner %s, moe backend %s, "
               "dp %d%s | max_model_len %d, max_num_seqs %d, max_num_batched_tokens %d, kv %d blocks x %d%s\n",
               model.c_str(), info.model_type.c_str(), info.vocab_size, http_options.served_model_names[0].c_str(),
               f.host.c_str(), port, device.c_str(), runner_options.moe_backend.c_str(), f.data_parallel_size,
               f.worker_processes ? " (worker processes)" : "", engine.max_model_len(),
               f.max_num_seqs, engine_options.max_num_batched_tokens, kv_blocks,
               kv_block_size,
               runner_options.enforce_eager ? " | enforce-eager" : "");
  server.serve();
  // serve() also returns when the socket fails; then wake the signal thread so it can be joined.
  if (!signalled) pthread_kill(signal_waiter.native_handle(), SIGTERM);
  signal_waiter.join();
  return 0;
}

}  // namespace

MEGAMOE_SUBCOMMAND("", "serve", "OpenAI-compatible server: megamoe serve MODEL_DIR [vLLM-shaped flags]",
                   [](CLI::App& app) -> std::function<int()> {
                     auto f = std::make_shared<ServeFlags>();
                     f->engine.runner.max_tokens_per_step = 8192;
                     megamoe::engine::add_engine_options(app, f->engine);
                     app.add_option("--served-model-name", f->served_model_name, "name clients use (default: MODEL)");
                     app.add_option("--host", f->host, "address to listen on")->capture_default_str();
                     app.add_option("--port", f->port, "port (0: any free one)")->capture_default_str();
                     app.add_option("--data-parallel-size", f->data_parallel_size, "model replicas (ranks)")->capture_default_str();
                     app.add_flag("--enable-expert-parallel", f->enable_expert_parallel, "shard experts over the ranks");
                     app.add_option("--max-model-len", f->max_model_len, "context limit (default: the model's)");
                     app.add_option("--max-num-seqs", f->max_num_seqs, "running sequences per rank")->capture_default_str();
                     app.add_option("--tokenizer", f->tokenizer, "tokenizer.json or its directory (default: MODEL)");
                     app.add_option("--max-queued-requests", f->max_queued_requests, "requests in the engine before 503")->capture_default_str();
                     app.add_flag("--worker-processes", f->worker_processes,
                                  "run each data-parallel rank's model in a worker process of its own (needed for GPU DP+EP)");
                     app.add_option("--worker-start-timeout", f->worker_start_timeout_s,
                                    "seconds a worker may take to load and connect")->capture_default_str();
                     app.add_option("--http-threads", f->http_threads, "connections served at once")->capture_default_str();
                     CLI::Option* kv_blocks = app.get_option("--num-kv-blocks");
                     return [f, kv_blocks] {
                       f->kv_blocks_given = kv_blocks->count() > 0;
                       return run(*f);
                     };
                   });
