// cuDNN SDPA prefill attention (cudnn_attention.h).
#include "engine/cudnn_attention.h"

#include "megamoe/error.h"

#if defined(MEGAMOE_WITH_CUDA) && defined(MEGAMOE_WITH_CUDNN)

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <bit>
#include <cstdlib>
#include <cmath>
#include <map>
#include <mutex>
#include <unordered_map>

#include <cudnn_frontend.h>

#include "megamoe/error_cuda.h"

// The frontend's dynamic-loading shim resolves every cuDNN symbol through this handle.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace megamoe::engine::gpu {
namespace fe = cudnn_frontend;
namespace {

// Loads libcudnn once; empty string on success, else why not.
const std::string& load_cudnn() {
  static const std::string why = [] {
    // NOTES: the frontend dlopens a libcudart too, trying .so.12 before .so.13; name ours, so a
    // second runtime is never loaded beside the one this binary links.
    const std::string cudart = "libcudart.so." + std::to_string(CUDART_VERSION / 1000);
    setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart.c_str(), /*overwrite=*/0);
    for (const char* name : {"libcudnn.so.9", "libcudnn.so"}) {
      if (void* handle = dlopen(name, RTLD_NOW | RTLD_GLOBAL)) {
        fe::cudnn_dlhandle = handle;
        return std::string();
      }
    }
    const char* error = dlerror();
    return std::string("libcudnn.so.9 could not be loaded (") + (error ? error : "unknown") +
           "); put cuDNN 9's lib directory on LD_LIBRARY_PATH";
  }();
  return why;
}

void check_fe(fe::error_t status, const char* what) {
  MEGAMOE_CHECK(status.is_good(), "cuDNN SDPA ", what, ": ", status.get_message());
}

void check_status(cudnnStatus_t status, const char* what) {
  MEGAMOE_CHECK(status == CUDNN_STATUS_SUCCESS, "cuDNN ", what, " failed with status ", static_cast<int>(status));
}

enum Uid : int64_t { kQ = 1, kK, kV, kO, kSeqQ, kSeqKv, kRaggedQ, kRaggedKv };

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
};

}  // namespace

bool cudnn_attention_available(std::string* why) {
  const std::string& reason = load_cudnn();
  if (!reason.empty()) {
    if (why) *why = reason;
    return false;
  }
  const size_t version = fe::detail::get_backend_version();
  if (version < 90500) {
    if (why) *why = "cuDNN " + std::to_string(version) + " is older than 9.5 (ragged causal SDPA)";
    return false;
  }
  return true;
}

int64_t cudnn_loaded_version() {
  return cudnn_attention_available(nullptr) ? static_cast<int64_t>(fe::detail::get_backend_version()) : 0;
}

std::string cudnn_loaded_path() {
  if (!cudnn_attention_available(nullptr)) return {};
  Dl_info info{};
  void* symbol = dlsym(fe::cudnn_dlhandle, "cudnnGetVersion");
  return symbol && dladdr(symbol, &info) && info.dli_fname ? info.dli_fname : "";
}

struct CudnnVarlenAttention::Impl {
  int heads, kv_heads, head_dim;
  cudnnHandle_t handle = nullptr;
  std::map<std::pair<int64_t, int64_t>, Plan> plans;  // (sequences, padded max length)
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  int32_t* device_meta = nullptr;  // seq_len [B] | ragged q [B + 1] | ragged kv [B + 1]
  int64_t meta_capacity = 0;       // sequences

