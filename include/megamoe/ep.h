// Expert-parallel group: one process per GPU, an NCCL communicator, symmetric memory windows that
// every rank can load/store through NVLink, and bounded-wait failure reporting.
//
//   auto ep = EpGroup::bootstrap(rank, ranks, "file:/tmp/megamoe-rdv-XXXX");   // our launcher
//   auto ep = EpGroup::from_nccl(comm, device);                                // a torch engine
//   SymmetricBuffer buf = ep->allocate(bytes);   // collective; buf.peers[r] = rank r's copy
//   ep->warmup(stream);                          // before any CUDA-graph capture
//   ... kernels ...; ep->check_errors();         // throws megamoe::Error naming (rank, phase, peer)
//   ep->destroy();                               // idempotent; later calls throw
//
// NOTES:
// - Symmetric memory comes from the NCCL 2.28 device API (ncclMemAlloc + ncclCommWindowRegister with
//   NCCL_WIN_COLL_SYMMETRIC, ncclDevCommCreate, ncclGetLsaPointer). Peer pointers are resolved once
//   per buffer by a tiny kernel and then passed to kernels by value, so kernels never depend on the
//   transport (an inter-node NCCL GIN transport can be added behind src/ep/transport.h).
// - No multicast/NVLS: the group sets NCCL_NVLS_ENABLE=0 when unset and never requests lsaMultimem.
// - All ranks must be in one NVLink (LSA) domain: 1 <= ranks <= kMaxEpRanks.
// - Every device-side wait on a peer is bounded by wait_timeout_ns (globaltimer); a timeout records
//   (rank, phase, peer) in a host-mapped error record and the kernel exits; the group is then
//   "failed" and every later call throws.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "megamoe/moe.h"  // StreamHandle

// Forward declaration so this header needs no NCCL include (same typedef as nccl.h).
typedef struct ncclComm* ncclComm_t;

namespace megamoe {

inline constexpr int kMaxEpRanks = 8;

// One symmetric allocation: `bytes` at the same offset in every rank's window.
struct SymmetricBuffer {
  void* local = nullptr;                   // this rank's copy (device pointer)
  std::array<void*, kMaxEpRanks> peers{};  // peers[r]: rank r's copy, mapped here (peers[rank] aliases local)
  size_t bytes = 0;
  void* window = nullptr;                  // ncclWindow_t
};

// Phases named in bounded-wait errors.
// kExpertCompute: a fused kernel's wait on its own CTAs (rows gathered, GEMM-1 tiles done); it only
// expires when the kernel itself is broken or the group already failed.
enum class EpPhase : int32_t { kNone = 0, kBarrier = 1, kDispatch = 2, kCombine = 3, kInvalidInput = 4, kExpertCompute = 5 };
const char* ep_phase_name(EpPhase phase);

// What a kernel writes when a bounded wait expires (or when it meets invalid device-side input).
// Lives in host-mapped pinned memory, so the host reads it without synchronising the stream.
struct EpErrorRecord {
  uint32_t code;       // 0 = no error; 1 = wait timeout; 2 = invalid input (e.g. expert id out of range)
  int32_t rank;        // the rank that recorded it
  int32_t phase;       // EpPhase
  int32_t peer;        // the peer it waited for (timeout) or the offending value (invalid input)
  uint64_t waited_ns;  // how long it waited
  // Timeouts of a flag wait (bounded_wait_geq): the flag's address on the waiting rank, the last value seen and the
  // value awaited (0 / 0 / 0 for other errors). The target's form names the wait: a (epoch << 16 | pieces)
  // progress word, a block count ((epoch - 1) * blocks + 1 for "a block of this call started"), a barrier epoch.
  uint64_t flag_address;
  uint64_t observed;
  uint64_t target;
};

// The small device-side state every EP kernel takes by value.
struct EpDeviceContext {
  int rank = 0, ranks = 1;
  uint64_t wait_timeout_ns = 0;
  EpErrorRecord* error = nullptr;  // host-mapped
  int* failed = nullptr;           // device memory: nonzero once any kernel recorded an error
  // Signal words of the group's own barrier, in the symmetric control window:
  // barrier_inbox[r] points at rank r's uint64[kMaxEpRanks] barrier inbox.
  std::array<uint64_t*, kMaxEpRanks> barrier_inbox{};
  uint64_t* barrier_epoch = nullptr;  // device memory, local
};

struct EpOptions {
  // Bounded waits on peers; 0 = default (5 s, or MEGAMOE_EP_TIMEOUT_MS from the environment).
  uint64_t wait_timeout_ns = 0;
  // bootstrap(): how long non-zero ranks wait for rank 0's unique id to appear.
  int rendezvous_timeout_ms = 60000;
};

// In-process ranks on ONE GPU (EpGroup::loopback): what `ranks` EpGroups of one process share. Each rank's
// windows are plain cudaMalloc buffers of `device`; a rank's peers[r] is rank r's buffer, so the EP kernels run
// unchanged with every "remote" store landing in the same HBM. For tests and protocol checks of 2..8 ranks on a
// one-GPU machine (no NVLink, no NCCL; its timings say nothing about NVLink). Memory lives until the last owner
// (the fabric handle or a group) lets go.
// NOTES (why the ranks must run in separate host threads, each on its own stream, ideally on its own SMs):
// - A rank's EP kernels wait on its peers' kernels (bounded). They run concurrently only if each rank's host
//   thread launches its part: one thread per rank, one non-blocking stream per rank.
// - Every EP launch point (EpGroup::barrier, EpDispatcher::dispatch / combine, EpGroup::enter_collective) is a
//   bounded host rendezvous of all ranks first: otherwise a rank ahead could leave a waiting kernel on the GPU
//   while another rank is still inside a host call that serializes the device (cudaFree, cudaDeviceSynchronize,
//   lazy module loading: run such processes with CUDA_MODULE_LOADING=EAGER), and the two would wait on each other
//   until the bounded wait expired. For the same reason each rank's stream needs a hardware work queue of its own:
//   CUDA_DEVICE_MAX_CONNECTIONS (default 8) >= 2 x ranks + 1 (each group also has a setup stream), 32 at most. With
//   8 ranks and the default, a rank's send kernel waited in a queue behind a peer's kernel that was waiting for it.
// - The kernels progress whatever the residency of their blocks, but with 3+ ranks one rank's grid can hold
//   every SM while it waits for a rank that got none: give each rank its own SM partition (a green-context
//   stream; src/common/sm_partition.h).
struct EpLoopbackFabric;
// `ranks` in [1, kMaxEpRanks]; `device` a visible CUDA device. Host-only until a group allocates.
std::shared_ptr<EpLoopbackFabric> make_ep_loopback_fabric(int ranks, int device);
// Every window of the fabric is followed by a guard zone: "" when no guard changed, else which windows were
// written past their end and where (synchronizes the device; call when no rank runs EP work).
std::string check_ep_loopback_guards(EpLoopbackFabric& fabric);

class EpGroup {
 public:
  // Uses an existing communicator (not owned: destroy() leaves it alive). `device` must be the
  // current CUDA device of the communicator's rank.
  static std::unique_ptr<EpGroup> from_nccl(ncclComm_t comm, int device, EpOptions options = {});
  // Creates the communicator: rank 0 writes the NCCL unique id to `rendezvous` ("file:<path>" or a
  // plain path; written atomically, as "<path>.<n>" for this process's n-th bootstrap on that path, so
  // successive groups of the same ranks never read a stale id), the others wait for it (bounded).
  // Every rank must make the same sequence of bootstrap calls. Device = rank % devices unless
  // `device` >= 0.
  static std::unique_ptr<EpGroup> bootstrap(int rank, int ranks, const std::string& rendezvous,
                                            int device = -1, EpOptions options = {});
  // Rank `rank` of the in-process group `fabric` (see EpLoopbackFabric): call it from that rank's own host
  // thread, once per rank; creation is collective (a bounded host rendezvous of all ranks).
  static std::unique_ptr<EpGroup> loopback(std::shared_ptr<EpLoopbackFabric> fabric, int rank, EpOptions options = {});
  ~EpGroup();
  EpGroup(const EpGroup&) = delete;
  EpGroup& operator=(const EpGroup&) = delete;

