// CPU inner loops of TfAmpUnscaleAndCheckFinite, one set per instruction-set level.
//
// Each function multiplies n elements by inverse_scale (half and bfloat16 through float32,
// rounded once to nearest-even), writes them to `out` (which may equal `in`: in-place unscale)
// and returns true if any written element is inf or nan. The test is branch-free on exponent
// bits so the compiler keeps the loop vectorised. Kept free of TensorFlow headers so that the
// same code can be exercised by a standalone harness.

#ifndef TF_AMP_CC_UNSCALE_KERNELS_CPU_H_
#define TF_AMP_CC_UNSCALE_KERNELS_CPU_H_

#include <cstdint>

namespace tf_amp {

struct CpuKernels {
  bool (*unscale_float)(const float* in, float* out, int64_t n, float inverse_scale);
  bool (*unscale_double)(const double* in, double* out, int64_t n, double inverse_scale);
  bool (*unscale_half)(const uint16_t* in, uint16_t* out, int64_t n, float inverse_scale);
  bool (*unscale_bfloat16)(const uint16_t* in, uint16_t* out, int64_t n, float inverse_scale);
  const char* name;  // "avx2+f16c" or "portable", for logs and benchmarks
};

// The fastest set this processor supports, chosen once at run time (cpuid), so the library is
// built with TensorFlow's portable flags yet uses AVX2/F16C where present.
CpuKernels SelectCpuKernels();

// The portable set, whatever the processor: lets tests compare both paths bit for bit.
CpuKernels PortableCpuKernels();

}  // namespace tf_amp

#endif  // TF_AMP_CC_UNSCALE_KERNELS_CPU_H_
