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

constexpr int kThreadsPerBlock = 512;

template <typename T>
struct Traits;

template <>
struct Traits<float> {
  __device__ static float Unscale(float g, float inv, double inv_double, bool& bad) {
    const float v = g * inv;
    bad |= !isfinite(v);
    return v;
  }
};

template <>
struct Traits<double> {
  __device__ static double Unscale(double g, float, double inv_double, bool& bad) {
    const double v = g * inv_double;
    bad |= !isfinite(v);
    return v;
  }
};

template <>
struct Traits<__half> {
  __device__ static __half Unscale(__half g, float inv, double, bool& bad) {
    const __half v = __float2half_rn(__half2float(g) * inv);
    bad |= (__half_as_ushort(v) & 0x7c00u) == 0x7c00u;
    return v;
  }
};

template <>
struct Traits<__nv_bfloat16> {
  __device__ static __nv_bfloat16 Unscale(__nv_bfloat16 g, float inv, double, bool& bad) {
    const __nv_bfloat16 v = __float2bfloat16_rn(__bfloat162float(g) * inv);
    bad |= (__bfloat16_as_ushort(v) & 0x7f80u) == 0x7f80u;
    return v;
  }
};

// 16 bytes of T: one vectorised load and store.
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kWidth = 16 / sizeof(T);
  T lane[kWidth];
};

template <typename T>
__device__ bool UnscaleChunk(const GpuTensorEntry& entry, int64_t begin, int64_t end, float inv,
                             double inv_double) {
  const T* in = static_cast<const T*>(entry.in);
  T* out = static_cast<T*>(entry.out);
  bool bad = false;
  int64_t i = begin;
  if (entry.vectorized) {
    using V = Vec16<T>;
    constexpr int kWidth = V::kWidth;
    const int64_t vector_end = begin + ((end - begin) / kWidth) * kWidth;
    for (int64_t v = begin + threadIdx.x * kWidth; v < vector_end;
         v += static_cast<int64_t>(blockDim.x) * kWidth) {
      V data = *reinterpret_cast<const V*>(in + v);
#pragma unroll
      for (int k = 0; k < kWidth; ++k) {
        data.lane[k] = Traits<T>::Unscale(data.lane[k], inv, inv_double, bad);
      }
      *reinterpret_cast<V*>(out + v) = data;
    }
    i = vector_end;
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