  int rank() const;
  int size() const;
  // True for an in-process group on one GPU (EpGroup::loopback).
  bool is_loopback() const;
  int device() const;
  uint64_t wait_timeout_ns() const;

  // Collective: every rank calls it with the same `bytes`. Memory is zeroed. Freed by destroy().
  SymmetricBuffer allocate(size_t bytes);
  // The device comm (ncclDevComm*, host copy) for kernels that use NCCL device primitives.
  const void* device_comm() const;
  EpDeviceContext device_context() const;

  // Collective: one LSA barrier through ncclLsaBarrierSession plus one bounded barrier, then a
  // stream sync; proves every peer mapping works. Must precede any CUDA-graph capture.
  void warmup(StreamHandle stream);
  // Collective device barrier (bounded wait), stream-ordered and graph-capturable.
  void barrier(StreamHandle stream);
  // Called before launching any collective EP work (the library's own launches call it): a no-op for an NCCL
  // group; for a loopback group a bounded host rendezvous of all ranks (EpLoopbackFabric NOTES), which throws
  // megamoe::Error naming `what` and the ranks that did not arrive. A caller that replays a captured CUDA graph
  // holding EP kernels calls it before each replay.
  void enter_collective(const char* what);

  // Non-blocking: throws megamoe::Error naming rank, phase and peer if a kernel recorded a failure.
  void check_errors();
  // cudaStreamSynchronize + check_errors().
  void synchronize(StreamHandle stream);
  bool failed() const;

  // Idempotent. Frees windows and the device comm (and the communicator when bootstrap() made it).
  void destroy();
  bool destroyed() const;

  struct Impl;

 private:
  explicit EpGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- launcher: one process per GPU ------------------------------------------------------------------
// Environment a launched rank sees.
inline constexpr const char* kEpRankEnv = "MEGAMOE_EP_RANK";
inline constexpr const char* kEpRanksEnv = "MEGAMOE_EP_RANKS";
inline constexpr const char* kEpRendezvousEnv = "MEGAMOE_EP_RENDEZVOUS";

struct LaunchedRank {
  int rank = -1, ranks = 0;
  std::string rendezvous;
};
// True (and fills `out`) when this process was started by launch_ranks().
bool launched_rank_from_env(LaunchedRank* out);

// Starts `ranks` copies of `argv` (argv[0] = executable path) with the EP environment set and a fresh
// rendezvous file, waits for all of them (at most timeout_s; stragglers are killed), and returns 0
// when every rank exited 0, else the first non-zero status (signals as 128 + signo). Output of each
// rank is prefixed by the child itself if it wants; stdout/stderr are inherited.
int launch_ranks(int ranks, const std::vector<std::string>& argv, int timeout_s = 600);
// launch_ranks() of this very process's command line (/proc/self/exe + /proc/self/cmdline): how a
// command such as `megamoe bench layer --ranks 2` turns itself into one process per GPU.
int relaunch_self_on_ranks(int ranks, int timeout_s = 600);

}  // namespace megamoe
