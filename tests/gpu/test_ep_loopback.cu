// EP with 2..8 ranks on ONE GPU: in-process ranks (EpGroup::loopback), one host thread and one SM partition
// (green-context stream) per rank. The kernels, the protocol (counters, progress words, epochs, bounded waits) and the
// staged layer run exactly as across GPUs; only the "remote" stores land in the same HBM. So the multi-rank suites'
// bodies (common/ep_harness.h run_*_suite, shared with tests/multigpu) run on one-GPU machines, at rank counts the
// lent machines do not have (3, 4, 8). Nothing here measures NVLink.
// Each test re-runs itself in a child process with CUDA_MODULE_LOADING=EAGER and CUDA_DEVICE_MAX_CONNECTIONS=32
// (megamoe/ep.h, EpLoopbackFabric NOTES: a lazily loaded kernel, or one queued behind another rank's kernel, may wait
// while a peer rank's kernel waits for it).
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/ep_harness.h"
#include "common/gpu_stream.h"
#include "common/scoped_overrides.h"
#include "ep/transport.h"
#include "src/common/sm_partition.h"

namespace megamoe::testing {
namespace {

constexpr const char* kLoopbackChildEnv = "MEGAMOE_LOOPBACK_CHILD";

// In the parent: runs the current test again in a child process with eager module loading and returns true.
bool rerun_eager_if_parent() {
  const char* child = std::getenv(kLoopbackChildEnv);
  if (child != nullptr && std::string(child) == "1") return false;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string filter = std::string("--gtest_filter=") + info->test_suite_name() + "." + info->name();
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  ScopedEnv eager("CUDA_MODULE_LOADING", "EAGER");
  // One hardware work queue per stream (8 ranks: 8 rank streams + 8 group setup streams + the legacy one): with the
  // default 8 queues a rank's kernel could wait in a queue behind another rank's kernel that waits for it (seen at 8
  // ranks: a send kernel started only after its peers' bounded waits for it had expired).
  ScopedEnv connections("CUDA_DEVICE_MAX_CONNECTIONS", "32");
  ScopedEnv marker(kLoopbackChildEnv, "1");
  const int rc = launch_ranks(1, {self, filter}, test_launch_timeout_s());
  EXPECT_EQ(rc, 0) << info->name() << " failed in its child process (exit status " << rc << "); see its output above";
  return true;
}

// Runs `body` on `ranks` in-process ranks of GPU 0, one thread each, each on its own SM partition; a rank's
// exception becomes a test failure naming the rank (the others then end in their bounded rendezvous).
void run_loopback_ranks(int ranks, const std::function<void(EpGroup&, cudaStream_t)>& body, EpOptions options = {}) {
  detail::SmPartitionStreams partitions(0, ranks);
  if (!partitions.fallback().empty())
    std::printf("[loopback] no SM partitions (%s): the %d ranks share every SM\n", partitions.fallback().c_str(), ranks);
  else
    std::printf("[loopback] %d ranks, %d SMs each\n", ranks, partitions.sm_count(0));
  auto fabric = make_ep_loopback_fabric(ranks, 0);
  std::mutex failures_mutex;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        MEGAMOE_CUDA_CHECK(cudaSetDevice(0));
        auto group = EpGroup::loopback(fabric, r, options);
        EXPECT_EQ(group->rank(), r);
        EXPECT_EQ(group->size(), ranks);
        body(*group, partitions.stream(r));
        group->destroy();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(failures_mutex);
        failures.push_back("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& f : failures) ADD_FAILURE() << f;
  const std::string overflow = check_ep_loopback_guards(*fabric);
  EXPECT_TRUE(overflow.empty()) << overflow;
}

#define MEGAMOE_LOOPBACK_TEST_START()                 \
  MEGAMOE_REQUIRE_GPUS(1);                            \
  if (rerun_eager_if_parent()) return;                \
  static_assert(true, "")

class EpLoopback : public ::testing::TestWithParam<int> {};

TEST_P(EpLoopback, DispatchCombineBitExact) {
  MEGAMOE_LOOPBACK_TEST_START();
  run_loopback_ranks(GetParam(), [](EpGroup& group, cudaStream_t stream) {
    group.warmup(stream);
    run_dispatch_combine_suite(group, stream);
  });
}

TEST_P(EpLoopback, DispatchCombineBitExactTwoKernel) {
  MEGAMOE_LOOPBACK_TEST_START();
  ScopedEnv two_kernel("MEGAMOE_EP_OVERLAP", "0");
  run_loopback_ranks(GetParam(), [](EpGroup& group, cudaStream_t stream) {
    group.warmup(stream);
    run_dispatch_combine_suite(group, stream);
  });
}

// run_overlap_comparison switches the dispatcher knobs with ScopedEnv in every rank thread. All ranks write the same
// values in the same order (each dispatcher's creation is a rendezvous), but a setenv that ADDS a variable may
// reallocate `environ` under another thread's getenv: so every knob exists (empty = unset) before the threads start,
// and their writes only replace values.
struct EpKnobsPreset {
  std::vector<std::unique_ptr<ScopedEnv>> knobs;
  EpKnobsPreset() {
    for (const char* name : {"MEGAMOE_EP_OVERLAP", "MEGAMOE_EP_OVERLAP_DISPATCH", "MEGAMOE_EP_COMBINE_LAG",
                             "MEGAMOE_EP_DISPATCH_PIECE", "MEGAMOE_EP_DISPATCH_SEND_WARPS"}) {
      const char* value = std::getenv(name);
      knobs.push_back(std::make_unique<ScopedEnv>(name, value ? value : ""));
    }
  }
};

TEST_P(EpLoopback, OverlapMatchesTwoKernelPath) {
  MEGAMOE_LOOPBACK_TEST_START();
  EpKnobsPreset preset;
  run_loopback_ranks(GetParam(), [](EpGroup& group, cudaStream_t stream) {
    group.warmup(stream);
    run_overlap_suite(group, stream);
  });
}

TEST_P(EpLoopback, StagedMatchesReferenceAndReplays) {
  MEGAMOE_LOOPBACK_TEST_START();
  run_loopback_ranks(GetParam(), [](EpGroup& group, cudaStream_t stream) { run_staged_suite(group, stream); });
}

TEST_P(EpLoopback, StagedMatchesReferenceAndReplaysTwoKernel) {
  MEGAMOE_LOOPBACK_TEST_START();
  ScopedEnv two_kernel("MEGAMOE_EP_OVERLAP", "0");
  run_loopback_ranks(GetParam(), [](EpGroup& group, cudaStream_t stream) { run_staged_suite(group, stream); });
}

// mega: the persistent kernel on each rank's SM partition (its grid = the partition's SMs, MegaBackend::fused_grid),
// the multi-GPU suites' bodies (run_mega_*): vs the reference on every routing, bit for bit vs staged on one rank
// holding every expert, graph replay, repeats; then the split path, many GEMM-2 tiles per CTA, and token counts that
// change every call.
TEST_P(EpLoopback, MegaMatchesReferenceOnEveryRouting) {
  MEGAMOE_LOOPBACK_TEST_START();
  run_loopback_ranks(GetParam(), [](EpGroup& group, cudaStream_t stream) {
    run_mega_routing_suite(group, stream, WeightFormat::kFp8Block);
  });
}

TEST_P(EpLoopback, MegaBf16AndW4a8MatchReferenceOnEveryRouting) {
  MEGAMOE_LOOPBACK_TEST_START();
  run_loopback_ranks(GetParam(), [](EpGroup& group, cudaStream_t stream) {
    for (WeightFormat format : {WeightFormat::kBf16, WeightFormat::kNvfp4, WeightFormat::kMxfp4})
      run_mega_routing_suite(group, stream, format);
  });
}

TEST_P(EpLoopback, MegaSplitPathAndManyGemm2TilesPerCta) {
  MEGAMOE_LOOPBACK_TEST_START();
  run_loopback_ranks(GetParam(), [](EpGroup& group, cudaStream_t stream) {
    for (WeightFormat format : {WeightFormat::kFp8Block, WeightFormat::kNvfp4}) {
      run_mega_routing_suite(group, stream, format, "mega[split]");
      run_mega_many_gemm2_tiles(group, stream, format);
    }
  });
}

TEST_P(EpLoopback, MegaChangingTokenCountsEveryCall) {
  MEGAMOE_LOOPBACK_TEST_START();
  run_loopback_ranks(GetParam(), [](EpGroup& group, cudaStream_t stream) {
    for (const char* name : {"mega[fused]", "mega[split]", "mega[auto]"})
      run_mega_token_sequence(group, stream, WeightFormat::kFp8Block, name);
    run_mega_token_sequence(group, stream, WeightFormat::kNvfp4, "mega[fused]");
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, EpLoopback, ::testing::Values(2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& info) { return std::to_string(info.param) + "ranks"; });

// The last rank never combines: every other rank's combine() ends in a bounded-wait error naming itself, the
// collective and the missing rank, within the group's bound.
TEST(EpLoopbackErrors, StalledPeerInCombineTimesOutWithItsName) {
  MEGAMOE_LOOPBACK_TEST_START();
  constexpr int kRanks = 3;
  EpOptions options;
  options.wait_timeout_ns = 500ull * 1000 * 1000;
  run_loopback_ranks(
      kRanks,
      [](EpGroup& group, cudaStream_t stream) {
        const int stalled = group.size() - 1, experts = experts_for_ranks(4, group.size());
        EpDispatcher io(group, EpDispatchConfig{256, 2, experts, 16, EpPayload::kFp8});
        const RankInputs in = make_rank_inputs(4, group.rank(), 16, 256, experts, 2, group.size(), Routing::kUniform);
        DeviceInputs dev(in, 256, 2);
        io.dispatch(dev.hidden_view(), dev.ids_view(), dev.weights_view(), stream);
        group.synchronize(stream);
        if (group.rank() == stalled) return;
        void* y = nullptr;
        MEGAMOE_CUDA_CHECK(cudaMalloc(&y, std::max<int64_t>(io.received().max_rows, 1) * 256 * 2));
        const auto start = std::chrono::steady_clock::now();
        try {
          io.combine(y, dev.out_view(), stream);
          group.synchronize(stream);
          ADD_FAILURE() << "rank " << group.rank() << ": combine with a stalled peer returned without an error";
        } catch (const Error& e) {
          const std::string what = e.what();
          // The first rank to time out names the stalled rank; the others may instead report its failure.
          const bool named = what.find("peer rank(s) " + std::to_string(stalled)) != std::string::npos &&
                             what.find("timed out: rank " + std::to_string(group.rank()) + " waited") != std::string::npos;
          const bool relayed = what.find("rendezvous failed") != std::string::npos;
          EXPECT_TRUE(named || relayed) << what;
          EXPECT_NE(what.find("'combine'"), std::string::npos) << what;
        }
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        EXPECT_LT(seconds, 3.0) << "the bounded wait (0.5 s) took " << seconds << " s to report";
        cudaFree(y);
      },
      options);
}

// mega on in-process ranks whose streams share every SM (no partitions): each rank's grid would hold SMs a peer's grid
// needs while it waits for that peer, so every rank refuses before it launches, naming the partition it needs.
TEST(EpLoopbackErrors, MegaRefusesRanksWithoutTheirOwnSms) {
  MEGAMOE_LOOPBACK_TEST_START();
  ScopedEnv plain_streams("MEGAMOE_LOOPBACK_PARTITIONS", "0");
  run_loopback_ranks(2, [](EpGroup& group, cudaStream_t stream) {
    const MoeConfig c{256, 256, 8, 2, WeightFormat::kFp8Block, Activation{}, false, 0, 64};
    const auto experts = make_experts(c, 5);
    try {
      make_loaded_backend("mega[fused]", c, group, experts, stream);  // warmup runs a forward
      ADD_FAILURE() << "rank " << group.rank() << ": mega ran on a stream holding every SM";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("needs each rank's stream on its own SM partition"), std::string::npos)
          << e.what();
    }
  });
}

// The bounded host rendezvous behind every in-process collective (no GPU needed: enter_collective touches no CUDA):
// all ranks pass; a rank that calls another collective, and a rank that never arrives, end in errors naming them.
TEST(EpLoopbackErrors, RendezvousNamesMismatchAndMissingRank) {
  constexpr uint64_t kBoundNs = 200ull * 1000 * 1000;
  auto run = [](int ranks, const std::function<void(ep_detail::EpTransport&, int)>& body) {
    auto fabric = make_ep_loopback_fabric(ranks, 0);
    std::vector<std::unique_ptr<ep_detail::EpTransport>> transports;
    for (int r = 0; r < ranks; ++r) transports.push_back(ep_detail::make_loopback_transport(fabric, r, kBoundNs));
    std::vector<std::string> errors(ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] {
        try {
          body(*transports[r], r);
        } catch (const Error& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    return errors;
  };
  // Three rounds of three ranks: nobody fails.
  for (const std::string& e : run(3, [](ep_detail::EpTransport& t, int) {
         for (int round = 0; round < 3; ++round) t.enter_collective("dispatch", kBoundNs);
       }))
    EXPECT_EQ(e, "");
  // Rank 2 calls 'combine' while ranks 0 and 1 call 'dispatch'.
  const auto mismatch = run(3, [](ep_detail::EpTransport& t, int r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(r == 2 ? 20 : 0));
    t.enter_collective(r == 2 ? "combine" : "dispatch", kBoundNs);
  });
  EXPECT_NE(mismatch[2].find("called different collectives: 'dispatch' and 'combine'"), std::string::npos) << mismatch[2];
  for (int r = 0; r < 2; ++r) EXPECT_NE(mismatch[r].find("rendezvous failed"), std::string::npos) << mismatch[r];
  // Rank 1 of 3 never arrives: the others report it within about the bound.
  const auto start = std::chrono::steady_clock::now();
  const auto stalled = run(3, [](ep_detail::EpTransport& t, int r) {
    if (r != 1) t.enter_collective("combine", kBoundNs);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(stalled[1], "");
  int named = 0;
  for (int r : {0, 2}) {
    named += stalled[r].find("for peer rank(s) 1 (did every rank call the collective?)") != std::string::npos;
    EXPECT_NE(stalled[r].find("'combine'"), std::string::npos) << stalled[r];
  }
  EXPECT_GE(named, 1) << stalled[0] << " | " << stalled[2];
  EXPECT_LT(seconds, 2.0);
}

// Argument checks (no GPU needed: they throw before any CUDA call).
TEST(EpLoopbackErrors, RejectsBadArguments) {
  EXPECT_THROW(make_ep_loopback_fabric(0, 0), Error);
  EXPECT_THROW(make_ep_loopback_fabric(kMaxEpRanks + 1, 0), Error);
  EXPECT_THROW(make_ep_loopback_fabric(2, -1), Error);
  auto fabric = make_ep_loopback_fabric(2, 0);
  EXPECT_THROW(EpGroup::loopback(nullptr, 0), Error);
  EXPECT_THROW(EpGroup::loopback(fabric, 2), Error);
  EXPECT_THROW(EpGroup::loopback(fabric, -1), Error);
  try {
    make_ep_loopback_fabric(9, 0);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ranks = 9 must be in [1, 8]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace megamoe::testing
