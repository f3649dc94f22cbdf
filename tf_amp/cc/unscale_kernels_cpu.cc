// CPU inner loops of TfAmpUnscaleAndCheckFinite; see unscale_kernels_cpu.h for the contract.
//
// The same templated loops are instantiated twice: once for the baseline x86-64 (or any other)
// target and once under __attribute__((target("avx2,fma,f16c"))), where GCC vectorises them
// 8 floats wide. Half precision gets explicit F16C intrinsics because no compiler vectorises
// the software half<->float conversion: without F16C it runs ~16x below memory speed.

#include "tf_amp/cc/unscale_kernels_cpu.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define TF_AMP_X86 1
#endif

namespace tf_amp {
namespace {

#define TF_AMP_INLINE inline __attribute__((always_inline))

TF_AMP_INLINE uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

TF_AMP_INLINE float BitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

TF_AMP_INLINE uint64_t DoubleBits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// In place, the loop reads and writes through one pointer: no aliasing question for the
// vectoriser. Out of place, the pointers are distinct buffers and marked __restrict.
template <typename Scalar, typename Step>
TF_AMP_INLINE bool UnscaleLoop(const Scalar* in, Scalar* out, int64_t n, Step step) {
  uint32_t non_finite = 0;
  if (in == out) {
    for (int64_t i = 0; i < n; ++i) out[i] = step(out[i], non_finite);
  } else {
    const Scalar* __restrict src = in;
    Scalar* __restrict dst = out;
    for (int64_t i = 0; i < n; ++i) dst[i] = step(src[i], non_finite);
  }
  return non_finite != 0;
}

TF_AMP_INLINE bool UnscaleFloatBody(const float* in, float* out, int64_t n, float inverse) {
  return UnscaleLoop(in, out, n, [inverse](float g, uint32_t& non_finite) {
    const float value = g * inverse;
    non_finite |= (FloatBits(value) & 0x7f800000u) == 0x7f800000u;
    return value;
  });
}

TF_AMP_INLINE bool UnscaleDoubleBody(const double* in, double* out, int64_t n, double inverse) {
  return UnscaleLoop(in, out, n, [inverse](double g, uint32_t& non_finite) {
    const double value = g * inverse;
    constexpr uint64_t kExponent = 0x7ff0000000000000ull;
    non_finite |= (DoubleBits(value) & kExponent) == kExponent;
    return value;
  });
}

// bfloat16 is the top half of a float32: widen by a shift, narrow with round-to-nearest-even
// (as Eigen::bfloat16 does); nan stays a quiet nan of the same sign, as Eigen's scalar
// conversion keeps it. tf.cast's vectorised loop drops that sign, so against the TF-ops
// fallback a nan can differ in its sign bit, never in being a nan.
TF_AMP_INLINE uint16_t FloatToBfloat16(uint32_t bits) {
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = ((bits >> 16) & 0x8000u) | 0x7fc0u;
  const bool is_nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(is_nan ? quiet_nan : rounded);
}

TF_AMP_INLINE bool UnscaleBfloat16Body(const uint16_t* in, uint16_t* out, int64_t n,
                                       float inverse) {
  return UnscaleLoop(in, out, n, [inverse](uint16_t g, uint32_t& non_finite) {
    const float value = BitsToFloat(static_cast<uint32_t>(g) << 16) * inverse;
    const uint16_t narrowed = FloatToBfloat16(FloatBits(value));
    non_finite |= (narrowed & 0x7f80u) == 0x7f80u;
    return narrowed;
  });
}

// IEEE binary16 <-> binary32 in software, exact and round-to-nearest-even: the portable path.
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return BitsToFloat(sign);
  int shift = 0;  // subnormal half: normalise
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    ++shift;
  }
  mantissa &= 0x3ffu;
  return BitsToFloat(sign | (static_cast<uint32_t>(113 - shift) << 23) | (mantissa << 13));
}

