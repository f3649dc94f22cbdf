// TfAmpUnscaleAndCheckFinite: op registration and the CPU kernel.
//
// One op over a list of gradient tensors (mixed dtypes allowed) and a loss scale. It writes
// every gradient multiplied by 1/scale and a scalar "all finite" flag, reading each element
// once. The loss-scaling optimizer calls it once per step instead of the 2-3 small ops per
// gradient (plus a stack) that Keras and tf.compat.v1 use.
//
// Why the CPU kernel looks the way it does (measured on ResNet-50's gradients, 214 tensors and
// 102 MB in float32, on a CPU that reads memory at about 28 GB/s; bench/finite_check.py
// repeats the comparison with Keras's and tf.compat.v1's per-tensor ops):
//  * the work is memory bound, so the output reuses the input buffer whenever TensorFlow allows
//    it (forward_input_or_allocate_output): a fresh 100 MB output page-faults and costs 3-4x the
//    arithmetic;
//  * tf.sysconfig's flags carry no -mavx/-mf16c and GCC -O2 does not vectorise, so the hot loops
//    live in unscale_kernels_cpu.h, compiled per instruction set and chosen at run time;
//  * the tensors, laid end to end, are cut into units of equal bytes spread over TensorFlow's
//    intra-op thread pool, so one huge tensor uses every core and many tiny ones cost one job.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/threadpool.h"
#include "tensorflow/core/util/work_sharder.h"
#include "tf_amp/cc/unscale_kernels_cpu.h"

namespace tf_amp {

using ::tensorflow::DataType;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

REGISTER_OP("TfAmpUnscaleAndCheckFinite")
    .Input("grads: T")
    .Input("scale: float")
    .Output("unscaled: T")
    .Output("all_finite: bool")
    .Attr("T: list({half, bfloat16, float, double}) >= 0")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      const int num_grads = c->num_inputs() - 1;
      ::tensorflow::shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(num_grads), 0, &unused));
      for (int i = 0; i < num_grads; ++i) c->set_output(i, c->input(i));
      c->set_output(num_grads, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Multiplies every gradient by 1/scale and reports whether all results are finite.

grads: gradients of any mix of half, bfloat16, float and double.
scale: the loss scale (float32 scalar).
unscaled: grads[i] * (1/scale), same dtype and shape; half and bfloat16 are computed in float32
  and rounded once; double uses 1/double(scale).
all_finite: true iff every element of every output is finite.
)doc");

namespace {

// The gradients, laid end to end in one virtual byte range, are cut into units of equal size:
// a unit may span many small tensors or a slice of one large tensor, so a ResNet's 214
// tensors and a single 100 MB tensor both split into evenly sized jobs, and a list of tiny
// tensors costs one job, not one per tensor.
struct TensorSpan {
  const void* in;
  void* out;
  DataType dtype;
  int64_t element_bytes;
  int64_t begin;  // virtual byte offset; a multiple of 8 so that unit cuts fall between elements
  int64_t end;
};

// About 256 KiB of input per unit: large enough to amortise scheduling, small enough that one
// big tensor spreads over all threads.
constexpr int64_t kUnitBytes = 256 * 1024;

bool UnscaleElements(const CpuKernels& kernels, const TensorSpan& span, int64_t first,
                     int64_t count, float inverse, double inverse_double) {
  switch (span.dtype) {
    case ::tensorflow::DT_FLOAT:
      return kernels.unscale_float(static_cast<const float*>(span.in) + first,
                                   static_cast<float*>(span.out) + first, count, inverse);
    case ::tensorflow::DT_DOUBLE:
      return kernels.unscale_double(static_cast<const double*>(span.in) + first,
                                    static_cast<double*>(span.out) + first, count,
                                    inverse_double);
    case ::tensorflow::DT_HALF:
      return kernels.unscale_half(static_cast<const uint16_t*>(span.in) + first,
                                  static_cast<uint16_t*>(span.out) + first, count, inverse);
    case ::tensorflow::DT_BFLOAT16:
      return kernels.unscale_bfloat16(static_cast<const uint16_t*>(span.in) + first,
                                      static_cast<uint16_t*>(span.out) + first, count, inverse);
    default:  // The op's type constraint makes this unreachable.
      return false;
  }
}

// Unscales the virtual byte range [low, high); returns true if it saw a non-finite value.
bool UnscaleByteRange(const CpuKernels& kernels, const std::vector<TensorSpan>& spans,
                      int64_t low, int64_t high, float inverse, double inverse_double) {
  auto span = std::upper_bound(spans.begin(), spans.end(), low,
                               [](int64_t offset, const TensorSpan& s) { return offset < s.end; });
  bool non_finite = false;
  for (; span != spans.end() && span->begin < high; ++span) {
    const int64_t first_byte = std::max(low, span->begin) - span->begin;
    const int64_t last_byte = std::min(high, span->end) - span->begin;
    if (last_byte <= first_byte) continue;
    non_finite |= UnscaleElements(kernels, *span, first_byte / span->element_bytes,
                                  (last_byte - first_byte) / span->element_bytes, inverse,
                                  inverse_double);
  }
  return non_finite;
}

class UnscaleAndCheckFiniteCpuOp : public OpKernel {
 public:
  explicit UnscaleAndCheckFiniteCpuOp(OpKernelConstruction* context)
      : OpKernel(context), kernels_(SelectCpuKernels()) {}

