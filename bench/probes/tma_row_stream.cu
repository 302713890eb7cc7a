// Probe: HBM read bandwidth of the weight-tile TMA patterns of the grouped GEMMs at small M, with no
// math (a consumer warp only hands each stage back). Question it answers (docs/perf.md, session 11):
// do the W4A8 kernels' FP4 tiles - 256 rows x 64 bytes per 128-K stage, rows K/2 bytes apart - stream
// slower than the FP8 tiles (rows of 128 bytes) because each stage touches only half of every row's
// 128-byte line, and would a k-blocked layout (each stage's 256 x 64 B one contiguous 16 KiB) fix it?
//
// Build: the CMake target megamoe_probe_tma_row_stream, or by hand on the device:
//   nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a bench/probes/tma_row_stream.cu -lcuda -o /tmp/p
// Output: one line per (pattern, shape, stages): µs per pass over all weights and GB/s.
#include <cuda.h>
#include <cuda/ptx>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK_CUDA(x)                                                                       \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)
#define CHECK_CU(x)                                                          \
  do {                                                                       \
    CUresult r_ = (x);                                                       \
    if (r_ != CUDA_SUCCESS) {                                                \
      std::fprintf(stderr, "%s:%d %s: %d\n", __FILE__, __LINE__, #x, (int)r_); \
      std::abort();                                                          \
    }                                                                        \
  } while (0)

constexpr int kMaxStages = 16;

struct Pattern {
  int row_box;         // rows per TMA box
  int box_bytes;       // inner bytes per box row
  int kblocked;        // 1: global rows are (tile k-block major) contiguous boxes
  int boxes_per_stage; // TMA boxes per stage (2 = two k-blocks of a strided layout)
};

// Persistent: CTA b takes tiles b, b + grid, ...; tile = (expert, n-block) n-block fastest; each tile streams
// its k-blocks through a ring of `stages` slots. Producer = thread 0, consumer = warp 1 (lane 0 waits).
__global__ void __launch_bounds__(64, 1) stream_kernel(const __grid_constant__ CUtensorMap map, int experts,
                                                       int n_blocks, int k_steps, int stages, int stage_bytes,
                                                       int row_box, int box_bytes, int kblocked,
                                                       int boxes_per_stage, int rows_per_expert) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      cuda::ptx::mbarrier_init(&full[s], 1);
      cuda::ptx::mbarrier_init(&empty[s], 1);
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  __syncthreads();
  const int tiles = experts * n_blocks;
  if (threadIdx.x == 0) {
    int stage = 0;
    uint32_t phase = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      const int e = t / n_blocks, nb = t % n_blocks;
      for (int ks = 0; ks < k_steps; ++ks) {
        while (!cuda::ptx::mbarrier_try_wait_parity(&empty[stage], phase ^ 1)) {
        }
        cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                             &full[stage], stage_bytes);
        for (int b = 0; b < boxes_per_stage; ++b) {
          const int kb = ks * boxes_per_stage + b;
          int32_t coordinates[2];
          if (kblocked) {
            coordinates[0] = 0;
            coordinates[1] = (e * k_steps * boxes_per_stage + kb) * rows_per_expert + nb * row_box;
          } else {
            coordinates[0] = kb * box_bytes;
            coordinates[1] = e * rows_per_expert + nb * row_box;
          }
          cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                          smem + stage * stage_bytes + b * row_box * box_bytes, &map, coordinates,
                                          &full[stage]);
        }
        if (++stage == stages) stage = 0, phase ^= 1;
      }
    }
  } else if (threadIdx.x == 32) {
    int stage = 0;
    uint32_t phase = 0;
    uint32_t sink = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      for (int ks = 0; ks < k_steps; ++ks) {
        while (!cuda::ptx::mbarrier_try_wait_parity(&full[stage], phase)) {
        }
        sink += smem[stage * stage_bytes + (ks & 63)];
        cuda::ptx::mbarrier_arrive(&empty[stage]);
        if (++stage == stages) stage = 0, phase ^= 1;
      }
    }
    if (sink == 0xFFFFFFFFu) printf("unlikely\n");
  }
}