  Plan& plan_for(int64_t batch, int64_t max_len) {
    const auto key = std::make_pair(batch, max_len);
    if (auto it = plans.find(key); it != plans.end()) return it->second;
    auto graph = std::make_shared<fe::graph::Graph>();
    graph->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const int64_t H = heads, Hk = kv_heads, D = head_dim, S = max_len;
    auto index = [&](const char* name, int64_t uid, int64_t rows) {
      return graph->tensor(fe::graph::Tensor_attributes()
                               .set_name(name)
                               .set_uid(uid)
                               .set_dim({rows, 1, 1, 1})
                               .set_stride({1, 1, 1, 1})
                               .set_data_type(fe::DataType_t::INT32));
    };
    auto ragged_q = index("ragged_q", kRaggedQ, batch + 1);
    auto ragged_kv = index("ragged_kv", kRaggedKv, batch + 1);
    auto seq_q = index("seq_q", kSeqQ, batch);
    auto seq_kv = index("seq_kv", kSeqKv, batch);
    // THD: token-major rows of [heads, D]; the batch stride is replaced by the ragged offsets.
    auto thd = [&](const char* name, int64_t uid, int64_t h, std::shared_ptr<fe::graph::Tensor_attributes> ragged) {
      return graph->tensor(fe::graph::Tensor_attributes()
                               .set_name(name)
                               .set_uid(uid)
                               .set_dim({batch, h, S, D})
                               .set_stride({S * h * D, D, h * D, 1})
                               .set_ragged_offset(ragged));
    };
    auto q = thd("Q", kQ, H, ragged_q);
    auto k = thd("K", kK, Hk, ragged_kv);
    auto v = thd("V", kV, Hk, ragged_kv);
    auto options = fe::graph::SDPA_attributes()
                       .set_name("prefill")
                       .set_generate_stats(false)
                       .set_attn_scale(1.0f / std::sqrt(static_cast<float>(D)))
                       .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                       .set_diagonal_band_right_bound(0)
                       .set_padding_mask(true)
                       .set_seq_len_q(seq_q)
                       .set_seq_len_kv(seq_kv);
    auto [o, stats] = graph->sdpa(q, k, v, options);
    (void)stats;
    o->set_output(true).set_uid(kO).set_dim({batch, H, S, D}).set_stride({S * H * D, D, H * D, 1}).set_ragged_offset(ragged_q);
    check_fe(graph->validate(), "validate");
    check_fe(graph->build_operation_graph(handle), "build_operation_graph");
    check_fe(graph->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
    check_fe(graph->check_support(handle), "check_support");
    check_fe(graph->build_plans(handle), "build_plans");
    Plan plan;
    plan.graph = graph;
    check_fe(graph->get_workspace_size(plan.workspace), "get_workspace_size");
    return plans.emplace(key, std::move(plan)).first->second;
  }
};

CudnnVarlenAttention::CudnnVarlenAttention(int heads, int kv_heads, int head_dim) : impl_(std::make_unique<Impl>()) {
  std::string why;
  MEGAMOE_CHECK(cudnn_attention_available(&why), "cuDNN attention unavailable: ", why);
  MEGAMOE_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "cuDNN attention: heads = ", heads,
                " must be a positive multiple of kv_heads = ", kv_heads);
  MEGAMOE_CHECK(head_dim > 0 && head_dim % 8 == 0 && head_dim <= 256, "cuDNN attention: head_dim = ", head_dim,
                " must be a multiple of 8 in [8, 256]");
  impl_->heads = heads;
  impl_->kv_heads = kv_heads;
  impl_->head_dim = head_dim;
  check_status(fe::detail::create_handle(&impl_->handle), "create_handle");
}

CudnnVarlenAttention::~CudnnVarlenAttention() {
  if (!impl_) return;
  impl_->plans.clear();
  if (impl_->workspace) cudaFree(impl_->workspace);
  if (impl_->device_meta) cudaFree(impl_->device_meta);
  if (impl_->handle) (void)fe::detail::destroy_handle(impl_->handle);
}

