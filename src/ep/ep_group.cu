// EpGroup: communicator bootstrap, the control window (bounded barrier inboxes), error reporting and
// lifecycle. Kernels that move tokens live in src/kernels/sm90_{dispatch,combine}.cuh.
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "ep/ep_device.cuh"
#include "ep/transport.h"
#include "megamoe/ep.h"
#include "megamoe/error_cuda.h"

namespace megamoe {

const char* ep_phase_name(EpPhase phase) {
  switch (phase) {
    case EpPhase::kNone: return "none";
    case EpPhase::kBarrier: return "barrier";
    case EpPhase::kDispatch: return "dispatch";
    case EpPhase::kCombine: return "combine";
    case EpPhase::kInvalidInput: return "input validation";
    case EpPhase::kExpertCompute: return "expert compute";
  }
  return "unknown";
}

namespace {

constexpr uint64_t kDefaultWaitTimeoutNs = 5ull * 1000 * 1000 * 1000;

// Control window layout (symmetric, per rank):
//   [0, 8 * kMaxEpRanks)  uint64 barrier_inbox[kMaxEpRanks]: inbox[s] = last barrier epoch rank s reached
constexpr size_t kControlWindowBytes = sizeof(uint64_t) * kMaxEpRanks;

__global__ void bounded_barrier_kernel(EpDeviceContext ctx) {
  if (threadIdx.x != 0 || ep_device::group_failed(ctx)) return;
  const uint64_t epoch = ++*ctx.barrier_epoch;
  __threadfence_system();
  for (int peer = 0; peer < ctx.ranks; ++peer) ep_device::store_release_sys(ctx.barrier_inbox[peer] + ctx.rank, epoch);
  for (int peer = 0; peer < ctx.ranks; ++peer)
    if (!ep_device::bounded_wait_geq(ctx, ctx.barrier_inbox[ctx.rank] + peer, epoch, EpPhase::kBarrier, peer)) return;
}

void check_nccl_version() {
  int version = 0;
  MEGAMOE_NCCL_CHECK(ncclGetVersion(&version));
  MEGAMOE_CHECK(version == NCCL_VERSION_CODE, "NCCL library version ", version, " != header version ",
                NCCL_VERSION_CODE,
                ": build with -DNCCL_ROOT=<dir> and put <dir>/lib first on LD_LIBRARY_PATH (same NCCL)");
}

uint64_t timeout_from_env(uint64_t requested) {
  if (requested != 0) return requested;
  if (const char* ms = std::getenv("MEGAMOE_EP_TIMEOUT_MS")) {
    const long long value = std::atoll(ms);
    MEGAMOE_CHECK(value > 0, "MEGAMOE_EP_TIMEOUT_MS = '", ms, "' must be a positive integer");
    return static_cast<uint64_t>(value) * 1000 * 1000;
  }
  return kDefaultWaitTimeoutNs;
}

std::string rendezvous_path(const std::string& rendezvous) {
  const std::string prefix = "file:";
  return rendezvous.rfind(prefix, 0) == 0 ? rendezvous.substr(prefix.size()) : rendezvous;
}

// The file of this process's n-th bootstrap on `path`: path + ".<n>".
// NOTES: one rendezvous string serves every group a set of ranks creates (a test that bootstraps once
// per weight format, an engine that rebuilds its group). With a single file, a rank that reaches its
// second bootstrap before rank 0 has rewritten the file read the FIRST group's id and connected to a
// root that no longer listened: ncclCommInitRank hung (or failed "Connection refused" after its
// retries) whenever the ranks' timing differed (session 8: MegaMulti.ManyGemm2TilesPerCta, its BF16
// half, after the FP8 half passed on both ranks). Every rank runs the same sequence of bootstraps, so
// a per-process generation counter names the same file on every rank; rank 0 also removes the file
// once the communicator exists (every rank has read it by then: ncclCommInitRank needs them all).
std::string rendezvous_generation_path(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, int> generations;
  std::lock_guard<std::mutex> lock(mutex);
  return path + "." + std::to_string(generations[path]++);
}

}  // namespace

struct EpGroup::Impl {
  std::unique_ptr<ep_detail::EpTransport> transport;
  int device = 0, rank = 0, ranks = 1;
  uint64_t timeout_ns = kDefaultWaitTimeoutNs;
  EpErrorRecord* error_host = nullptr;  // pinned, mapped
  EpErrorRecord* error_device = nullptr;
  int* failed_device = nullptr;
  uint64_t* barrier_epoch = nullptr;
  SymmetricBuffer control;
  bool destroyed = false;
  bool failed = false;
  cudaStream_t setup_stream = nullptr;