int main() {
  CHECK_CUDA(cudaSetDevice(0));
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK_CUDA(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  struct Shape {
    const char* name;
    int n, k;  // weight rows, K elements per row
  };
  const Shape shapes[] = {{"dsv3-gemm2", 7168, 2048}, {"dsv3-gemm1", 4096, 7168}};
  const int experts = 32;
  for (const Shape& shape : shapes) {
    // Largest buffer: FP8 bytes (k per row); FP4 uses half of it.
    const size_t fp8_bytes = size_t(experts) * shape.n * shape.k;
    void* buffer = nullptr;
    CHECK_CUDA(cudaMalloc(&buffer, fp8_bytes));
    CHECK_CUDA(cudaMemset(buffer, 0x5A, fp8_bytes));
    void* flush = nullptr;
    const size_t flush_bytes = size_t(256) << 20;
    CHECK_CUDA(cudaMalloc(&flush, flush_bytes));
    struct Case {
      const char* name;
      int row_box, box_bytes, kblocked, boxes_per_stage, element_bits;
      CUtensorMapSwizzle swizzle;
    };
    const Case cases[] = {
        {"fp4 strided 256x64B (W4A8 today)", 256, 64, 0, 1, 4, CU_TENSOR_MAP_SWIZZLE_64B},
        {"fp4 k-blocked 256x64B contiguous", 256, 64, 1, 1, 4, CU_TENSOR_MAP_SWIZZLE_64B},
        {"fp4 strided 2x256x64B per stage", 256, 64, 0, 2, 4, CU_TENSOR_MAP_SWIZZLE_64B},
        {"fp4 strided 256x128B (256 K/stage)", 256, 128, 0, 1, 4, CU_TENSOR_MAP_SWIZZLE_128B},
        {"fp8 strided 256x128B (FP8 today)", 256, 128, 0, 1, 8, CU_TENSOR_MAP_SWIZZLE_128B},
        {"fp8 strided 128x128B", 128, 128, 0, 1, 8, CU_TENSOR_MAP_SWIZZLE_128B},
    };
    for (const Case& c : cases) {
      const uint64_t row_bytes = uint64_t(shape.k) * c.element_bits / 8;
      const int k_boxes = int(row_bytes / c.box_bytes);  // boxes per row
      const int k_steps = k_boxes / c.boxes_per_stage;
      const int n_blocks = shape.n / c.row_box;
      uint64_t inner, outer;
      if (c.kblocked) {
        inner = c.box_bytes;
        outer = uint64_t(experts) * shape.n * k_boxes;
      } else {
        inner = row_bytes;
        outer = uint64_t(experts) * shape.n;
      }
      CUtensorMap map;
      const cuuint64_t dims[2] = {inner, outer};
      const cuuint64_t strides[1] = {inner};
      const cuuint32_t box[2] = {cuuint32_t(c.box_bytes), cuuint32_t(c.row_box)};
      const cuuint32_t element_strides[2] = {1, 1};
      CHECK_CU(cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, buffer, dims, strides, box,
                                      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, c.swizzle,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
      const int stage_bytes = c.row_box * c.box_bytes * c.boxes_per_stage;
      const double total_bytes = double(experts) * shape.n * row_bytes;
      for (int stages : {4, 6, 8, 12}) {
        if (stages * stage_bytes > 200 * 1024 || stages > kMaxStages) continue;
        cudaEvent_t start, stop;
        CHECK_CUDA(cudaEventCreate(&start));
        CHECK_CUDA(cudaEventCreate(&stop));
        std::vector<float> times;
        for (int rep = 0; rep < 7; ++rep) {
          CHECK_CUDA(cudaMemsetAsync(flush, rep, flush_bytes));  // evicts the weights from L2
          CHECK_CUDA(cudaEventRecord(start));
          stream_kernel<<<sms, 64, stages * stage_bytes>>>(map, experts, n_blocks, k_steps, stages, stage_bytes,
                                                           c.row_box, c.box_bytes, c.kblocked, c.boxes_per_stage,
                                                           shape.n);
          CHECK_CUDA(cudaGetLastError());
          CHECK_CUDA(cudaEventRecord(stop));
          CHECK_CUDA(cudaEventSynchronize(stop));
          float ms = 0;
          CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
          if (rep > 0) times.push_back(ms);
        }
        std::sort(times.begin(), times.end());
        const float median = times[times.size() / 2];
        std::printf("%-11s %-36s stages %2d (%3d KiB in flight): %8.1f us  %6.0f GB/s\n", shape.name, c.name, stages,
                    stages * stage_bytes / 1024, median * 1e3, total_bytes / (median * 1e-3) / 1e9);
        CHECK_CUDA(cudaEventDestroy(start));
        CHECK_CUDA(cudaEventDestroy(stop));
      }
    }
    CHECK_CUDA(cudaFree(buffer));
    CHECK_CUDA(cudaFree(flush));
  }
  return 0;
}
