// Standalone check and timing of the tf_amp CUDA kernel, with no TensorFlow, for a CUDA machine
// that has none installed. Builds with the op's own kernel source:
//   nvcc -std=c++17 -O3 -I. -o harness tf_amp/cc/harness/unscale_harness.cu \
//        -x cu tf_amp/cc/unscale_and_check_finite_gpu.cu.cc
//   ./harness [--check-only] [resnet50|bert-base]...
// (a) correctness: every dtype against a host reference, bit for bit, on random data, in place,
//     out of place (output poisoned first; the input must stay as it was) and off 16-byte
//     alignment (the scalar path), on a list whose last tensor has more chunks than a launch
//     has blocks; then inf / -inf / nan injected at the first, middle and last element of the
//     first and the last tensor, and inf in each word a thread keeps in flight, in chunks
//     early and late in the grid-stride loop, must each clear the flag; (b) timing: the whole list in place, on random finite
//     data (zeros can run faster than real data), against a device-to-device copy of the same
//     bytes (the bandwidth floor for read + write); median and range of several repeats, so a
//     difference smaller than the spread reads as noise. --check-only runs (a) alone, small
//     enough for compute-sanitizer.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tf_amp/cc/unscale_kernels_gpu.h"

#define CHECK_CUDA(call)                                                               \
  do {                                                                                 \
    cudaError_t status_ = (call);                                                      \
    if (status_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(status_)); \
      std::exit(2);                                                                    \
    }                                                                                  \
  } while (0)

using tf_amp::GpuDtype;
using tf_amp::GpuTensorEntry;

std::vector<int64_t> ShapesFor(const std::string& model) {
  std::vector<int64_t> sizes;
  if (model == "bert-base") {
    const int64_t h = 768, f = 3072;
    sizes = {30522 * h, 512 * h, 2 * h, h, h};
    for (int layer = 0; layer < 12; ++layer) {
      for (int k = 0; k < 4; ++k) sizes.insert(sizes.end(), {h * h, h});
      sizes.insert(sizes.end(), {h, h, h * f, f, f * h, h, h, h});
    }
    sizes.insert(sizes.end(), {h * h, h});
    return sizes;
  }
  // ResNet-50 trainable variables, as listed by keras.applications.ResNet50(weights=None).
  const char* path = "bench/shapes/resnet50.txt";
  FILE* file = std::fopen(path, "r");
  if (file == nullptr) { std::fprintf(stderr, "missing %s\n", path); std::exit(2); }
  char line[256];
  while (std::fgets(line, sizeof(line), file) != nullptr) {
    if (line[0] != '#') sizes.push_back(std::atoll(line));  // '#' lines are comments
  }
  std::fclose(file);
  return sizes;
}

size_t ElementBytes(GpuDtype dtype) {
  switch (dtype) {
    case GpuDtype::kDouble: return 8;
    case GpuDtype::kFloat: return 4;
    default: return 2;
  }
}

// Host reference of one element, following the op's arithmetic contract; returns raw bits.
uint64_t Reference(GpuDtype dtype, uint64_t bits, float scale) {
  const float inverse = 1.0f / scale;
  switch (dtype) {
    case GpuDtype::kFloat: {
      float g; std::memcpy(&g, &bits, 4); const float v = g * inverse;
      uint32_t out; std::memcpy(&out, &v, 4); return out;
    }
    case GpuDtype::kDouble: {
      double g; std::memcpy(&g, &bits, 8); const double v = g * (1.0 / double(scale));
      uint64_t out; std::memcpy(&out, &v, 8); return out;
    }
    case GpuDtype::kHalf: {
      __half_raw raw; raw.x = uint16_t(bits);
      const __half v = __float2half_rn(__half2float(__half(raw)) * inverse);
      return __half_raw(v).x;
    }
    case GpuDtype::kBfloat16: {
      __nv_bfloat16_raw raw; raw.x = uint16_t(bits);
      const __nv_bfloat16 v = __float2bfloat16_rn(__bfloat162float(__nv_bfloat16(raw)) * inverse);
      return __nv_bfloat16_raw(v).x;
    }
  }
  return 0;
}

