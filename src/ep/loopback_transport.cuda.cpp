// In-process transport (EpGroup::loopback): 1..kMaxEpRanks ranks of ONE process on ONE GPU, one host thread each.
// Windows are cudaMalloc buffers of the fabric's device; peers[r] is rank r's buffer. The collectives are bounded
// host rendezvous (std::condition_variable), so a rank that never arrives ends in megamoe::Error naming it, as a
// device-side bounded wait does for NCCL groups. Why the ranks rendezvous before every EP launch: megamoe/ep.h,
// EpLoopbackFabric NOTES.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "ep/transport.h"
#include "megamoe/error_cuda.h"

namespace megamoe {

struct EpLoopbackFabric {
  int ranks = 0;
  int device = 0;
  std::mutex mutex;
  std::condition_variable arrived;
  // Generation barrier: arrived_mask holds the ranks of the current generation; the last one bumps `generation`.
  uint64_t generation = 0;
  uint32_t arrived_mask = 0;
  std::string generation_what;  // the collective the first arrival of this generation named
  std::string broken;           // set by a failed rendezvous: every later one throws it
  // Collective allocations: the n-th allocate of every rank fills slot n.
  struct Slot {
    size_t bytes = 0;
    std::array<void*, kMaxEpRanks> pointers{};
  };
  std::vector<Slot> slots;
  std::array<size_t, kMaxEpRanks> allocations_made{};
  // Every window is followed by kGuardBytes of kGuardByte (an overflow check the NCCL transport cannot make):
  // check_ep_loopback_guards() reports the windows whose guard changed.
  static constexpr size_t kGuardBytes = 64 * 1024;
  static constexpr unsigned char kGuardByte = 0xA5;
  struct Window {
    int rank;
    size_t slot, bytes;
    void* base;            // the allocation: freed when the last owner lets go (a rank's peer may still hold it)
    unsigned char* guard;  // base + bytes rounded up to 256
  };
  std::vector<Window> windows;

  ~EpLoopbackFabric() {
    if (windows.empty()) return;
    cudaSetDevice(device);
    cudaDeviceSynchronize();  // no kernel of any rank may still touch a window
    for (const Window& w : windows) cudaFree(w.base);
  }