  void Compute(OpKernelContext* context) override {
    const int num_grads = context->num_inputs() - 1;
    const Tensor& scale_tensor = context->input(num_grads);
    OP_REQUIRES(context, ::tensorflow::TensorShapeUtils::IsScalar(scale_tensor.shape()),
                ::tensorflow::errors::InvalidArgument(
                    "TfAmpUnscaleAndCheckFinite: scale must be a scalar, got shape ",
                    scale_tensor.shape().DebugString()));
    const float scale = scale_tensor.scalar<float>()();
    const float inverse = 1.0f / scale;
    const double inverse_double = 1.0 / static_cast<double>(scale);

    std::vector<TensorSpan> spans;
    spans.reserve(num_grads);
    int64_t total_bytes = 0;
    for (int i = 0; i < num_grads; ++i) {
      const Tensor& input = context->input(i);
      Tensor* output = nullptr;
      OP_REQUIRES_OK(context,
                     context->forward_input_or_allocate_output({i}, i, input.shape(), &output));
      const int64_t bytes = static_cast<int64_t>(input.TotalBytes());
      if (bytes == 0) continue;
      const int64_t begin = (total_bytes + 7) / 8 * 8;
      spans.push_back({input.data(), output->data(), input.dtype(),
                       ::tensorflow::DataTypeSize(input.dtype()), begin, begin + bytes});
      total_bytes = begin + bytes;
    }

    std::atomic<bool> any_non_finite(false);
    const int64_t num_units = (total_bytes + kUnitBytes - 1) / kUnitBytes;
    auto run_units = [&](int64_t first, int64_t last) {
      const bool non_finite =
          UnscaleByteRange(kernels_, spans, first * kUnitBytes,
                           std::min(total_bytes, last * kUnitBytes), inverse, inverse_double);
      if (non_finite) any_non_finite.store(true, std::memory_order_relaxed);
    };
    if (num_units <= 1) {
      run_units(0, num_units);  // one unit or none: not worth waking the thread pool
    } else {
      auto* workers = context->device()->tensorflow_cpu_worker_threads()->workers;
      // Cost of a unit in cycles, roughly: reading and writing its bytes.
      ::tensorflow::Shard(workers->NumThreads(), workers, num_units, 2 * kUnitBytes, run_units);
    }

    Tensor* all_finite = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(num_grads, TensorShape({}), &all_finite));
    all_finite->scalar<bool>()() = !any_non_finite.load();
  }

 private:
  const CpuKernels kernels_;
};

REGISTER_KERNEL_BUILDER(Name("TfAmpUnscaleAndCheckFinite").Device(::tensorflow::DEVICE_CPU),
                        UnscaleAndCheckFiniteCpuOp);

}  // namespace
}  // namespace tf_amp