uint64_t FromDouble(GpuDtype dtype, double value) {
  switch (dtype) {
    case GpuDtype::kFloat: { float f = float(value); uint32_t b; std::memcpy(&b, &f, 4); return b; }
    case GpuDtype::kDouble: { uint64_t b; std::memcpy(&b, &value, 8); return b; }
    case GpuDtype::kHalf: return __half_raw(__float2half_rn(float(value))).x;
    case GpuDtype::kBfloat16: return __nv_bfloat16_raw(__float2bfloat16_rn(float(value))).x;
  }
  return 0;
}

// Where the kernel reads and writes: the op unscales in place when TensorFlow lets it reuse the
// gradient's buffer, else into a new one; a buffer off 16-byte alignment takes the scalar path.
enum class Layout { kInPlace, kOutOfPlace, kUnaligned };

const char* LayoutName(Layout layout) {
  switch (layout) {
    case Layout::kInPlace: return "in place";
    case Layout::kOutOfPlace: return "out of place";
    case Layout::kUnaligned: return "unaligned, out of place";
  }
  return "";
}

struct DeviceList {
  std::vector<GpuTensorEntry> table;
  std::vector<void*> inputs;   // where each tensor is read
  std::vector<void*> outputs;  // where it is written (== inputs in place)
  std::vector<void*> allocations;
  GpuTensorEntry* device_table = nullptr;
  GpuTensorEntry* pinned_table = nullptr;
  int64_t chunks = 0;
  size_t bytes = 0;

  DeviceList(const std::vector<int64_t>& sizes, GpuDtype dtype, Layout layout = Layout::kInPlace) {
    const size_t width = ElementBytes(dtype);
    // Unaligned: the input one element past an allocation's start, the output two.
    const size_t in_offset = layout == Layout::kUnaligned ? width : 0;
    const size_t out_offset = layout == Layout::kUnaligned ? 2 * width : 0;
    for (int64_t n : sizes) {
      void* in = Allocate(n * width + in_offset, in_offset);
      void* out = layout == Layout::kInPlace ? in : Allocate(n * width + out_offset, out_offset);
      inputs.push_back(in);
      outputs.push_back(out);
      table.push_back({in, out, n, 0, dtype, 0});
      bytes += n * width;
    }
    chunks = tf_amp::PlanGpuTable(table.data(), int(table.size()));
    CHECK_CUDA(cudaMalloc(&device_table, sizeof(GpuTensorEntry) * table.size()));
    CHECK_CUDA(cudaMallocHost(&pinned_table, sizeof(GpuTensorEntry) * table.size()));
    std::memcpy(pinned_table, table.data(), sizeof(GpuTensorEntry) * table.size());
  }
  ~DeviceList() {
    for (void* b : allocations) cudaFree(b);
    cudaFree(device_table);
    cudaFreeHost(pinned_table);
  }
  void* Allocate(size_t bytes_needed, size_t offset) {
    void* buffer = nullptr;
    CHECK_CUDA(cudaMalloc(&buffer, std::max<size_t>(1, bytes_needed)));
    allocations.push_back(buffer);
    return static_cast<char*>(buffer) + offset;
  }
  bool Run(const float* scale, bool* flag) {
    const int error = tf_amp::LaunchUnscaleAndCheckFinite(pinned_table, device_table,
                                                          int(table.size()), chunks, scale, flag,
                                                          nullptr);
    if (error != 0) { std::fprintf(stderr, "launch failed: %d\n", error); std::exit(2); }
    bool host_flag = false;
    CHECK_CUDA(cudaMemcpy(&host_flag, flag, 1, cudaMemcpyDeviceToHost));
    return host_flag;
  }
};