  void require_alive(const char* call) const {
    MEGAMOE_CHECK(!destroyed, "EpGroup::", call, " called after destroy()");
  }
};

EpGroup::EpGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EpGroup::~EpGroup() {
  try {
    destroy();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megamoe: EpGroup destructor: %s\n", e.what());
  }
}

namespace {
std::unique_ptr<EpGroup::Impl> make_group_impl(std::unique_ptr<ep_detail::EpTransport> transport, int device,
                                               uint64_t timeout_ns) {
  MEGAMOE_CUDA_CHECK(cudaSetDevice(device));
  auto impl = std::make_unique<EpGroup::Impl>();
  impl->device = device;
  impl->timeout_ns = timeout_ns;
  impl->transport = std::move(transport);
  impl->rank = impl->transport->rank();
  impl->ranks = impl->transport->size();
  MEGAMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&impl->setup_stream, cudaStreamNonBlocking));
  MEGAMOE_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&impl->error_host), sizeof(EpErrorRecord),
                                   cudaHostAllocMapped));
  std::memset(impl->error_host, 0, sizeof(EpErrorRecord));
  MEGAMOE_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&impl->error_device), impl->error_host, 0));
  MEGAMOE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&impl->failed_device), sizeof(int)));
  MEGAMOE_CUDA_CHECK(cudaMemset(impl->failed_device, 0, sizeof(int)));
  MEGAMOE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&impl->barrier_epoch), sizeof(uint64_t)));
  MEGAMOE_CUDA_CHECK(cudaMemset(impl->barrier_epoch, 0, sizeof(uint64_t)));
  impl->control = impl->transport->allocate(kControlWindowBytes, impl->setup_stream);
  // NOTES: every rank must have zeroed its barrier inbox before any peer's first bounded barrier
  // stores into it: one NCCL LSA barrier fences that (collective, at creation only).
  impl->transport->transport_barrier(impl->setup_stream);
  MEGAMOE_CUDA_CHECK(cudaStreamSynchronize(impl->setup_stream));
  // The memsets above ran on the legacy stream; user streams may be non-blocking.
  MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
  return impl;
}
}  // namespace

std::unique_ptr<EpGroup> EpGroup::from_nccl(ncclComm_t comm, int device, EpOptions options) {
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  check_nccl_version();
  MEGAMOE_CHECK(comm != nullptr, "EpGroup::from_nccl: comm is null");
  MEGAMOE_CUDA_CHECK(cudaSetDevice(device));
  return std::unique_ptr<EpGroup>(new EpGroup(make_group_impl(ep_detail::make_nccl_lsa_transport(comm, /*owns_comm=*/false),
                                                              device, timeout_from_env(options.wait_timeout_ns))));
}