  // Bounded rendezvous of all ranks at the collective `what`.
  void rendezvous(int rank, const char* what, uint64_t timeout_ns) {
    std::unique_lock<std::mutex> lock(mutex);
    MEGAMOE_CHECK(broken.empty(), "EP loopback group, rank ", rank, " at '", what, "': an earlier rendezvous failed (",
                  broken, ")");
    if (arrived_mask == 0) generation_what = what;
    if (generation_what != what) {
      broken = "ranks " + std::to_string(std::countr_zero(arrived_mask)) + " and " + std::to_string(rank) +
               " called different collectives: '" + generation_what + "' and '" + what + "'";
      arrived.notify_all();
      MEGAMOE_FAIL("EP loopback group: ", broken);
    }
    arrived_mask |= 1u << rank;
    const uint64_t my_generation = generation;
    if (std::popcount(arrived_mask) == ranks) {
      arrived_mask = 0;
      ++generation;
      arrived.notify_all();
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    const bool done = arrived.wait_for(lock, std::chrono::nanoseconds(timeout_ns),
                                       [&] { return generation != my_generation || !broken.empty(); });
    if (done && generation != my_generation) return;
    if (!done) {
      std::string missing;
      for (int r = 0; r < ranks; ++r)
        if (!(arrived_mask >> r & 1)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      const auto waited_ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
      broken = "rank " + std::to_string(rank) + " waited " + std::to_string(waited_ms) + " ms (limit " +
               std::to_string(timeout_ns / 1000000) + " ms) at the in-process rendezvous '" + what +
               "' for peer rank(s) " + missing;
      arrived.notify_all();
      MEGAMOE_FAIL("EP wait timed out: ", broken, " (did every rank call the collective?)");
    }
    MEGAMOE_FAIL("EP loopback group, rank ", rank, " at '", what, "': another rank's rendezvous failed (", broken, ")");
  }
};

std::shared_ptr<EpLoopbackFabric> make_ep_loopback_fabric(int ranks, int device) {
  MEGAMOE_CHECK(ranks >= 1 && ranks <= kMaxEpRanks, "make_ep_loopback_fabric: ranks = ", ranks, " must be in [1, ",
                kMaxEpRanks, "]");
  MEGAMOE_CHECK(device >= 0, "make_ep_loopback_fabric: device = ", device, " must be >= 0");
  auto fabric = std::make_shared<EpLoopbackFabric>();
  fabric->ranks = ranks;
  fabric->device = device;
  return fabric;
}

std::string check_ep_loopback_guards(EpLoopbackFabric& fabric) {
  std::lock_guard<std::mutex> lock(fabric.mutex);
  if (fabric.windows.empty()) return "";
  MEGAMOE_CUDA_CHECK(cudaSetDevice(fabric.device));
  MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
  std::string report;
  std::vector<unsigned char> host(EpLoopbackFabric::kGuardBytes);
  for (const auto& g : fabric.windows) {
    MEGAMOE_CUDA_CHECK(cudaMemcpy(host.data(), g.guard, host.size(), cudaMemcpyDeviceToHost));
    size_t first = host.size(), last = 0, changed = 0;
    for (size_t i = 0; i < host.size(); ++i)
      if (host[i] != EpLoopbackFabric::kGuardByte) {
        first = std::min(first, i);
        last = i;
        ++changed;
      }
    if (changed)
      report += detail::concat("window #", g.slot, " of rank ", g.rank, " (", g.bytes, " bytes): ", changed,
                               " bytes written past its end, at +", first, " .. +", last, "; ");
  }
  return report;
}

namespace ep_detail {
namespace {

class LoopbackTransport final : public EpTransport {
 public:
  LoopbackTransport(std::shared_ptr<EpLoopbackFabric> fabric, int rank, uint64_t timeout_ns)
      : fabric_(std::move(fabric)), rank_(rank), timeout_ns_(timeout_ns) {
    const char* trace = std::getenv("MEGAMOE_EP_LOOPBACK_TRACE");
    trace_ = trace != nullptr && std::string(trace) == "1";
  }
  int rank() const override { return rank_; }
  int size() const override { return fabric_->ranks; }

  SymmetricBuffer allocate(size_t bytes, cudaStream_t stream) override {
    // NOTES: rounded up to 256 B like the NCCL windows' regions; the guard after it (EpLoopbackFabric::kGuardBytes).
    const size_t rounded = (std::max<size_t>(bytes, 16) + 255) / 256 * 256;
    void* local = nullptr;
    MEGAMOE_CUDA_CHECK(cudaMalloc(&local, rounded + EpLoopbackFabric::kGuardBytes));
    MEGAMOE_CUDA_CHECK(cudaMemsetAsync(local, 0, rounded, stream));
    auto* guard = static_cast<unsigned char*>(local) + rounded;
    MEGAMOE_CUDA_CHECK(cudaMemsetAsync(guard, EpLoopbackFabric::kGuardByte, EpLoopbackFabric::kGuardBytes, stream));
    MEGAMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    size_t slot = 0;
    {
      std::lock_guard<std::mutex> lock(fabric_->mutex);
      fabric_->windows.push_back({rank_, fabric_->allocations_made[rank_], bytes, local, guard});
      slot = fabric_->allocations_made[rank_]++;
      if (fabric_->slots.size() <= slot) fabric_->slots.resize(slot + 1);
      fabric_->slots[slot].pointers[rank_] = local;
      if (fabric_->slots[slot].bytes == 0) fabric_->slots[slot].bytes = bytes;
      MEGAMOE_CHECK(fabric_->slots[slot].bytes == bytes, "EP loopback allocate #", slot, ": rank ", rank_, " asked for ",
                    bytes, " bytes, another rank for ", fabric_->slots[slot].bytes, " (every rank must ask the same)");
    }
    fabric_->rendezvous(rank_, "allocate", timeout_ns_);
    SymmetricBuffer buffer;
    buffer.local = local;
    buffer.bytes = bytes;
    std::lock_guard<std::mutex> lock(fabric_->mutex);
    for (int r = 0; r < fabric_->ranks; ++r) {
      buffer.peers[r] = fabric_->slots[slot].pointers[r];
      // Every rank's n-th allocate meets the others' n-th: a rank out of step would find a slot a peer never filled.
      MEGAMOE_CHECK(buffer.peers[r] != nullptr, "EP loopback allocate #", slot, " on rank ", rank_, ": rank ", r,
                    " has no buffer there (the ranks' collective allocations are out of step)");
    }
    if (trace_) {
      std::string peers;
      for (int r = 0; r < fabric_->ranks; ++r) peers += " " + std::to_string(reinterpret_cast<uintptr_t>(buffer.peers[r]));
      std::fprintf(stderr, "[loopback] rank %d allocate #%zu %zu bytes local %p peers%s\n", rank_, slot, bytes, local,
                   peers.c_str());
    }
    return buffer;
  }

  const void* device_comm() const override { return nullptr; }

  void transport_barrier(cudaStream_t stream) override {
    MEGAMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    fabric_->rendezvous(rank_, "transport barrier", timeout_ns_);
  }

  // The windows belong to the fabric (a peer that is slower to finish may still read this rank's buffers).
  void destroy() override {}

  void enter_collective(const char* what, uint64_t timeout_ns) override {
    if (trace_) std::fprintf(stderr, "[loopback] rank %d enters '%s'\n", rank_, what);
    fabric_->rendezvous(rank_, what, timeout_ns);
  }
  bool is_loopback() const override { return true; }

 private:
  std::shared_ptr<EpLoopbackFabric> fabric_;
  int rank_ = 0;
  uint64_t timeout_ns_ = 0;
  bool trace_ = false;  // MEGAMOE_EP_LOOPBACK_TRACE=1: every allocate and collective entry on stderr
};

}  // namespace

std::unique_ptr<EpTransport> make_loopback_transport(std::shared_ptr<EpLoopbackFabric> fabric, int rank,
                                                     uint64_t timeout_ns) {
  MEGAMOE_CHECK(fabric != nullptr, "EpGroup::loopback: fabric is null");
  MEGAMOE_CHECK(rank >= 0 && rank < fabric->ranks, "EpGroup::loopback: rank = ", rank, " must be in [0, ranks = ",
                fabric->ranks, ")");
  return std::make_unique<LoopbackTransport>(std::move(fabric), rank, timeout_ns);
}

int loopback_fabric_device(const EpLoopbackFabric& fabric) { return fabric.device; }

}  // namespace ep_detail
}  // namespace megamoe
