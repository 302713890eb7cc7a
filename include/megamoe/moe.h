// The MoE layer API: one config, one canonical weight representation, backends behind one interface.
//
//   out[t] = sum_{j < top_k, id = topk_ids[t, j] >= 0} w[t, j] * W2_id( act( W13_id( x[t] ) ) )
//            (+ shared_expert(x[t]) when configured)
//
// with W13 = [gate; up] ([2I, H]) and act = SiLU-and-mul or clamped SwiGLU. With apply_topk_in_fc1
// the weight w[t, j] multiplies the activation output (before the requantization for GEMM 2)
// instead of the GEMM 2 output, as DeepSeek-V4 does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megamoe/formats.h"
#include "megamoe/tensor.h"
#include "megamoe/types.h"

namespace megamoe {

class EpGroup;  // ep.h: the expert-parallel group (NCCL communicator + symmetric memory)

struct MoeConfig {
  int hidden = 0;               // H
  int intermediate = 0;         // I (per expert; W13 has 2I rows)
  int num_experts = 0;          // E, global
  int top_k = 0;
  WeightFormat weight_format = WeightFormat::kBf16;
  Activation activation{};
  bool apply_topk_in_fc1 = false;
  int shared_intermediate = 0;  // > 0: one shared expert of this intermediate size (same format)
  int max_tokens_per_rank = 0;  // capacity of every EP buffer; forward() checks T against it

  // Throws megamoe::Error naming the field and the limit (e.g. "hidden = 100 must be a positive
  // multiple of 128 for weight_format fp8_block").
  void validate() const;
};

// One expert's weights in the canonical representation (formats.h). Backends transform them into
// their own layouts once, in load_expert().
struct ExpertWeights {
  formats::QuantizedMatrix w13;  // [2I, H]
  formats::QuantizedMatrix w2;   // [H, I]
};

// Tensors for one forward on one rank. CPU backends take Device::kCpu views, GPU backends kCuda.
struct MoeInputs {
  TensorView hidden;        // [T, H] bf16 (GPU and CPU) or f32 (CPU reference only)
  TensorView topk_ids;      // [T, top_k] int32, -1 = no expert (padding)
  TensorView topk_weights;  // [T, top_k] f32
  // Optional: the largest T of any rank in this forward, the SAME value on every rank (-1 = unknown).
  // Backends that choose between execution paths per forward (`mega`: fused kernel or staged pipeline,
  // src/moe/mega_path_heuristics.h) decide on it, since every rank must take the same path; unknown
  // on several ranks means the default path (mega: the fused kernel). Must be >= this rank's T and <=
  // the capacity.
  int64_t max_tokens_any_rank = -1;
};
struct MoeOutputs {
  TensorView out;  // [T, H], same dtype as hidden
};

struct Capabilities {
  std::vector<WeightFormat> formats;
  std::vector<Activation::Kind> activations;
  int min_ranks = 1, max_ranks = 1;
  bool needs_gpu = false;
  bool supports_apply_topk_in_fc1 = true;
  bool supports_shared_expert = true;
  // Empty when the backend can run `config` on `num_ranks` ranks; otherwise why not.
  std::string reject_reason(const MoeConfig& config, int num_ranks) const;
};

// Opaque stream handle (cudaStream_t on GPU backends, ignored by `reference`), so that this header
// needs no CUDA include.
using StreamHandle = void*;

class MoeBackend {
 public:
  virtual ~MoeBackend() = default;
  virtual std::string_view name() const = 0;
  virtual Capabilities capabilities() const = 0;
  virtual const MoeConfig& config() const = 0;
  // Experts this rank holds: global ids [first_local_expert, first_local_expert + num_local_experts).
  virtual int first_local_expert() const = 0;
  virtual int num_local_experts() const = 0;
  // Called once per local expert before the first forward (the backend copies what it needs).
  virtual void load_expert(int local_expert, const ExpertWeights& weights) = 0;
  virtual void load_shared_expert(const ExpertWeights& weights) = 0;
  // Allocations, layout transforms and one dry run; must precede any CUDA-graph capture.
  virtual void warmup(StreamHandle stream) = 0;
  // Collective across the EP group: every rank calls it, with T >= 0 tokens (T may differ by rank).
  virtual void forward(const MoeInputs& inputs, MoeOutputs& outputs, StreamHandle stream) = 0;
  // Idempotent; later calls of anything else throw.
  virtual void destroy() = 0;

