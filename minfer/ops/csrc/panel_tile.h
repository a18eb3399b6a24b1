// A tile of a matrix product held in vector registers: the inner loop of minfer's float32 products on the CPU.
//
// y = x @ W, with W packed in column panels: each panel is kPanel columns of W stored [k, kPanel], row after row,
// so the loop below reads it as one contiguous stream. The loop holds a tile of y -- up to kTileRows rows by the
// panel's two vectors of columns -- in registers while it runs through k: each step loads two vectors of one row
// of the panel, and for each of the tile's rows broadcasts one value of x and adds its product with both vectors.
// That is 2 x rows fused multiply-adds for 2 loads of W and `rows` loads of x, so the arithmetic units, not the
// loads, set the pace (the register count sets the tile: 12 rows x 2 accumulators + 2 of W + 1 of x fill
// AVX-512's 32 registers; AVX2 has 16, so 6 rows there).
//
// Used by the model's products (linear_cpu.cpp, on weights packed once at load time) and by prefill attention
// (paged_attention_cpu.cpp, on each chunk's keys and values packed per step).

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace minfer {

#if defined(__AVX512F__)
constexpr int64_t kWidth = 16;     // floats in a vector register
constexpr int64_t kTileRows = 12;  // 12 x 2 accumulators + 2 vectors of W + 1 of x: 27 of 32 registers
#else
constexpr int64_t kWidth = 8;      // AVX2's width (the compiler splits or emulates it on other CPUs)
constexpr int64_t kTileRows = 6;   // 6 x 2 accumulators + 3: 15 of 16 registers
#endif
constexpr int64_t kPanel = 2 * kWidth;  // a panel's columns: two vectors
constexpr int64_t kChunk = 64;          // terms of a sum added in one chain (see tile)

typedef float Vec __attribute__((vector_size(kWidth * sizeof(float))));  // GCC/Clang vector of kWidth floats

inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);  // an unaligned vector load
  return v;
}

// y[0..ROWS) x [0..cols) = x[0..ROWS) @ panel: the panel is [k_size, kPanel]; rows of x and y are x_row and y_row
// floats apart; `next`, when not null, is where to fetch rows of another panel into the cache meanwhile: one row
// every `every` steps of k (so that the row tiles of a panel, `every` of them, share the fetching evenly). ROWS is
// a compile-time constant, so the compiler keeps every accumulator in a register. The sum over k runs in chunks of
// kChunk, each summed afresh and then added to the total: a float sum's rounding error grows with the length of its
// chain of additions, and 1,536 terms in one chain drift visibly (logits 1e-4 off PyTorch's, whose library sums in
// blocks too); chunks of 64 keep every chain short.
template <int64_t ROWS>
void tile(const float* x, int64_t x_row, const float* panel, int64_t k_size, float* y, int64_t y_row,
          int64_t cols, const float* next, int64_t every) {
  Vec total[ROWS][2] = {};
  int64_t count = 0;
  for (int64_t k0 = 0; k0 < k_size; k0 += kChunk) {
    Vec acc[ROWS][2] = {};
    for (int64_t k = k0; k < std::min(k0 + kChunk, k_size); ++k) {
      const Vec w0 = load(panel + k * kPanel), w1 = load(panel + k * kPanel + kWidth);
      if (next && ++count == every) {  // a row of the next panel (two cache lines with AVX-512, one with AVX2)
        count = 0;
        __builtin_prefetch(next);
        __builtin_prefetch(next + kWidth);
        next += kPanel;
      }
      for (int64_t r = 0; r < ROWS; ++r) {
        const float a = x[r * x_row + k];  // one value of x, broadcast to every lane
        acc[r][0] += a * w0;
        acc[r][1] += a * w1;
      }
    }
    for (int64_t r = 0; r < ROWS; ++r) {
      total[r][0] += acc[r][0];
      total[r][1] += acc[r][1];
    }
  }
  for (int64_t r = 0; r < ROWS; ++r) std::memcpy(y + r * y_row, total[r], cols * sizeof(float));
}

// tile<rows> for a row count known only at run time (1..kTileRows): one compiled tile per count.
template <int64_t ROWS = kTileRows>
void tile_of(int64_t rows, const float* x, int64_t x_row, const float* panel, int64_t k_size, float* y,
             int64_t y_row, int64_t cols, const float* next = nullptr, int64_t every = 1) {
  if constexpr (ROWS > 0) {
    if (rows == ROWS) return tile<ROWS>(x, x_row, panel, k_size, y, y_row, cols, next, every);
    tile_of<ROWS - 1>(rows, x, x_row, panel, k_size, y, y_row, cols, next, every);
  }
}

}  // namespace minfer