// Random finite values in every tensor: one host buffer, as long as the largest tensor, whose
// leading part fills each tensor.
void FillRandomFinite(DeviceList& list, const std::vector<int64_t>& sizes, GpuDtype dtype) {
  const size_t width = ElementBytes(dtype);
  int64_t largest = 0;
  for (int64_t n : sizes) largest = std::max(largest, n);
  std::vector<unsigned char> raw(std::max<int64_t>(1, largest) * width);
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int64_t i = 0; i < largest; ++i) {
    const uint64_t bits = FromDouble(dtype, normal(rng));
    std::memcpy(&raw[i * width], &bits, width);
  }
  for (size_t t = 0; t < sizes.size(); ++t) {
    CHECK_CUDA(cudaMemcpy(list.inputs[t], raw.data(), sizes[t] * width, cudaMemcpyHostToDevice));
  }
}

int CheckCorrectness(const std::vector<int64_t>& sizes, GpuDtype dtype, const char* name,
                     Layout layout, float* scale, bool* flag) {
  const float host_scale = 1536.0f;  // not a power of two: rounding must match exactly
  CHECK_CUDA(cudaMemcpy(scale, &host_scale, 4, cudaMemcpyHostToDevice));
  DeviceList list(sizes, dtype, layout);
  std::mt19937_64 rng(42);
  std::normal_distribution<double> normal(0.0, 100.0);
  const size_t width = ElementBytes(dtype);
  std::vector<std::vector<uint64_t>> inputs(sizes.size());
  for (size_t t = 0; t < sizes.size(); ++t) {
    std::vector<unsigned char> raw(sizes[t] * width);
    inputs[t].resize(sizes[t]);
    for (int64_t i = 0; i < sizes[t]; ++i) {
      inputs[t][i] = FromDouble(dtype, normal(rng));
      std::memcpy(&raw[i * width], &inputs[t][i], width);
    }
    CHECK_CUDA(cudaMemcpy(list.inputs[t], raw.data(), raw.size(), cudaMemcpyHostToDevice));
    if (list.outputs[t] != list.inputs[t]) {  // poisoned (NaN bits): an unwritten element shows
      CHECK_CUDA(cudaMemset(list.outputs[t], 0xff, raw.size()));
    }
  }
  int failures = 0;
  if (!list.Run(scale, flag)) { std::printf("  %s: finite data flagged non-finite\n", name); ++failures; }
  for (size_t t = 0; t < sizes.size(); ++t) {
    std::vector<unsigned char> raw(sizes[t] * width);
    CHECK_CUDA(cudaMemcpy(raw.data(), list.outputs[t], raw.size(), cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < sizes[t]; ++i) {
      uint64_t got = 0;
      std::memcpy(&got, &raw[i * width], width);
      if (got != Reference(dtype, inputs[t][i], host_scale)) {
        if (failures++ < 5) std::printf("  %s: tensor %zu element %lld differs\n", name, t, (long long)i);
      }
    }
    if (list.outputs[t] == list.inputs[t]) continue;
    CHECK_CUDA(cudaMemcpy(raw.data(), list.inputs[t], raw.size(), cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < sizes[t]; ++i) {  // out of place: the input is left as it was
      uint64_t got = 0;
      std::memcpy(&got, &raw[i * width], width);
      if (got != inputs[t][i] && failures++ < 5) {
        std::printf("  %s: input tensor %zu element %lld was written\n", name, t, (long long)i);
      }
    }
  }
  // One non-finite value at a time must clear the flag.
  auto detects = [&](double special, size_t t, int64_t i) {
    const uint64_t bits = FromDouble(dtype, special);
    char* address = static_cast<char*>(list.inputs[t]) + i * width;
    uint64_t saved = 0;
    CHECK_CUDA(cudaMemcpy(&saved, address, width, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(address, &bits, width, cudaMemcpyHostToDevice));
    if (list.Run(scale, flag)) {
      std::printf("  %s: %f at tensor %zu element %lld not detected\n", name, special, t, (long long)i);
      ++failures;
    }
    CHECK_CUDA(cudaMemcpy(address, &saved, width, cudaMemcpyHostToDevice));
  };
  for (double special : {double(INFINITY), -double(INFINITY), double(NAN)}) {
    for (size_t t : {size_t(0), sizes.size() - 1}) {
      for (int64_t i : {int64_t(0), sizes[t] / 2, sizes[t] - 1}) detects(special, t, i);
    }
  }
  // In the last tensor (the long one), lane 1 of every word k a thread keeps in flight (word
  // t + k x threads of a pass), for thread 3 and the last thread, in the first pass and (for
  // thread 3) the second pass over a chunk; in the tensor's first chunk, a chunk that some
  // block reaches on its second turn of the grid-stride loop, and the last full one.
  const size_t last = sizes.size() - 1;
  const int64_t lanes = int64_t(16 / width);
  const int64_t threads = tf_amp::GpuThreadsPerBlock();
  const int64_t in_flight = tf_amp::GpuWordsInFlight();
  std::vector<int64_t> words;
  for (int64_t k = 0; k < in_flight; ++k) {
    words.insert(words.end(), {3 + k * threads, threads - 1 + k * threads,
                               3 + (in_flight + k) * threads});
  }
  const int64_t last_chunks = tf_amp::GpuChunkCount(sizes[last]);
  for (int64_t chunk : {int64_t(0), int64_t(tf_amp::GpuLaunchBlocks()), last_chunks - 2}) {
    for (int64_t word : words) {
      const int64_t i = chunk * tf_amp::kGpuChunkElements + word * lanes + 1;
      if (chunk >= 0 && word * lanes < tf_amp::kGpuChunkElements && i < sizes[last]) {
        detects(INFINITY, last, i);
      }
    }
  }
  std::printf("correctness %-9s %-23s %s (%zu tensors, %s path)\n", name, LayoutName(layout),
              failures ? "FAILED" : "ok", sizes.size(), list.table[0].vectorized ? "16-byte" : "scalar");
  return failures;
}

void Time(const std::vector<int64_t>& sizes, GpuDtype dtype, const char* model, const char* name,
          float* scale, bool* flag) {
  const float one = 1.0f;
  CHECK_CUDA(cudaMemcpy(scale, &one, 4, cudaMemcpyHostToDevice));
  DeviceList list(sizes, dtype);
  FillRandomFinite(list, sizes, dtype);
  void* copy_destination = nullptr;
  void* copy_source = nullptr;
  CHECK_CUDA(cudaMalloc(&copy_destination, list.bytes));
  CHECK_CUDA(cudaMalloc(&copy_source, list.bytes));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  const int iterations = 50;
  auto mean_ms = [&](auto&& body) {
    CHECK_CUDA(cudaEventRecord(start));
    for (int i = 0; i < iterations; ++i) body();
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaGetLastError());
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    return ms / iterations;
  };
  auto kernel = [&] {
    const int error = tf_amp::LaunchUnscaleAndCheckFinite(
        list.pinned_table, list.device_table, int(list.table.size()), list.chunks, scale, flag,
        nullptr);
    if (error != 0) { std::fprintf(stderr, "launch failed: %d\n", error); std::exit(2); }
  };
  auto copy = [&] {
    CHECK_CUDA(cudaMemcpyAsync(copy_destination, copy_source, list.bytes, cudaMemcpyDeviceToDevice));
  };
  // The same three stream operations (flag set, table copy, launch) for a 1-element list: what
  // a call costs whatever the list, which a single device copy does not pay.
  DeviceList one_element({1}, dtype);
  FillRandomFinite(one_element, {1}, dtype);
  auto floor = [&] {
    const int error = tf_amp::LaunchUnscaleAndCheckFinite(
        one_element.pinned_table, one_element.device_table, 1, one_element.chunks, scale, flag,
        nullptr);
    if (error != 0) { std::fprintf(stderr, "launch failed: %d\n", error); std::exit(2); }
  };
  kernel();
  copy();
  floor();
  CHECK_CUDA(cudaDeviceSynchronize());
  // Interleaved repeats: the kernel, the copy and the floor see the same clocks and neighbours.
  std::vector<float> kernel_ms, copy_ms, floor_ms;
  for (int repeat = 0; repeat < 7; ++repeat) {
    kernel_ms.push_back(mean_ms(kernel));
    copy_ms.push_back(mean_ms(copy));
    floor_ms.push_back(mean_ms(floor));
  }
  kernel();  // the flag read below is the whole list's
  std::sort(kernel_ms.begin(), kernel_ms.end());
  std::sort(copy_ms.begin(), copy_ms.end());
  std::sort(floor_ms.begin(), floor_ms.end());
  const float kernel_median = kernel_ms[kernel_ms.size() / 2];
  const float copy_median = copy_ms[copy_ms.size() / 2];
  const float floor_median = floor_ms[floor_ms.size() / 2];
  bool host_flag = false;
  CHECK_CUDA(cudaMemcpy(&host_flag, flag, 1, cudaMemcpyDeviceToHost));
  const double gb = 2.0 * list.bytes / 1e9;  // read + write
  std::printf("timing %-9s %-8s %4zu tensors %8.1f MB: kernel %.3f ms [%.3f-%.3f] (%.0f GB/s), "
              "d2d copy %.3f ms [%.3f-%.3f] (%.0f GB/s), kernel/copy %.2fx; per-call floor "
              "(1-element list) %.3f ms, (kernel - floor)/copy %.2fx%s\n",
              model, name, sizes.size(), list.bytes / 1e6, kernel_median, kernel_ms.front(),
              kernel_ms.back(), gb / kernel_median * 1e3, copy_median, copy_ms.front(),
              copy_ms.back(), gb / copy_median * 1e3, kernel_median / copy_median, floor_median,
              (kernel_median - floor_median) / copy_median,
              host_flag ? "" : "  (FLAG WRONG: finite data flagged)");
  cudaFree(copy_destination);
  cudaFree(copy_source);
}

int main(int argc, char** argv) {
  std::vector<std::string> models;
  bool check_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--check-only") {
      check_only = true;
    } else if (std::string(argv[i]) == "resnet50" || std::string(argv[i]) == "bert-base") {
      models.push_back(argv[i]);
    } else {
      std::fprintf(stderr, "unknown argument %s (expected --check-only, resnet50, bert-base)\n", argv[i]);
      return 2;
    }
  }
  if (models.empty()) models = {"resnet50", "bert-base"};
  if (check_only) models.clear();
  cudaDeviceProp properties;
  CHECK_CUDA(cudaGetDeviceProperties(&properties, 0));
  std::printf("device: %s\n", properties.name);
  float* scale = nullptr;
  bool* flag = nullptr;
  CHECK_CUDA(cudaMalloc(&scale, sizeof(float)));
  CHECK_CUDA(cudaMalloc(&flag, sizeof(bool)));
  const std::pair<GpuDtype, const char*> dtypes[] = {{GpuDtype::kFloat, "float32"},
                                                     {GpuDtype::kHalf, "float16"},
                                                     {GpuDtype::kBfloat16, "bfloat16"},
                                                     {GpuDtype::kDouble, "float64"}};
  int failures = 0;
  // Odd lengths, an empty tensor, a chunk and a bit, and last a tensor of more chunks than one
  // launch has blocks (twice over, and a partial chunk): blocks loop over several chunks.
  const int64_t long_elements = (2 * int64_t(tf_amp::GpuLaunchBlocks()) + 3) *
                                tf_amp::kGpuChunkElements + 5;
  const std::vector<int64_t> lists = {1, 7, 4096, 65536 + 3, 0, 1000003, 33, long_elements};
  std::printf("launch: %d blocks; the checked lists end with a tensor of %lld elements (%lld chunks)\n",
              tf_amp::GpuLaunchBlocks(), (long long)long_elements,
              (long long)tf_amp::GpuChunkCount(long_elements));
  for (Layout layout : {Layout::kInPlace, Layout::kOutOfPlace, Layout::kUnaligned}) {
    for (auto [dtype, name] : dtypes) {
      failures += CheckCorrectness(lists, dtype, name, layout, scale, flag);
    }
  }
  for (const std::string& model : models) {
    const std::vector<int64_t> sizes = ShapesFor(model);
    for (auto [dtype, name] : dtypes) {
      if (dtype != GpuDtype::kDouble) {
        Time(sizes, dtype, model.c_str(), name, scale, flag);
      }
    }
  }
  return failures == 0 ? 0 : 1;
}