  // Optional per-phase timing of forward() on this rank, for benchmarks (`megamoe bench layer`).
  // Backends with separable phases record CUDA events on the forward's stream at the phase
  // boundaries (`staged`); the single-kernel `mega` has its CTAs stamp %globaltimer at its phase
  // boundaries (src/moe/mega_phase_times.h says what its numbers mean); a CPU backend (`reference`)
  // keeps these defaults.
  struct PhaseTime {
    std::string phase;  // e.g. "dispatch", "gemm1", "gemm2", "combine" for `staged`
    double us = 0;
    double cta_mean_us = -1;  // mean over CTAs of the time each spent in the phase (`mega`); < 0: none
  };
  // Creates (true) or destroys (false) the backend's timing events, so call it outside CUDA-graph
  // capture; a forward made while timing is on records events and must not be captured either.
  virtual void set_phase_timing(bool /*enabled*/) {}
  // The previous forward's phases on this rank, in order (waits for its last event); empty when
  // timing is off, no forward ran since it was enabled, or the backend has no separable phases.
  virtual std::vector<PhaseTime> last_phase_times() const { return {}; }
  // Backends with more than one execution path name the one the previous forward took (`mega`:
  // "fused" = its one kernel, "split" = the staged pipeline on its weights); empty for backends with
  // one path or before the first forward.
  virtual std::string last_forward_path() const { return {}; }
};

// Device scratch and symmetric EP windows shared by MoE layers that run one after another on one
// stream -- a model's layers. A backend's memory splits into
//   per layer : its experts' weights (and nothing else);
//   shared    : the EP window (dispatch/combine regions), the grouped activations, the GEMM-1 output,
//               the expert outputs and the kernels' counters, sized by the geometry (H, I, E, top_k,
//               capacity, ranks, format), not by the number of layers.
// Layers never overlap in time (each forward is stream-ordered after the previous one, and the EP
// protocol's epochs live in the shared state), so one shared set serves all of them; a forward may
// be captured in a CUDA graph as before. docs/moe_workspace.md lists every region's size formula.
//
//   auto ws = make_moe_workspace();                        // one per process (per GPU)
//   for (layer ...) layers.push_back(make_backend("mega", config, ep, ws));  // same order on every rank
//   ws->device_bytes();                                    // shared bytes, counted once
//
// A torch engine keeps one MoeWorkspace next to its process group and hands it to every MoE layer
// module; each module still owns its backend (weights). Layers share a region when backend, geometry
// and EpGroup match; a backend made with a null EpGroup bootstraps a private group and so shares
// nothing. Creating a region is collective when it allocates symmetric memory: every rank must
// create its layers in the same order.
class MoeWorkspace {
 public:
  // What a backend keeps in the workspace (derived per backend); the sizes are for reports.
  struct Shared {
    virtual ~Shared() = default;
    size_t device_bytes = 0;     // cudaMalloc'ed scratch on this rank
    size_t symmetric_bytes = 0;  // this rank's part of symmetric windows (EpGroup::allocate)
  };
  struct Region {
    std::string key;
    size_t device_bytes = 0, symmetric_bytes = 0;
    int users = 0;  // backends alive that use it
  };

  MoeWorkspace() = default;
  MoeWorkspace(const MoeWorkspace&) = delete;
  MoeWorkspace& operator=(const MoeWorkspace&) = delete;

  // Backend side: the region for `key` (backend name + everything its sizes depend on + the group),
  // made by `create` on first use and kept for the workspace's lifetime.
  std::shared_ptr<Shared> acquire(const std::string& key, const std::function<std::shared_ptr<Shared>()>& create);
  std::vector<Region> regions() const;
  size_t device_bytes() const;     // sum over regions
  size_t symmetric_bytes() const;  // sum over regions
  // Frees every region now (its users must be destroyed first); idempotent.
  void release();

 private:
  mutable std::mutex mutex_;
  std::vector<std::pair<std::string, std::shared_ptr<Shared>>> regions_;
};
std::shared_ptr<MoeWorkspace> make_moe_workspace();

// Backend names are normalised (case, '-' vs '_'); aliases: "ref"/"cpu" -> reference,
// "staged"/"unfused" -> staged, "mega"/"megamoe"/"fused" -> mega.
std::string normalize_backend_name(std::string_view name);
std::vector<std::string> backend_names();
// `ep` may be null for single-rank use. Throws megamoe::Error listing the reason when the backend
// cannot run `config` on the group. With `workspace`, the backend takes its scratch and EP window
// from it (shared with the other layers using it); without, it allocates its own (one layer).
std::unique_ptr<MoeBackend> make_backend(std::string_view name, const MoeConfig& config, EpGroup* ep,
                                         std::shared_ptr<MoeWorkspace> workspace = nullptr);

}  // namespace megamoe
