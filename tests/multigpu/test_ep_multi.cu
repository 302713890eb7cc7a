// EP on N GPUs (N = MEGAMOE_TEST_RANKS, default 2), one process per GPU: every test re-runs itself under
// launch_ranks (so each ctest entry starts the launcher), and the launched ranks run the body. Token
// counts, expert counts and routings for N ranks follow common/ep_test_ranks.h (N = 2: the 2-rank
// suite's exact inputs).
#include <nccl.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "common/gpu_stream.h"
#include "common/ep_harness.h"

namespace megamoe::testing {
namespace {

TEST(EpMulti, BootstrapWarmupBarrierDestroy) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  auto group = EpGroup::bootstrap(rank.rank, rank.ranks, rank.rendezvous);
  DeviceStream s(group->device());
  EXPECT_EQ(group->size(), rank.ranks);
  group->warmup(s.stream);
  for (int i = 0; i < 5; ++i) group->barrier(s.stream);
  group->synchronize(s.stream);
  group->destroy();
  group->destroy();
  EXPECT_THROW(group->allocate(4096), Error);
}

// Successive groups on one rendezvous string with rank 0 late to every later bootstrap: the other ranks
// reach bootstrap n before rank 0 has written id n. With one shared file they read id n - 1 (a root
// that no longer listens) and ncclCommInitRank hung or failed (session 8); each group must work.
TEST(EpMulti, SuccessiveBootstrapsWithLateRankZero) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  for (int generation = 0; generation < 3; ++generation) {
    SCOPED_TRACE(::testing::Message() << "generation " << generation << " rank " << rank.rank);
    if (rank.rank == 0 && generation > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    auto group = EpGroup::bootstrap(rank.rank, rank.ranks, rank.rendezvous);
    DeviceStream s(group->device());
    group->warmup(s.stream);
    DispatchCase tc;
    tc.num_experts = experts_for_ranks(tc.num_experts, rank.ranks);
    tc.tokens_per_rank = spread_tokens(20 + generation, 40, rank.ranks);
    EXPECT_GT(run_dispatch_combine_case(*group, tc, s.stream), 0);
    group->destroy();
  }
}

TEST(EpMulti, FromExistingNcclComm) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  // Play the role of a torch engine: make the communicator ourselves.
  const std::string path = rank.rendezvous.substr(5) + ".engine";
  ncclUniqueId id{};
  if (rank.rank == 0) {
    MEGAMOE_NCCL_CHECK(ncclGetUniqueId(&id));
    { std::ofstream(path + ".tmp", std::ios::binary).write(reinterpret_cast<const char*>(&id), sizeof(id)); }
    std::rename((path + ".tmp").c_str(), path.c_str());
  } else {
    for (int i = 0; i < 3000; ++i) {
      std::ifstream f(path, std::ios::binary);
      if (f.read(reinterpret_cast<char*>(&id), sizeof(id))) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  MEGAMOE_CUDA_CHECK(cudaSetDevice(rank.rank));
  ncclComm_t comm = nullptr;
  MEGAMOE_NCCL_CHECK(ncclCommInitRank(&comm, rank.ranks, id, rank.rank));
  {
    auto group = EpGroup::from_nccl(comm, rank.rank);
    DeviceStream s(rank.rank);
    group->warmup(s.stream);
    DispatchCase tc;
    tc.num_experts = experts_for_ranks(tc.num_experts, rank.ranks);
    tc.tokens_per_rank = spread_tokens(50, 70, rank.ranks);
    EXPECT_GT(run_dispatch_combine_case(*group, tc, s.stream), 0);
    group->destroy();
  }
  // The communicator is still ours and still alive.
  MEGAMOE_NCCL_CHECK(ncclCommFinalize(comm));
  MEGAMOE_NCCL_CHECK(ncclCommDestroy(comm));
}

void dispatch_combine_bit_exact(const LaunchedRank& rank) {
  auto group = EpGroup::bootstrap(rank.rank, rank.ranks, rank.rendezvous);
  DeviceStream s(group->device());
  group->warmup(s.stream);
  run_dispatch_combine_suite(*group, s.stream);
  group->destroy();
}

TEST(EpMulti, DispatchCombineBitExact) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  dispatch_combine_bit_exact(rank);
}

// The same cases through the two-kernel dispatch and combine (MEGAMOE_EP_OVERLAP=0; set in the launched ranks,
// read when each dispatcher is created; the fused paths are the default since session 16).
TEST(EpMulti, DispatchCombineBitExactTwoKernel) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  ScopedEnv two_kernel("MEGAMOE_EP_OVERLAP", "0");
  dispatch_combine_bit_exact(rank);
}

// MEGAMOE_EP_OVERLAP=0 vs 1 on the same inputs, bit for bit (grouped rows per source and combine
// outputs), over several calls: unequal T per rank, the last rank / rank 0 with zero tokens, padded -1
// ids, unweighted calls, a hidden size with several progress publications per row, and a wide case
// (7168, top-8) with more tokens than one wave of warps.
TEST(EpMulti, OverlapMatchesTwoKernelPath) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  auto group = EpGroup::bootstrap(rank.rank, rank.ranks, rank.rendezvous);
  DeviceStream s(group->device());
  group->warmup(s.stream);
  run_overlap_suite(*group, s.stream);
  group->destroy();
}

void staged_matches_reference_and_replays(const LaunchedRank& rank) {
  auto group = EpGroup::bootstrap(rank.rank, rank.ranks, rank.rendezvous);
  DeviceStream s(group->device());
  run_staged_suite(*group, s.stream);
  group->destroy();
}

