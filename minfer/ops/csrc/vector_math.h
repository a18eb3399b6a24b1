// Arithmetic the compiler can turn into vector instructions, shared by minfer's C++ kernels.
//
// Both helpers exist because the plainest C++ for them compiles to scalar code. A running sum `s += x[i]` must add
// its terms in order, one at a time: floating-point addition is not associative, so the compiler may not regroup
// it, and without -ffast-math it does not (`#pragma omp simd reduction` vectorizes the terms, then still adds
// them up one by one). And std::exp is a library call per value. The kernels are built per machine with
// -march=native (cpp_build.py), so a loop the compiler can vectorize runs at the width this CPU has.

#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace minfer {

// ---- reading and writing a tensor's values as float32 ------------------------------------------------------------
// The kernels compute in float32 whatever the tensor's dtype: `widen` reads a stored value, `narrow` rounds a float to
// the tensor's dtype, `rounded` is the float a value becomes when stored (where the reference rounds in between).
// For bfloat16 the three are bit moves: a bfloat16 is the upper half of a float32, and rounding to nearest even is an
// add and a shift (a NaN becomes 0x7FC0), exactly as c10::BFloat16 does it. c10's own conversions give the same
// values, but GCC does not turn a loop over them into vector instructions; these it does (measured in bfloat16:
// SiLU-and-mul seven times faster, RMSNorm five times).
inline float widen(const float* p) { return *p; }
inline float widen(const double* p) { return float(*p); }
inline float widen(const c10::Half* p) { return float(*p); }
inline float widen(const c10::BFloat16* p) {
  uint16_t raw;
  std::memcpy(&raw, p, sizeof raw);
  const uint32_t bits = uint32_t(raw) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

inline void narrow(float* p, float value) { *p = value; }
inline void narrow(double* p, float value) { *p = value; }
inline void narrow(c10::Half* p, float value) { *p = c10::Half(value); }
inline void narrow(c10::BFloat16* p, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const uint16_t raw = value != value ? uint16_t(0x7FC0) : uint16_t((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  std::memcpy(p, &raw, sizeof raw);
}

// The n values at p as float32: p itself where it holds float32, else a copy widened into `buffer`. A loop that reads
// a row many times (a key row meets every query head of its group) widens it once.
inline const float* as_float(const float* p, int64_t, float*) { return p; }
template <typename scalar_t>
inline const float* as_float(const scalar_t* p, int64_t n, float* buffer) {
  for (int64_t i = 0; i < n; ++i) buffer[i] = widen(p + i);
  return buffer;
}

template <typename scalar_t>
inline float rounded(float value) {
  scalar_t stored;
  narrow(&stored, value);
  return widen(&stored);
}

constexpr int64_t kLanes = 16;  // running partial sums: one AVX-512 register of float32, or two AVX2 ones

// part[0] + ... + part[15], added pairwise: the upper half onto the lower, then again, down to one value (part is
// used up). Every step is one vector instruction. AVX-512 has the sequence as one intrinsic; GCC's adds in this
// very order, so the two paths give the same float.
inline float sum_lanes(float (&part)[kLanes]) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps(_mm512_loadu_ps(part));
#else
  for (int64_t l = 0; l < 8; ++l) part[l] += part[l + 8];
  for (int64_t l = 0; l < 4; ++l) part[l] += part[l + 4];
  for (int64_t l = 0; l < 2; ++l) part[l] += part[l + 2];
  return part[0] + part[1];
#endif
}

// term(0) + ... + term(n - 1), in kLanes running sums: lane l takes i = l, l + kLanes, l + 2 kLanes, ... Each lane
// is a sum of its own, so a pass over kLanes terms is one vector multiply-add; the lanes are added at the end.
// With n a compile-time constant the loops unroll completely.
template <typename Term>
inline float lane_sum(int64_t n, Term&& term) {
  float part[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) part[l] += term(i + l);
  for (int64_t l = 0; i < n; ++i, ++l) part[l] += term(i);  // n not a multiple of kLanes
  return sum_lanes(part);
}

// e^x for x in [-87, 88] as 2^n * e^r: n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2], and e^r by Cephes'
// polynomial (within 2 units of the last place). Arithmetic and bit moves only, so a loop that calls it becomes
// vector instructions (a float-to-int conversion would keep GCC from vectorizing unless told that float exceptions
// do not matter). The rounding uses the float format: adding 1.5 * 2^23 leaves round(x / ln 2) in the low bits of
// the sum's mantissa, where 2^n is built from it.
inline float exp_poly(float x) {
  constexpr float kShift = 12582912.f;   // 1.5 * 2^23, whose bits are 0x4B400000
  x = x < -87.f ? -87.f : (x > 88.f ? 88.f : x);
  const float shifted = x * 1.44269504088896341f + kShift;
  const float n = shifted - kShift;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;  // ln 2 in two parts, so r keeps its low bits
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  bits = (bits - 0x4B400000 + 127) << 23;  // n + 127 into the exponent field: the float 2^n
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// silu(x) = x / (1 + e^-x), the MLP's activation: one definition for the SiLU-and-mul kernel (pointwise_cpu.cpp) and
// the gated products (linear_cpu.cpp), which must give the same floats.
inline float silu(float x) { return x / (1.f + exp_poly(-x)); }

}  // namespace minfer