void CudnnVarlenAttention::run(const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* out,
                               const std::vector<int32_t>& seq_lens, StreamHandle stream) {
  Impl& s = *impl_;
  const int64_t batch = static_cast<int64_t>(seq_lens.size());
  if (batch == 0) return;
  MEGAMOE_CHECK(q && k && v && out, "cuDNN attention: null pointer");
  int64_t longest = 0, total = 0;
  for (size_t i = 0; i < seq_lens.size(); ++i) {
    MEGAMOE_CHECK(seq_lens[i] > 0, "cuDNN attention: seq_lens[", i, "] = ", seq_lens[i], " must be positive");
    longest = std::max<int64_t>(longest, seq_lens[i]);
    total += seq_lens[i];
  }
  MEGAMOE_CHECK(total * s.heads * s.head_dim < (int64_t{1} << 31), "cuDNN attention: ", total,
                " tokens exceed the int32 ragged offsets");
  const int64_t padded = std::max<int64_t>(64, std::bit_ceil(static_cast<uint64_t>(longest)));
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  check_status(fe::detail::set_stream(s.handle, cuda_stream), "set_stream");
  Plan* found = nullptr;
  try {
    found = &s.plan_for(batch, padded);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // the frontend throws std::runtime_error for loader problems
    MEGAMOE_FAIL("cuDNN SDPA for ", batch, " sequences of up to ", padded, " tokens: ", e.what());
  }
  Plan& plan = *found;
  if (plan.workspace > s.workspace_bytes) {
    MEGAMOE_CUDA_CHECK(cudaStreamSynchronize(cuda_stream));
    if (s.workspace) MEGAMOE_CUDA_CHECK(cudaFree(s.workspace));
    MEGAMOE_CUDA_CHECK(cudaMalloc(&s.workspace, plan.workspace));
    s.workspace_bytes = plan.workspace;
  }
  if (batch > s.meta_capacity) {
    MEGAMOE_CUDA_CHECK(cudaStreamSynchronize(cuda_stream));
    if (s.device_meta) MEGAMOE_CUDA_CHECK(cudaFree(s.device_meta));
    MEGAMOE_CUDA_CHECK(cudaMalloc(&s.device_meta, sizeof(int32_t) * (3 * batch + 2)));
    s.meta_capacity = batch;
  }
  std::vector<int32_t> meta(3 * batch + 2);
  int64_t tokens = 0;
  for (int64_t i = 0; i <= batch; ++i) {
    if (i < batch) meta[i] = seq_lens[i];
    meta[batch + i] = static_cast<int32_t>(tokens * s.heads * s.head_dim);
    meta[2 * batch + 1 + i] = static_cast<int32_t>(tokens * s.kv_heads * s.head_dim);
    if (i < batch) tokens += seq_lens[i];
  }
  // NOTES: pageable source: the copy is staged before cudaMemcpyAsync returns, so `meta` may die.
  MEGAMOE_CUDA_CHECK(cudaMemcpyAsync(s.device_meta, meta.data(), sizeof(int32_t) * meta.size(),
                                     cudaMemcpyHostToDevice, cuda_stream));
  std::unordered_map<int64_t, void*> pack = {
      {kQ, const_cast<uint16_t*>(q)},
      {kK, const_cast<uint16_t*>(k)},
      {kV, const_cast<uint16_t*>(v)},
      {kO, out},
      {kSeqQ, s.device_meta},
      {kSeqKv, s.device_meta},
      {kRaggedQ, s.device_meta + batch},
      {kRaggedKv, s.device_meta + 2 * batch + 1},
  };
  check_fe(plan.graph->execute(s.handle, pack, s.workspace), "execute");
}

}  // namespace megamoe::engine::gpu

#else  // no cuDNN in this build

namespace megamoe::engine::gpu {

bool cudnn_attention_available(std::string* why) {
  if (why) *why = "built without the cuDNN path (cudnn-frontend headers not found; run scripts/install_deps.sh)";
  return false;
}

int64_t cudnn_loaded_version() { return 0; }
std::string cudnn_loaded_path() { return {}; }

struct CudnnVarlenAttention::Impl {};

CudnnVarlenAttention::CudnnVarlenAttention(int, int, int) {
  std::string why;
  cudnn_attention_available(&why);
  MEGAMOE_FAIL("cuDNN attention unavailable: ", why);
}
CudnnVarlenAttention::~CudnnVarlenAttention() = default;
void CudnnVarlenAttention::run(const uint16_t*, const uint16_t*, const uint16_t*, uint16_t*,
                               const std::vector<int32_t>&, StreamHandle) {
  MEGAMOE_FAIL("cuDNN attention unavailable in this build");
}

}  // namespace megamoe::engine::gpu

#endif
