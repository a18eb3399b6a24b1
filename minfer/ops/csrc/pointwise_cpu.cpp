// The small per-token steps of a decoder layer on the CPU, one pass over memory each: RMSNorm, rotary, SiLU-and-mul.
//
// In PyTorch each of them is several operators: RMSNorm squares, averages, takes a reciprocal square root,
// multiplies twice; rotary negates half of every head, concatenates, multiplies twice and adds; SiLU-and-mul is
// SiLU then a product. Every operator reads its input from memory and writes a fresh output, and every one
// costs a dispatch (a few microseconds). The products of a layer are far larger, but these add up: at 500
// tokens a step, about a sixth of the layer's time. A kernel here reads its input once and writes once.
//
// The arithmetic is the reference's (minfer/model/llama.py), in float32 whatever the tensors' dtype, rounded to
// it where the reference rounds; only the order of the additions inside a sum differs. Rows are split among the
// threads by ATen's parallel_for (the threads PyTorch's own operators use); small inputs stay on one thread,
// where starting the others would cost more than the work.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "vector_math.h"

using minfer::lane_sum;
using minfer::narrow;
using minfer::rounded;
using minfer::silu;
using minfer::widen;

// rows per task: enough work (about 64k values) that sharing it out pays for waking the other threads
static int64_t grain(int64_t row_size) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(row_size, 1)); }

// out = x / sqrt(mean(x^2) + eps) * weight, row by row. x, out: [T, H] (rows may be strided); weight: [H].
template <typename scalar_t>
static void rms_norm_kernel(const torch::Tensor& x, const torch::Tensor& weight, double eps, torch::Tensor& out) {
  const int64_t rows = x.size(0), h = x.size(1), x_row = x.stride(0), out_row = out.stride(0);
  const scalar_t* xp = x.data_ptr<scalar_t>();
  scalar_t* op = out.data_ptr<scalar_t>();
  at::parallel_for(0, rows, grain(h), [&](int64_t begin, int64_t end) {
    // a local of the task, not one the task refers to: stores through `o` could change a variable outside the
    // task as far as the compiler knows, so it would read `w` again at every value and not vectorize the loop
    const scalar_t* w = weight.data_ptr<scalar_t>();
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* xr = xp + r * x_row;
      scalar_t* o = op + r * out_row;
      const float squares = lane_sum(h, [&](int64_t i) { return widen(xr + i) * widen(xr + i); });
      const float inv = 1.f / std::sqrt(squares / float(h) + float(eps));
#pragma omp simd
      for (int64_t i = 0; i < h; ++i) narrow(o + i, rounded<scalar_t>(widen(xr + i) * inv) * widen(w + i));
    }
  });
}

// In place: each head's pairs (x_i, x_{i+D/2}) rotated by the token's angle -- x*cos + rotate_half(x)*sin.
// x: [T, heads, D] (rows may be strided, heads contiguous); cos, sin: each token's row of the tables ([T, D] or
// [T, 1, D], contiguous).
template <typename scalar_t>
static void rotary_kernel(torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t tokens = x.size(0), heads = x.size(1), d = x.size(2), half = d / 2;
  const int64_t x_row = x.stride(0), x_head = x.stride(1);
  scalar_t* xp = x.data_ptr<scalar_t>();
  const scalar_t* cp = cos.data_ptr<scalar_t>();
  const scalar_t* sp = sin.data_ptr<scalar_t>();
  at::parallel_for(0, tokens, grain(heads * d), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const scalar_t* c = cp + t * d;
      const scalar_t* s = sp + t * d;
      for (int64_t hd = 0; hd < heads; ++hd) {
        scalar_t* lo = xp + t * x_row + hd * x_head;  // the first half of the head; hi: the second
        scalar_t* hi = lo + half;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = widen(lo + i), b = widen(hi + i);
          narrow(lo + i, a * widen(c + i) - b * widen(s + i));
          narrow(hi + i, b * widen(c + half + i) + a * widen(s + half + i));
        }
      }
    }
  });
}

// out = silu(gate) * up, where gate_up: [T, 2I] holds gate then up side by side (one fused product made both);
// out: [T, I]. silu(g) = g / (1 + e^-g).
template <typename scalar_t>
static void silu_mul_kernel(const torch::Tensor& gate_up, torch::Tensor& out) {
  const int64_t rows = gate_up.size(0), n = out.size(1), in_row = gate_up.stride(0), out_row = out.stride(0);
  const scalar_t* gp = gate_up.data_ptr<scalar_t>();
  scalar_t* op = out.data_ptr<scalar_t>();
  at::parallel_for(0, rows, grain(2 * n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* g = gp + r * in_row;
      const scalar_t* u = g + n;
      scalar_t* o = op + r * out_row;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        narrow(o + i, rounded<scalar_t>(silu(widen(g + i))) * widen(u + i));
      }
    }
  });
}

static void check_rows(const torch::Tensor& t, int64_t dims, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), what, " must be on the CPU");
  TORCH_CHECK(t.dim() == dims && t.stride(dims - 1) == 1, what, " must have ", dims,
              " dimensions, the last contiguous");
}

// x: [..., H], the last dimension contiguous (a 2-D x may have strided rows, as a slice of a wider product does)
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() >= 1, "x must be a tensor on the CPU");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == x.size(-1) && weight.scalar_type() == x.scalar_type(),
              "weight must be contiguous, one value per column of x, of x's dtype");
  const auto rows = x.dim() == 2 ? x : x.reshape({-1, x.size(-1)});
  check_rows(rows, 2, "x");
  auto out = torch::empty(x.sizes(), x.options());
  auto out_rows = out.view({-1, x.size(-1)});
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm",
                                  [&] { rms_norm_kernel<scalar_t>(rows, weight, eps, out_rows); });
  return out;
}

void rotary_(torch::Tensor x, const torch::Tensor& cos, const torch::Tensor& sin) {
  check_rows(x, 3, "x");
  TORCH_CHECK(x.size(2) % 2 == 0, "the head size must be even");
  for (const auto* table : {&cos, &sin})
    TORCH_CHECK(table->is_contiguous() && table->size(0) == x.size(0) && table->numel() == x.size(0) * x.size(2) &&
                    table->scalar_type() == x.scalar_type(),
                "cos and sin must be contiguous, one row of head-size values per token, of x's dtype");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rotary_",
                                  [&] { rotary_kernel<scalar_t>(x, cos, sin); });
}

torch::Tensor silu_mul(const torch::Tensor& gate_up) {
  check_rows(gate_up, 2, "gate_up");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "gate_up must hold gate and up side by side");
  auto out = torch::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate_up.scalar_type(), "silu_mul",
                                  [&] { silu_mul_kernel<scalar_t>(gate_up, out); });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "x / sqrt(mean(x^2) + eps) * weight, row by row");
  m.def("rotary_", &rotary_, "rotate each head's pairs by its token's angle, in place");
  m.def("silu_mul", &silu_mul, "silu(gate) * up, from gate and up side by side");
}
