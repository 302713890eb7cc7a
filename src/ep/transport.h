// The transport behind EpGroup: collective symmetric allocation, peer mappings and the device comm.
// Today: NCCL LSA (NVLink load/store inside one host). An inter-node transport (NCCL GIN) would add
// a second implementation; kernels only ever see resolved peer pointers (SymmetricBuffer::peers).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "megamoe/ep.h"

namespace megamoe::ep_detail {

class EpTransport {
 public:
  virtual ~EpTransport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Collective; returns zeroed memory with every peer pointer resolved.
  virtual SymmetricBuffer allocate(size_t bytes, cudaStream_t stream) = 0;
  virtual const void* device_comm() const = 0;
  // Collective device barrier through the transport's own primitive (NCCL: ncclLsaBarrierSession).
  // NOTES: unbounded (NCCL's wait has no deadline), so only warmup() uses it.
  virtual void transport_barrier(cudaStream_t stream) = 0;
  // Frees every buffer and the device comm (and the communicator when owned). Idempotent.
  virtual void destroy() = 0;
  // EpGroup::enter_collective: nothing for NCCL (ranks are processes on their own GPUs); a bounded host
  // rendezvous for in-process ranks. `timeout_ns`: the group's wait bound.
  virtual void enter_collective(const char* /*what*/, uint64_t /*timeout_ns*/) {}
  virtual bool is_loopback() const { return false; }
};

std::unique_ptr<EpTransport> make_nccl_lsa_transport(ncclComm_t comm, bool owns_comm);
// Rank `rank` of an in-process group on one GPU (src/ep/loopback_transport.cuda.cpp; EpLoopbackFabric in megamoe/ep.h).
std::unique_ptr<EpTransport> make_loopback_transport(std::shared_ptr<EpLoopbackFabric> fabric, int rank,
                                                     uint64_t timeout_ns);
int loopback_fabric_device(const EpLoopbackFabric& fabric);

}  // namespace megamoe::ep_detail
