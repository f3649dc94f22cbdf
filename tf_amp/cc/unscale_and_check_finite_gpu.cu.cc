// CUDA kernel of TfAmpUnscaleAndCheckFinite; see unscale_kernels_gpu.h for the contract.
//
// Arithmetic matches the CPU kernel and the TF fallback exactly: float32 g * inv; double
// g * (1/double(scale)); half and bfloat16 widened to float32, multiplied, rounded once to
// nearest-even. The finiteness test is on the value written, so an overflow while narrowing
// is caught as well.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tf_amp/cc/unscale_kernels_gpu.h"

namespace tf_amp {
namespace {

// The launch shape. Overridable when compiling only so that scripts/gpu_sweep.sh can time
// alternatives with the harness; the op library always builds with these defaults.
#ifndef TF_AMP_GPU_THREADS_PER_BLOCK
#define TF_AMP_GPU_THREADS_PER_BLOCK 512
#endif
#ifndef TF_AMP_GPU_WORDS_IN_FLIGHT
#define TF_AMP_GPU_WORDS_IN_FLIGHT 4
#endif
constexpr int kThreadsPerBlock = TF_AMP_GPU_THREADS_PER_BLOCK;

// Each dtype works on its raw bits, so that the vector path moves whole uint4 words: a struct
// of __half lanes, copied member by member, compiles to one 2-byte store per lane (seen in the
// PTX: eight st.u16 per 16 bytes), which ran float16 at a quarter of copy bandwidth on an H100.
template <typename T>
struct Traits;

template <>
struct Traits<float> {
  using Bits = uint32_t;
  __device__ static Bits Unscale(Bits bits, float inv, double, bool& bad) {
    const float v = __uint_as_float(bits) * inv;
    bad |= !isfinite(v);
    return __float_as_uint(v);
  }
};

template <>
struct Traits<double> {
  using Bits = unsigned long long;
  __device__ static Bits Unscale(Bits bits, float, double inv_double, bool& bad) {
    const double v = __longlong_as_double(static_cast<long long>(bits)) * inv_double;
    bad |= !isfinite(v);
    return static_cast<Bits>(__double_as_longlong(v));
  }
};

template <>
struct Traits<__half> {
  using Bits = unsigned short;
  __device__ static Bits Unscale(Bits bits, float inv, double, bool& bad) {
    const Bits v = __half_as_ushort(__float2half_rn(__half2float(__ushort_as_half(bits)) * inv));
    bad |= (v & 0x7c00u) == 0x7c00u;  // exponent all ones: inf or nan
    return v;
  }
};

template <>
struct Traits<__nv_bfloat16> {
  using Bits = unsigned short;
  __device__ static Bits Unscale(Bits bits, float inv, double, bool& bad) {
    const Bits v = __bfloat16_as_ushort(
        __float2bfloat16_rn(__bfloat162float(__ushort_as_bfloat16(bits)) * inv));
    bad |= (v & 0x7f80u) == 0x7f80u;  // exponent all ones: inf or nan
    return v;
  }
};

// Unscales the elements packed in one 16-byte word.
template <typename T>
__device__ uint4 UnscaleWord(uint4 word, float inv, double inv_double, bool& bad) {
  using Bits = typename Traits<T>::Bits;
  constexpr int kLanes = 16 / sizeof(Bits);
  Bits lanes[kLanes];
  memcpy(lanes, &word, 16);
#pragma unroll
  for (int k = 0; k < kLanes; ++k) lanes[k] = Traits<T>::Unscale(lanes[k], inv, inv_double, bad);
  memcpy(&word, lanes, 16);
  return word;
}

// 16-byte words each thread loads before it stores any: enough bytes in flight per thread to
// approach copy bandwidth. In place is safe: a thread reads and writes only its own words.
constexpr int kWordsInFlight = TF_AMP_GPU_WORDS_IN_FLIGHT;

template <typename T>
__device__ bool UnscaleChunk(const GpuTensorEntry& entry, int64_t begin, int64_t end, float inv,
                             double inv_double) {
  using Bits = typename Traits<T>::Bits;
  const Bits* in = static_cast<const Bits*>(entry.in);
  Bits* out = static_cast<Bits*>(entry.out);
  bool bad = false;
  int64_t i = begin;
  if (entry.vectorized) {
    constexpr int64_t kLanes = 16 / sizeof(Bits);
    const uint4* in_words = reinterpret_cast<const uint4*>(in + begin);
    uint4* out_words = reinterpret_cast<uint4*>(out + begin);
    const int64_t words = (end - begin) / kLanes;
    const int64_t stride = blockDim.x;
    for (int64_t w = threadIdx.x; w < words; w += stride * kWordsInFlight) {
      uint4 data[kWordsInFlight];
#pragma unroll
      for (int k = 0; k < kWordsInFlight; ++k) {
        if (w + k * stride < words) data[k] = in_words[w + k * stride];
      }
#pragma unroll
      for (int k = 0; k < kWordsInFlight; ++k) {
        if (w + k * stride < words) {
          out_words[w + k * stride] = UnscaleWord<T>(data[k], inv, inv_double, bad);
        }
      }
    }
    i = begin + words * kLanes;
  }
  for (int64_t j = i + threadIdx.x; j < end; j += blockDim.x) {
    out[j] = Traits<T>::Unscale(in[j], inv, inv_double, bad);
  }
  return bad;
}

__device__ int FindTensor(const GpuTensorEntry* table, int num_tensors, int64_t chunk) {
  int low = 0, high = num_tensors - 1;  // last entry whose first_chunk <= chunk
  while (low < high) {
    const int mid = (low + high + 1) / 2;
    if (table[mid].first_chunk <= chunk) low = mid; else high = mid - 1;
  }
  return low;
}

__global__ void __launch_bounds__(kThreadsPerBlock)
UnscaleAndCheckFiniteKernel(const GpuTensorEntry* table, int num_tensors, int64_t total_chunks,
                            const float* scale, bool* all_finite) {
  // The scale stays in device memory (usually a variable): reading it here, not on the host,
  // is what keeps the step free of device-to-host synchronisation.
  const float inv = 1.0f / *scale;
  const double inv_double = 1.0 / static_cast<double>(*scale);
  bool bad = false;
  for (int64_t chunk = blockIdx.x; chunk < total_chunks; chunk += gridDim.x) {
    const GpuTensorEntry entry = table[FindTensor(table, num_tensors, chunk)];
    const int64_t begin = (chunk - entry.first_chunk) * kGpuChunkElements;
    const int64_t end = min(entry.num_elements, begin + kGpuChunkElements);
    switch (entry.dtype) {
      case GpuDtype::kFloat: bad |= UnscaleChunk<float>(entry, begin, end, inv, inv_double); break;
      case GpuDtype::kHalf: bad |= UnscaleChunk<__half>(entry, begin, end, inv, inv_double); break;
      case GpuDtype::kBfloat16:
        bad |= UnscaleChunk<__nv_bfloat16>(entry, begin, end, inv, inv_double);
        break;
      case GpuDtype::kDouble: bad |= UnscaleChunk<double>(entry, begin, end, inv, inv_double); break;
    }
  }
  // One write per block that saw a non-finite value; benign race: every writer writes false.
  if (__syncthreads_or(bad) && threadIdx.x == 0) *all_finite = false;
}

int CachedBlockLimit() {
  static const int limit = [] {
    int device = 0, sms = 0, blocks_per_sm = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, UnscaleAndCheckFiniteKernel,
                                                  kThreadsPerBlock, 0);
    return sms * (blocks_per_sm > 0 ? blocks_per_sm : 1);
  }();
  return limit;
}

}  // namespace

