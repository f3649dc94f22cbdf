// GPU OpKernel of TfAmpUnscaleAndCheckFinite: TensorFlow glue around the CUDA launcher.
//
// Compiled only when TensorFlow itself was built with CUDA (setup.py passes -DGOOGLE_CUDA=1);
// the CUDA code lives in unscale_and_check_finite_gpu.cu.cc, free of TensorFlow headers.
// Per step: one page-locked host table, one async copy, one memset, one kernel launch; the
// scale is read and the flag written on the device, so nothing waits on the host.

#if GOOGLE_CUDA
#define EIGEN_USE_GPU

#include <vector>

#include "tensorflow/core/common_runtime/gpu/gpu_event_mgr.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_reference.h"
#include "tf_amp/cc/unscale_kernels_gpu.h"

namespace tf_amp {
namespace {

using ::tensorflow::AllocatorAttributes;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

GpuDtype ToGpuDtype(::tensorflow::DataType dtype) {
  switch (dtype) {
    case ::tensorflow::DT_HALF: return GpuDtype::kHalf;
    case ::tensorflow::DT_BFLOAT16: return GpuDtype::kBfloat16;
    case ::tensorflow::DT_DOUBLE: return GpuDtype::kDouble;
    default: return GpuDtype::kFloat;
  }
}

class UnscaleAndCheckFiniteGpuOp : public OpKernel {
 public:
  explicit UnscaleAndCheckFiniteGpuOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const int num_grads = context->num_inputs() - 1;
    const Tensor& scale = context->input(num_grads);
    // As the CPU kernel checks: the launcher reads one float from the device, so a scale of
    // another shape (unknown rank passes the shape function) was read past or in part.
    OP_REQUIRES(context, ::tensorflow::TensorShapeUtils::IsScalar(scale.shape()),
                ::tensorflow::errors::InvalidArgument(
                    "TfAmpUnscaleAndCheckFinite: scale must be a scalar, got shape ",
                    scale.shape().DebugString()));
    Tensor* all_finite = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(num_grads, TensorShape({}), &all_finite));

    // The table is written on the host into page-locked memory so the copy can be async.
    AllocatorAttributes pinned;
    pinned.set_on_host(true);
    pinned.set_gpu_compatible(true);
    const int64_t table_bytes = static_cast<int64_t>(sizeof(GpuTensorEntry)) * num_grads;
    Tensor host_table_tensor, device_table_tensor;
    OP_REQUIRES_OK(context, context->allocate_temp(::tensorflow::DT_INT8,
                                                   TensorShape({table_bytes}), &host_table_tensor,
                                                   pinned));
    OP_REQUIRES_OK(context, context->allocate_temp(::tensorflow::DT_INT8,
                                                   TensorShape({table_bytes}),
                                                   &device_table_tensor));
    auto* host_table = reinterpret_cast<GpuTensorEntry*>(host_table_tensor.data());
    for (int i = 0; i < num_grads; ++i) {
      const Tensor& input = context->input(i);
      Tensor* output = nullptr;
      OP_REQUIRES_OK(context,
                     context->forward_input_or_allocate_output({i}, i, input.shape(), &output));
      host_table[i] = GpuTensorEntry{input.data(), output->data(), input.NumElements(), 0,
                                     ToGpuDtype(input.dtype()), 0};
    }
    const int64_t total_chunks = PlanGpuTable(host_table, num_grads);

    auto* stream = context->op_device_context()->stream();
    auto* cuda_stream = reinterpret_cast<CUstream_st*>(
        stream->platform_specific_handle().stream);
    const int error = LaunchUnscaleAndCheckFinite(
        host_table, reinterpret_cast<GpuTensorEntry*>(device_table_tensor.data()), num_grads,
        total_chunks, scale.flat<float>().data(), all_finite->flat<bool>().data(), cuda_stream);
    OP_REQUIRES(context, error == 0,
                ::tensorflow::errors::Internal("TfAmpUnscaleAndCheckFinite: CUDA error ", error));

    // Keep the page-locked table alive until the async copy has run.
    ::tensorflow::TensorReference table_reference(host_table_tensor);
    context->device()->tensorflow_accelerator_device_info()->event_mgr->ThenExecute(
        stream, [table_reference]() { table_reference.Unref(); });
  }
};

REGISTER_KERNEL_BUILDER(Name("TfAmpUnscaleAndCheckFinite").Device(::tensorflow::DEVICE_GPU),
                        UnscaleAndCheckFiniteGpuOp);

}  // namespace
}  // namespace tf_amp

#endif  // GOOGLE_CUDA