TEST(EpMulti, StagedMatchesReferenceAndReplays) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  staged_matches_reference_and_replays(rank);
}

TEST(EpMulti, StagedMatchesReferenceAndReplaysTwoKernel) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  ScopedEnv two_kernel("MEGAMOE_EP_OVERLAP", "0");
  staged_matches_reference_and_replays(rank);
}

TEST(EpMulti, CapacityOverflowOnEveryRankThrows) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  auto group = EpGroup::bootstrap(rank.rank, rank.ranks, rank.rendezvous);
  DeviceStream s(group->device());
  const int experts = experts_for_ranks(4, rank.ranks);
  EpDispatcher io(*group, EpDispatchConfig{256, 2, experts, 16, EpPayload::kFp8});
  const RankInputs in = make_rank_inputs(9, rank.rank, 17, 256, experts, 2, rank.ranks, Routing::kUniform);
  DeviceInputs dev(in, 256, 2);
  EXPECT_THROW(io.dispatch(dev.hidden_view(), dev.ids_view(), dev.weights_view(), s.stream), Error);
  group->barrier(s.stream);  // nothing was launched: the group still works
  group->synchronize(s.stream);
  group->destroy();
}

// The last rank stalls (never launches its dispatch); every other rank dispatches and must report a
// timeout naming itself, the phase and the stalled peer within the bounded wait.
void stalled_peer_times_out_with_its_name(const LaunchedRank& rank) {
  EpOptions options;
  options.wait_timeout_ns = 1000ull * 1000 * 1000;  // 1 s
  auto group = EpGroup::bootstrap(rank.rank, rank.ranks, rank.rendezvous, -1, options);
  DeviceStream s(group->device());
  group->warmup(s.stream);
  const int experts = experts_for_ranks(4, rank.ranks), stalled = rank.ranks - 1;
  EpDispatcher io(*group, EpDispatchConfig{256, 2, experts, 16, EpPayload::kFp8});
  if (rank.rank != stalled) {
    const RankInputs in = make_rank_inputs(4, rank.rank, 16, 256, experts, 2, rank.ranks, Routing::kUniform);
    DeviceInputs dev(in, 256, 2);
    const auto start = std::chrono::steady_clock::now();
    io.dispatch(dev.hidden_view(), dev.ids_view(), dev.weights_view(), s.stream);
    expect_stalled_peer_timeout(*group, s.stream, "dispatch", "dispatch", rank.rank, stalled, start);
    EXPECT_THROW(io.combine(nullptr, dev.out_view(), s.stream), Error);  // the group is failed now
  } else {
    // The stalled rank never launches its dispatch; it only waits long enough for the others to time out.
    std::this_thread::sleep_for(std::chrono::seconds(3));
  }
  io.destroy();
  group->destroy();
}

TEST(EpMulti, StalledPeerTimesOutWithItsName) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  stalled_peer_times_out_with_its_name(rank);
}

TEST(EpMulti, StalledPeerTimesOutWithItsNameTwoKernel) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  ScopedEnv two_kernel("MEGAMOE_EP_OVERLAP", "0");
  stalled_peer_times_out_with_its_name(rank);
}

// The last rank dispatches but never combines; every other rank's combine must report a timeout naming
// itself, phase 'combine' and the stalled peer (two-kernel path: the reduce's wait for the peer's
// combine blocks; fused path: a consumer's wait for the peer's progress on its partial row).
void stalled_peer_in_combine(const LaunchedRank& rank) {
  EpOptions options;
  options.wait_timeout_ns = 1000ull * 1000 * 1000;  // 1 s
  auto group = EpGroup::bootstrap(rank.rank, rank.ranks, rank.rendezvous, -1, options);
  DeviceStream s(group->device());
  group->warmup(s.stream);
  const int experts = experts_for_ranks(4, rank.ranks), stalled = rank.ranks - 1;
  EpDispatcher io(*group, EpDispatchConfig{256, 2, experts, 16, EpPayload::kFp8});
  const RankInputs in = make_rank_inputs(4, rank.rank, 16, 256, experts, 2, rank.ranks, Routing::kUniform);
  DeviceInputs dev(in, 256, 2);
  io.dispatch(dev.hidden_view(), dev.ids_view(), dev.weights_view(), s.stream);
  group->synchronize(s.stream);
  const ReceivedTokens& rx = io.received();
  void* y = nullptr;
  MEGAMOE_CUDA_CHECK(cudaMalloc(&y, std::max<int64_t>(rx.max_rows, 1) * 256 * 2));
  MEGAMOE_CUDA_CHECK(cudaMemset(y, 0, std::max<int64_t>(rx.max_rows, 1) * 256 * 2));
  if (rank.rank != stalled) {
    const auto start = std::chrono::steady_clock::now();
    io.combine(y, dev.out_view(), s.stream);
    expect_stalled_peer_timeout(*group, s.stream, "combine", "combine", rank.rank, stalled, start);
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(3));
  }
  cudaFree(y);
  io.destroy();
  group->destroy();
}

TEST(EpMulti, StalledPeerInCombineTimesOutWithItsName) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  stalled_peer_in_combine(rank);
}

TEST(EpMulti, StalledPeerInCombineTimesOutWithItsNameTwoKernel) {
  MEGAMOE_RUN_ON_TEST_RANKS(rank);
  ScopedEnv two_kernel("MEGAMOE_EP_OVERLAP", "0");
  stalled_peer_in_combine(rank);
}

}  // namespace
}  // namespace megamoe::testing