int GpuLaunchBlocks() { return CachedBlockLimit(); }
int GpuThreadsPerBlock() { return kThreadsPerBlock; }
int GpuWordsInFlight() { return kWordsInFlight; }

int64_t PlanGpuTable(GpuTensorEntry* host_table, int num_tensors) {
  int64_t chunks = 0;
  for (int i = 0; i < num_tensors; ++i) {
    GpuTensorEntry& entry = host_table[i];
    entry.first_chunk = chunks;
    entry.vectorized = (reinterpret_cast<uintptr_t>(entry.in) % 16 == 0) &&
                       (reinterpret_cast<uintptr_t>(entry.out) % 16 == 0);
    chunks += GpuChunkCount(entry.num_elements);
  }
  return chunks;
}

int LaunchUnscaleAndCheckFinite(const GpuTensorEntry* host_table, GpuTensorEntry* device_table,
                                int num_tensors, int64_t total_chunks, const float* scale,
                                bool* all_finite, CUstream_st* stream) {
  cudaError_t status = cudaMemsetAsync(all_finite, 1, sizeof(bool), stream);
  if (status != cudaSuccess || total_chunks == 0) return static_cast<int>(status);
  status = cudaMemcpyAsync(device_table, host_table, sizeof(GpuTensorEntry) * num_tensors,
                           cudaMemcpyHostToDevice, stream);
  if (status != cudaSuccess) return static_cast<int>(status);
  const int64_t limit = CachedBlockLimit();
  const int blocks = static_cast<int>(total_chunks < limit ? total_chunks : limit);
  UnscaleAndCheckFiniteKernel<<<blocks, kThreadsPerBlock, 0, stream>>>(
      device_table, num_tensors, total_chunks, scale, all_finite);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace tf_amp
