// The CUDA side of TfAmpUnscaleAndCheckFinite, free of TensorFlow headers so that the same
// kernel source builds both into the op library and into a standalone test/timing harness.
//
// One launch handles every tensor: a device table describes each tensor (pointers, length,
// dtype, first chunk); blocks walk the chunks grid-stride and find their tensor by binary
// search over first_chunk. The all-finite flag lives in device memory and is only ever cleared
// by the kernel, so the caller never waits on the host.

#ifndef TF_AMP_CC_UNSCALE_KERNELS_GPU_H_
#define TF_AMP_CC_UNSCALE_KERNELS_GPU_H_

#include <cstdint>

struct CUstream_st;

namespace tf_amp {

enum class GpuDtype : int32_t { kFloat = 0, kHalf = 1, kBfloat16 = 2, kDouble = 3 };

struct GpuTensorEntry {
  const void* in;
  void* out;            // may equal `in`: unscale in place
  int64_t num_elements;
  int64_t first_chunk;  // index of this tensor's first chunk in the launch-wide chunk order
  GpuDtype dtype;
  int32_t vectorized;   // 1 when in and out are 16-byte aligned: use 16-byte loads and stores
};

// Elements of any dtype covered by one chunk (a multiple of every vector width). Overridable
// when compiling only so that scripts/gpu_sweep.sh can time alternatives with the harness. On
// an H100, 16K, 32K and 64K (each also with a trial planner that sorted the table longest
// tensor first) timed within 4% of each other on ResNet-50's and BERT-base's lists: the
// chunk's size and the blocks' fixed share of chunks are not what keeps the kernel above a
// device copy (the per-call floor is: README).
#ifndef TF_AMP_GPU_CHUNK_ELEMENTS
#define TF_AMP_GPU_CHUNK_ELEMENTS (64 * 1024)
#endif
constexpr int64_t kGpuChunkElements = TF_AMP_GPU_CHUNK_ELEMENTS;
static_assert(kGpuChunkElements % 8 == 0, "a chunk must hold whole 16-byte words of any dtype");

// Number of chunks a tensor of n elements is cut into.
inline int64_t GpuChunkCount(int64_t n) { return (n + kGpuChunkElements - 1) / kGpuChunkElements; }

// The most blocks one launch starts on the current device (resident blocks per SM x SMs): a
// launch of more chunks than this has each block loop over several (the standalone harness
// sizes a tensor from it so that its check covers that loop).
int GpuLaunchBlocks();

// The launch shape the kernel was compiled with (threads per block, 16-byte words each thread
// keeps in flight): the harness places its injected inf/nan in every word a thread holds.
int GpuThreadsPerBlock();
int GpuWordsInFlight();

// Fills the host table's first_chunk and vectorized fields; returns the total chunk count.
int64_t PlanGpuTable(GpuTensorEntry* host_table, int num_tensors);

// Enqueues on `stream`, without waiting on the host: set *all_finite = true, copy the planned
// `host_table` (page-locked, kept alive by the caller until the copy ran) to `device_table`,
// then one kernel launch that multiplies every tensor by 1/(*scale) and clears *all_finite on
// any non-finite result. `scale` and `all_finite` are device pointers. Returns the
// cudaError_t of the enqueued calls as an int (0 on success).
int LaunchUnscaleAndCheckFinite(const GpuTensorEntry* host_table, GpuTensorEntry* device_table,
                                int num_tensors, int64_t total_chunks, const float* scale,
                                bool* all_finite, CUstream_st* stream);

}  // namespace tf_amp

#endif  // TF_AMP_CC_UNSCALE_KERNELS_GPU_H_
