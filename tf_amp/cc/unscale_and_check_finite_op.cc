// TfAmpUnscaleAndCheckFinite: op registration and the CPU kernel.
//
// One op over a list of gradient tensors (mixed dtypes allowed) and a loss scale. It writes
// every gradient multiplied by 1/scale and a scalar "all finite" flag, reading each element
// once. The loss-scaling optimizer calls it once per step instead of the 2-3 small ops per
// gradient (plus a stack) that Keras and tf.compat.v1 use.
//
// Why the CPU kernel looks the way it does (measured, see DESIGN.md section 6):
//  * the work is memory bound, so the output reuses the input buffer whenever TensorFlow allows
//    it (forward_input_or_allocate_output): a fresh 100 MB output page-faults and costs 3-4x the
//    arithmetic;
//  * tf.sysconfig's flags carry no -mavx/-mf16c and GCC -O2 does not vectorise, so the hot loops
//    live in unscale_kernels_cpu.h, compiled per instruction set and chosen at run time;
//  * the tensors are cut into chunks of roughly equal bytes and spread over TensorFlow's intra-op
//    thread pool, so one huge tensor and many small ones both use every core.

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

// A contiguous run of elements of one tensor, the unit of parallel work.
struct Chunk {
  int tensor_index;
  int64_t begin;
  int64_t end;
};

// About 256 KiB of input per chunk: large enough to amortise scheduling, small enough that one
// big tensor spreads over all threads.
constexpr int64_t kChunkBytes = 256 * 1024;

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
    const float inverse_scale = 1.0f / scale;
    const double inverse_scale_double = 1.0 / static_cast<double>(scale);

    std::vector<const void*> inputs(num_grads);
    std::vector<void*> outputs(num_grads);
    std::vector<DataType> dtypes(num_grads);
    std::vector<Chunk> chunks;
    for (int i = 0; i < num_grads; ++i) {
      const Tensor& input = context->input(i);
      Tensor* output = nullptr;
      OP_REQUIRES_OK(context,
                     context->forward_input_or_allocate_output({i}, i, input.shape(), &output));
      inputs[i] = input.data();
      outputs[i] = output->data();
      dtypes[i] = input.dtype();
      const int64_t size = input.NumElements();
      const int64_t chunk_elements =
          std::max<int64_t>(64, kChunkBytes / ::tensorflow::DataTypeSize(input.dtype()));
      for (int64_t begin = 0; begin < size; begin += chunk_elements) {
        chunks.push_back({i, begin, std::min(size, begin + chunk_elements)});
      }
    }

    std::atomic<bool> any_non_finite(false);
    auto run_chunks = [&](int64_t first, int64_t last) {
      bool non_finite = false;
      for (int64_t c = first; c < last; ++c) {
        const Chunk& chunk = chunks[c];
        const int i = chunk.tensor_index;
        const int64_t n = chunk.end - chunk.begin;
        switch (dtypes[i]) {
          case ::tensorflow::DT_FLOAT:
            non_finite |= kernels_.unscale_float(
                static_cast<const float*>(inputs[i]) + chunk.begin,
                static_cast<float*>(outputs[i]) + chunk.begin, n, inverse_scale);
            break;
          case ::tensorflow::DT_DOUBLE:
            non_finite |= kernels_.unscale_double(
                static_cast<const double*>(inputs[i]) + chunk.begin,
                static_cast<double*>(outputs[i]) + chunk.begin, n, inverse_scale_double);
            break;
          case ::tensorflow::DT_HALF:
            non_finite |= kernels_.unscale_half(
                static_cast<const uint16_t*>(inputs[i]) + chunk.begin,
                static_cast<uint16_t*>(outputs[i]) + chunk.begin, n, inverse_scale);
            break;
          case ::tensorflow::DT_BFLOAT16:
            non_finite |= kernels_.unscale_bfloat16(
                static_cast<const uint16_t*>(inputs[i]) + chunk.begin,
                static_cast<uint16_t*>(outputs[i]) + chunk.begin, n, inverse_scale);
            break;
          default:  // The op's type constraint makes this unreachable.
            break;
        }
      }
      if (non_finite) any_non_finite.store(true, std::memory_order_relaxed);
    };

    const int64_t num_chunks = static_cast<int64_t>(chunks.size());
    if (num_chunks == 1) {
      run_chunks(0, 1);
    } else if (num_chunks > 1) {
      // Cost per chunk in cycles, roughly: bytes in plus bytes out.
      const int64_t cost_per_chunk = 2 * kChunkBytes;
      auto* workers = context->device()->tensorflow_cpu_worker_threads()->workers;
      ::tensorflow::Shard(workers->NumThreads(), workers, num_chunks, cost_per_chunk, run_chunks);
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