std::unique_ptr<EpGroup> EpGroup::bootstrap(int rank, int ranks, const std::string& rendezvous, int device,
                                            EpOptions options) {
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  check_nccl_version();
  MEGAMOE_CHECK(ranks >= 1 && ranks <= kMaxEpRanks, "ranks = ", ranks, " must be in [1, ", kMaxEpRanks, "]");
  MEGAMOE_CHECK(rank >= 0 && rank < ranks, "rank = ", rank, " must be in [0, ranks = ", ranks, ")");
  int devices = 0;
  MEGAMOE_CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (device < 0) device = rank % devices;
  MEGAMOE_CHECK(device < devices, "device = ", device, " but only ", devices, " CUDA devices are visible");
  MEGAMOE_CUDA_CHECK(cudaSetDevice(device));
  MEGAMOE_CHECK(!rendezvous_path(rendezvous).empty(), "EpGroup::bootstrap: empty rendezvous");
  const std::string path = rendezvous_generation_path(rendezvous_path(rendezvous));
  ncclUniqueId id{};
  if (rank == 0) {
    MEGAMOE_NCCL_CHECK(ncclGetUniqueId(&id));
    const std::string tmp = path + ".tmp";
    {
      std::ofstream file(tmp, std::ios::binary | std::ios::trunc);
      MEGAMOE_CHECK(file.good(), "cannot write rendezvous file ", tmp);
      file.write(reinterpret_cast<const char*>(&id), sizeof(id));
    }
    std::filesystem::rename(tmp, path);  // atomic: readers never see a partial id
  } else {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options.rendezvous_timeout_ms);
    while (true) {
      std::ifstream file(path, std::ios::binary);
      if (file.good() && file.read(reinterpret_cast<char*>(&id), sizeof(id)) && file.gcount() == sizeof(id)) break;
      MEGAMOE_CHECK(std::chrono::steady_clock::now() < deadline, "rank ", rank, ": rendezvous file ", path,
                    " did not appear within ", options.rendezvous_timeout_ms, " ms (is rank 0 running?)");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ncclComm_t comm = nullptr;
  MEGAMOE_NCCL_CHECK(ncclCommInitRank(&comm, ranks, id, rank));
  if (rank == 0) {
    std::error_code ignored;  // a leftover file only costs disk; the next generation has its own name
    std::filesystem::remove(path, ignored);
  }
  // NOTES: from here the transport owns `comm` (it finalizes and destroys it in destroy()).
  MEGAMOE_CUDA_CHECK(cudaSetDevice(device));
  return std::unique_ptr<EpGroup>(new EpGroup(make_group_impl(ep_detail::make_nccl_lsa_transport(comm, /*owns_comm=*/true),
                                                              device, timeout_from_env(options.wait_timeout_ns))));
}

std::unique_ptr<EpGroup> EpGroup::loopback(std::shared_ptr<EpLoopbackFabric> fabric, int rank, EpOptions options) {
  const uint64_t timeout_ns = timeout_from_env(options.wait_timeout_ns);
  auto transport = ep_detail::make_loopback_transport(fabric, rank, timeout_ns);  // checks fabric and rank
  const int device = ep_detail::loopback_fabric_device(*fabric);
  int devices = 0;
  MEGAMOE_CUDA_CHECK(cudaGetDeviceCount(&devices));
  MEGAMOE_CHECK(device < devices, "EpGroup::loopback: the fabric's device ", device, " but only ", devices,
                " CUDA devices are visible");
  return std::unique_ptr<EpGroup>(new EpGroup(make_group_impl(std::move(transport), device, timeout_ns)));
}

int EpGroup::rank() const { return impl_->rank; }
int EpGroup::size() const { return impl_->ranks; }
bool EpGroup::is_loopback() const { return impl_->transport && impl_->transport->is_loopback(); }
int EpGroup::device() const { return impl_->device; }
uint64_t EpGroup::wait_timeout_ns() const { return impl_->timeout_ns; }
bool EpGroup::destroyed() const { return impl_->destroyed; }
bool EpGroup::failed() const { return impl_->failed; }

SymmetricBuffer EpGroup::allocate(size_t bytes) {
  impl_->require_alive("allocate");
  SymmetricBuffer buffer = impl_->transport->allocate(bytes, impl_->setup_stream);
  // NOTES: no peer may store into the new window before every rank has zeroed its copy.
  barrier(impl_->setup_stream);
  synchronize(impl_->setup_stream);
  return buffer;
}

const void* EpGroup::device_comm() const {
  impl_->require_alive("device_comm");
  return impl_->transport->device_comm();
}

EpDeviceContext EpGroup::device_context() const {
  impl_->require_alive("device_context");
  EpDeviceContext ctx;
  ctx.rank = impl_->rank;
  ctx.ranks = impl_->ranks;
  ctx.wait_timeout_ns = impl_->timeout_ns;
  ctx.error = impl_->error_device;
  ctx.failed = impl_->failed_device;
  for (int r = 0; r < impl_->ranks; ++r) ctx.barrier_inbox[r] = static_cast<uint64_t*>(impl_->control.peers[r]);
  ctx.barrier_epoch = impl_->barrier_epoch;
  return ctx;
}

void EpGroup::warmup(StreamHandle stream) {
  impl_->require_alive("warmup");
  check_errors();
  const auto s = static_cast<cudaStream_t>(stream);
  impl_->transport->transport_barrier(s);
  barrier(stream);
  synchronize(stream);
}

void EpGroup::enter_collective(const char* what) {
  impl_->require_alive("enter_collective");
  impl_->transport->enter_collective(what, impl_->timeout_ns);
}

void EpGroup::barrier(StreamHandle stream) {
  impl_->require_alive("barrier");
  check_errors();
  enter_collective("barrier");
  bounded_barrier_kernel<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>(device_context());
  MEGAMOE_LAUNCH_CHECK();
}

void EpGroup::check_errors() {
  impl_->require_alive("check_errors");
  const volatile EpErrorRecord* record = impl_->error_host;
  const uint32_t code = record->code;
  if (code == 0 || code == 0xFFFFFFFFu) {
    MEGAMOE_CHECK(!impl_->failed, "EP group on rank ", impl_->rank, " has failed before; destroy and recreate it");
    return;
  }
  impl_->failed = true;
  const auto phase = static_cast<EpPhase>(record->phase);
  if (code == 1) {
    auto hex = [](uint64_t v) {
      char text[24];
      std::snprintf(text, sizeof(text), "0x%llx", static_cast<unsigned long long>(v));
      return std::string(text);
    };
    const std::string flag = record->flag_address == 0
                                 ? std::string()
                                 : detail::concat("; its flag at ", hex(record->flag_address), " held ", record->observed,
                                                  " (", hex(record->observed), "), waiting for >= ", record->target, " (",
                                                  hex(record->target), ")");
    MEGAMOE_FAIL("EP wait timed out: rank ", record->rank, " waited ", record->waited_ns / 1000000, " ms (limit ",
                 impl_->timeout_ns / 1000000, " ms) in phase '", ep_phase_name(phase), "' for peer rank ",
                 record->peer, " (did every rank call the collective?)", flag);
  }
  MEGAMOE_FAIL("EP kernel on rank ", record->rank, " rejected its input in phase '", ep_phase_name(phase),
               "': offending value ", record->peer, " (e.g. an expert id outside [-1, num_experts))");
}

void EpGroup::synchronize(StreamHandle stream) {
  impl_->require_alive("synchronize");
  MEGAMOE_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  check_errors();
}

void EpGroup::destroy() {
  if (!impl_ || impl_->destroyed) return;
  impl_->destroyed = true;
  cudaSetDevice(impl_->device);
  cudaDeviceSynchronize();
  if (impl_->transport) impl_->transport->destroy();
  if (impl_->error_host) cudaFreeHost(impl_->error_host);
  if (impl_->failed_device) cudaFree(impl_->failed_device);
  if (impl_->barrier_epoch) cudaFree(impl_->barrier_epoch);
  if (impl_->setup_stream) cudaStreamDestroy(impl_->setup_stream);
  impl_->error_host = nullptr;
  impl_->failed_device = nullptr;
  impl_->barrier_epoch = nullptr;
  impl_->setup_stream = nullptr;
}

}  // namespace megamoe