uint16_t FloatToHalf(float value) {
  const uint32_t bits = FloatBits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu);  // nan
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // rounds to inf (or is inf)
  if (magnitude >= 0x38800000u) {                       // normal half
    const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
    return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
  }
  if (magnitude < 0x33000000u) return sign;  // below half the smallest subnormal: zero
  // Subnormal half: shift the implicit-one mantissa into place, rounding to nearest-even.
  const uint32_t exponent = magnitude >> 23;
  const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exponent;  // 14..24
  const uint32_t halfway = 1u << (shift - 1);
  const uint32_t remainder = mantissa & ((1u << shift) - 1);
  uint32_t result = mantissa >> shift;
  if (remainder > halfway || (remainder == halfway && (result & 1u))) ++result;
  return sign | static_cast<uint16_t>(result);
}

bool UnscaleHalfPortable(const uint16_t* in, uint16_t* out, int64_t n, float inverse) {
  uint32_t non_finite = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t narrowed = FloatToHalf(HalfToFloat(in[i]) * inverse);
    non_finite |= (narrowed & 0x7c00u) == 0x7c00u;
    out[i] = narrowed;
  }
  return non_finite != 0;
}

bool UnscaleFloatPortable(const float* in, float* out, int64_t n, float inverse) {
  return UnscaleFloatBody(in, out, n, inverse);
}
bool UnscaleDoublePortable(const double* in, double* out, int64_t n, double inverse) {
  return UnscaleDoubleBody(in, out, n, inverse);
}
bool UnscaleBfloat16Portable(const uint16_t* in, uint16_t* out, int64_t n, float inverse) {
  return UnscaleBfloat16Body(in, out, n, inverse);
}

#ifdef TF_AMP_X86
#define TF_AMP_AVX2 __attribute__((target("avx2,fma,f16c")))

TF_AMP_AVX2 bool UnscaleFloatAvx2(const float* in, float* out, int64_t n, float inverse) {
  return UnscaleFloatBody(in, out, n, inverse);
}
TF_AMP_AVX2 bool UnscaleDoubleAvx2(const double* in, double* out, int64_t n, double inverse) {
  return UnscaleDoubleBody(in, out, n, inverse);
}
TF_AMP_AVX2 bool UnscaleBfloat16Avx2(const uint16_t* in, uint16_t* out, int64_t n,
                                     float inverse) {
  return UnscaleBfloat16Body(in, out, n, inverse);
}

// Eight halves per step: widen (vcvtph2ps), multiply, narrow with round-to-nearest-even
// (vcvtps2ph), then test the narrowed exponent bits, so overflow while narrowing counts too.
TF_AMP_AVX2 bool UnscaleHalfF16c(const uint16_t* in, uint16_t* out, int64_t n, float inverse) {
  const __m256 inverse8 = _mm256_set1_ps(inverse);
  const __m128i exponent_mask = _mm_set1_epi16(0x7c00);
  __m128i non_finite8 = _mm_setzero_si128();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i g = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m256 value = _mm256_mul_ps(_mm256_cvtph_ps(g), inverse8);
    const __m128i narrowed = _mm256_cvtps_ph(value, _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), narrowed);
    non_finite8 = _mm_or_si128(
        non_finite8, _mm_cmpeq_epi16(_mm_and_si128(narrowed, exponent_mask), exponent_mask));
  }
  uint32_t non_finite = _mm_testz_si128(non_finite8, non_finite8) ? 0u : 1u;
  for (; i < n; ++i) {
    const uint16_t narrowed = _cvtss_sh(_cvtsh_ss(in[i]) * inverse, _MM_FROUND_TO_NEAREST_INT);
    non_finite |= (narrowed & 0x7c00u) == 0x7c00u;
    out[i] = narrowed;
  }
  return non_finite != 0;
}
#endif  // TF_AMP_X86

}  // namespace

CpuKernels PortableCpuKernels() {
  return {UnscaleFloatPortable, UnscaleDoublePortable, UnscaleHalfPortable,
          UnscaleBfloat16Portable, "portable"};
}

CpuKernels SelectCpuKernels() {
  // TF_AMP_CPU_KERNELS=portable pins the portable loops (tests compare both paths bit for bit).
  const char* forced = std::getenv("TF_AMP_CPU_KERNELS");
  if (forced != nullptr && std::strcmp(forced, "portable") == 0) return PortableCpuKernels();
#ifdef TF_AMP_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    return {UnscaleFloatAvx2, UnscaleDoubleAvx2, UnscaleHalfF16c, UnscaleBfloat16Avx2,
            "avx2+f16c"};
  }
#endif
  return PortableCpuKernels();
}

}  // namespace tf_amp
