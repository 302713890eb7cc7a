// NCCL 2.28 device-API transport: ncclMemAlloc + ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC),
// ncclDevCommCreate, peer pointers from ncclGetLsaPointer, warmup barrier with ncclLsaBarrierSession.
#include <nccl.h>
#include <nccl_device.h>

#include <vector>

#include "ep/transport.h"
#include "megamoe/error_cuda.h"

namespace megamoe::ep_detail {
namespace {

// Resolves every rank's copy of a window once; kernels then get plain pointers by value.
__global__ void resolve_lsa_pointers_kernel(ncclWindow_t window, int ranks, void** out) {
  const int r = threadIdx.x;
  if (r < ranks) out[r] = ncclGetLsaPointer(window, 0, r);
}

__global__ void lsa_barrier_kernel(ncclDevComm comm) {
  ncclLsaBarrierSession<ncclCoopCta> barrier(ncclCoopCta(), comm, ncclTeamTagLsa(), 0);
  barrier.sync(ncclCoopCta(), cuda::memory_order_seq_cst);
}

class NcclLsaTransport final : public EpTransport {
 public:
  NcclLsaTransport(ncclComm_t comm, bool owns_comm) : comm_(comm), owns_comm_(owns_comm) {
    MEGAMOE_NCCL_CHECK(ncclCommCount(comm_, &size_));
    MEGAMOE_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    MEGAMOE_CHECK(size_ >= 1 && size_ <= kMaxEpRanks, "EP group size = ", size_, " must be in [1, ",
                  kMaxEpRanks, "]");
    const ncclTeam_t lsa = ncclTeamLsa(comm_);
    MEGAMOE_CHECK(lsa.nRanks == size_, "EP group: all ", size_,
                  " ranks must share one NVLink (LSA) domain, but the LSA team has ", lsa.nRanks,
                  " ranks (inter-node EP needs a GIN transport, not implemented)");
    ncclDevCommRequirements requirements{};  // zero = nothing requested
    requirements.lsaMultimem = false;  // never multicast (NVLS disabled on these machines)
    requirements.lsaBarrierCount = 1;
    MEGAMOE_NCCL_CHECK(ncclDevCommCreate(comm_, &requirements, &dev_comm_));
    has_dev_comm_ = true;
  }
  ~NcclLsaTransport() override {
    try {
      destroy();
    } catch (...) {
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const void* device_comm() const override { return &dev_comm_; }

  SymmetricBuffer allocate(size_t bytes, cudaStream_t stream) override {
    MEGAMOE_CHECK(bytes > 0, "symmetric allocation of 0 bytes");
    const size_t rounded = (bytes + NCCL_WIN_REQUIRED_ALIGNMENT - 1) / NCCL_WIN_REQUIRED_ALIGNMENT *
                           NCCL_WIN_REQUIRED_ALIGNMENT;
    SymmetricBuffer buffer;
    MEGAMOE_NCCL_CHECK(ncclMemAlloc(&buffer.local, rounded));
    ncclWindow_t window = nullptr;
    MEGAMOE_NCCL_CHECK(ncclCommWindowRegister(comm_, buffer.local, rounded, &window, NCCL_WIN_COLL_SYMMETRIC));
    buffer.window = window;
    buffer.bytes = bytes;
    MEGAMOE_CUDA_CHECK(cudaMemsetAsync(buffer.local, 0, rounded, stream));
    void** resolved = nullptr;
    MEGAMOE_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&resolved), sizeof(void*) * kMaxEpRanks, stream));
    resolve_lsa_pointers_kernel<<<1, kMaxEpRanks, 0, stream>>>(window, size_, resolved);
    MEGAMOE_LAUNCH_CHECK();
    MEGAMOE_CUDA_CHECK(cudaMemcpyAsync(buffer.peers.data(), resolved, sizeof(void*) * size_,
                                       cudaMemcpyDeviceToHost, stream));
    MEGAMOE_CUDA_CHECK(cudaFreeAsync(resolved, stream));
    MEGAMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    // NOTES: peers[] are NCCL's flat LSA mappings; peers[rank] aliases `local` (same physical memory,
    // different virtual address), so kernels may use either.
    for (int r = 0; r < size_; ++r)
      MEGAMOE_CHECK(buffer.peers[r] != nullptr, "ncclGetLsaPointer returned null for rank ", r);
    buffers_.push_back(buffer);
    return buffer;
  }

  void transport_barrier(cudaStream_t stream) override {
    lsa_barrier_kernel<<<1, 32, 0, stream>>>(dev_comm_);
    MEGAMOE_LAUNCH_CHECK();
  }

  void destroy() override {
    if (destroyed_) return;
    destroyed_ = true;
    for (auto& buffer : buffers_) {
      MEGAMOE_NCCL_CHECK(ncclCommWindowDeregister(comm_, static_cast<ncclWindow_t>(buffer.window)));
      MEGAMOE_NCCL_CHECK(ncclMemFree(buffer.local));
    }
    buffers_.clear();
    if (has_dev_comm_) MEGAMOE_NCCL_CHECK(ncclDevCommDestroy(comm_, &dev_comm_));
    has_dev_comm_ = false;
    if (owns_comm_) {
      MEGAMOE_NCCL_CHECK(ncclCommFinalize(comm_));
      MEGAMOE_NCCL_CHECK(ncclCommDestroy(comm_));
    }
  }

 private:
  ncclComm_t comm_;
  bool owns_comm_;
  int rank_ = 0, size_ = 1;
  ncclDevComm dev_comm_{};
  bool has_dev_comm_ = false;
  bool destroyed_ = false;
  std::vector<SymmetricBuffer> buffers_;
};

}  // namespace

std::unique_ptr<EpTransport> make_nccl_lsa_transport(ncclComm_t comm, bool owns_comm) {
  return std::make_unique<NcclLsaTransport>(comm, owns_comm);
}

}  // namespace megamoe::ep_detail
