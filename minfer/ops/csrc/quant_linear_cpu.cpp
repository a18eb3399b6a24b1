// The model's matrix products y = x @ W on the CPU with W stored in int8 or 4 bits (minfer/quant/formats.py): each
// weight is turned back into a float inside the inner loop, so the float32 matrix is never built, and a decode step
// reads a quarter (int8) or about a sixth (q4) of the bytes a float32 product reads.
//
// The same tile as the float32 products (panel_tile.h): a tile of y -- up to kTileRows rows by a panel's two vectors
// of columns -- held in registers while the loop runs through k, each row of the panel serving every row of the
// tile. Only the panel's rows differ: kPanel bytes of int8 (or kPanel 4-bit values in kWidth bytes) instead of
// kPanel floats, widened to two vectors of floats as they are loaded (`decode`).
//
// The formats keep one float16 scale (and for q4 one minimum) per group of `group` rows of k and per column, so the
// loop runs group by group. Within a group it sums x * q, the integers as floats; at the group's end it multiplies
// that sum by the group's scales and adds it to the total:
//     sum_k x_k * (scale * q_k + min) = scale * (sum_k x_k * q_k) + min * (sum_k x_k)
// so each weight costs its conversion to float and one multiply-add, and the scale one multiply a group. q4's
// minimum needs each row's sum of x over the group, the same for every column: computed once per product (`sums`).
// The groups (32 terms) also keep each chain of float additions short, as panel_tile.h's chunks do.
//
// Packed once, at load (minfer/ops/quant_linear.py, `pack`): a panel of kPanel columns is a run of blocks, one per
// group, each block its kPanel scales (float16), for q4 its kPanel minimums, then its rows of values -- a GGUF block
// widened to a panel's columns. A tile reads its panel as one stream, front to back, and fetches the next panel
// meanwhile, as linear_cpu.cpp does. q4's values: byte c of a row holds column c in its low four bits and column
// c + kWidth in its high four, so one load and two masks give the panel's two vectors.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "panel_tile.h"
#include "vector_math.h"

namespace {

using minfer::kPanel;
using minfer::kTileRows;
using minfer::kWidth;
using minfer::silu;
using minfer::Vec;

typedef int32_t Ints __attribute__((vector_size(kWidth * sizeof(int32_t))));  // kWidth int32 lanes

// Widening kWidth bytes (or float16 values) to a vector of int32 (or float): one instruction each with AVX-512 or
// AVX2, written out because GCC turns the portable spelling (__builtin_convertvector from bytes) into a loop of
// scalar conversions. Elsewhere, that loop.
#if defined(__AVX512F__)
inline Ints widen_signed(const uint8_t* p) {
  return (Ints)_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline Ints widen_unsigned(const uint8_t* p) {
  return (Ints)_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline Vec halves(const uint8_t* p) {
  return (Vec)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
#elif defined(__AVX2__) && defined(__F16C__)
inline Ints widen_signed(const uint8_t* p) {
  return (Ints)_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline Ints widen_unsigned(const uint8_t* p) {
  return (Ints)_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline Vec halves(const uint8_t* p) {
  return (Vec)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
#else
inline Ints widen_signed(const uint8_t* p) {
  Ints v;
  for (int64_t i = 0; i < kWidth; ++i) v[i] = int8_t(p[i]);
  return v;
}
inline Ints widen_unsigned(const uint8_t* p) {
  Ints v;
  for (int64_t i = 0; i < kWidth; ++i) v[i] = p[i];
  return v;
}
inline Vec halves(const uint8_t* p) {
  Vec v;
  for (int64_t i = 0; i < kWidth; ++i) {
    _Float16 h;
    std::memcpy(&h, p + i * sizeof h, sizeof h);
    v[i] = float(h);
  }
  return v;
}
#endif

// A row of a panel (kPanel columns at one k), widened to two vectors of floats.
struct Int8Format {
  static constexpr int64_t kRowBytes = kPanel;  // a byte a column
  static constexpr bool kMins = false;          // w = scale * q
  static void decode(const uint8_t* row, Vec& w0, Vec& w1) {
    w0 = __builtin_convertvector(widen_signed(row), Vec);
    w1 = __builtin_convertvector(widen_signed(row + kWidth), Vec);
  }
};

struct Q4Format {
  static constexpr int64_t kRowBytes = kWidth;  // half a byte a column
  static constexpr bool kMins = true;           // w = scale * q + min
  static void decode(const uint8_t* row, Vec& w0, Vec& w1) {
    const Ints v = widen_unsigned(row);
    w0 = __builtin_convertvector(v & 15, Vec);  // columns 0 .. kWidth - 1: the low four bits
    w1 = __builtin_convertvector(v >> 4, Vec);  // columns kWidth .. kPanel - 1: the high four
  }
};

// Bytes of one block: kPanel float16 scales, kPanel float16 minimums (q4), `group` rows of values.
template <typename F>
constexpr int64_t header_bytes() { return (F::kMins ? 2 : 1) * kPanel * int64_t(sizeof(_Float16)); }

template <typename F>
int64_t block_bytes(int64_t group) { return header_bytes<F>() + group * F::kRowBytes; }

// y[0..ROWS) x [0..cols) = x[0..ROWS) @ the panel's weights. sums: each row's sum of x over each group (q4), rows
// `sums_row` apart. next, when not null, is the next panel to fetch into the cache meanwhile: this tile, the
// `part`-th of `parts`, fetches that share of each of its blocks.
template <int64_t ROWS, typename F>
void tile(const float* x, int64_t x_row, const float* sums, int64_t sums_row, const uint8_t* panel,
          int64_t k_size, int64_t group, float* y, int64_t y_row, int64_t cols, const uint8_t* next, int64_t part,
          int64_t parts) {
  const int64_t block = block_bytes<F>(group);
  const int64_t fetch_from = part * block / parts, fetch_to = (part + 1) * block / parts;
  Vec total[ROWS][2] = {};
  for (int64_t k0 = 0, g = 0; k0 < k_size; k0 += group, ++g) {
    const uint8_t* head = panel + g * block;
    const uint8_t* values = head + header_bytes<F>();
    if (next)
      for (int64_t at = fetch_from; at < fetch_to; at += 64) __builtin_prefetch(next + g * block + at);
    Vec acc[ROWS][2] = {};
    for (int64_t k = 0, n = std::min(group, k_size - k0); k < n; ++k) {
      Vec w0, w1;
      F::decode(values + k * F::kRowBytes, w0, w1);
      for (int64_t r = 0; r < ROWS; ++r) {
        const float a = x[r * x_row + k0 + k];  // one value of x, broadcast to every lane
        acc[r][0] += a * w0;
        acc[r][1] += a * w1;
      }
    }
    const Vec scale0 = halves(head), scale1 = halves(head + kWidth * sizeof(_Float16));
    for (int64_t r = 0; r < ROWS; ++r) {
      total[r][0] += scale0 * acc[r][0];
      total[r][1] += scale1 * acc[r][1];
    }
    if constexpr (F::kMins) {
      const uint8_t* mins = head + kPanel * sizeof(_Float16);
      const Vec min0 = halves(mins), min1 = halves(mins + kWidth * sizeof(_Float16));
      for (int64_t r = 0; r < ROWS; ++r) {
        const float s = sums[r * sums_row + g];
        total[r][0] += min0 * s;
        total[r][1] += min1 * s;
      }
    }
  }
  for (int64_t r = 0; r < ROWS; ++r) std::memcpy(y + r * y_row, total[r], cols * sizeof(float));
}

// tile<rows> for a row count known only at run time (1..kTileRows): one compiled tile per count.
template <typename F, int64_t ROWS = kTileRows>
void tile_of(int64_t rows, const float* x, int64_t x_row, const float* sums, int64_t sums_row,
             const uint8_t* panel, int64_t k_size, int64_t group, float* y, int64_t y_row, int64_t cols,
             const uint8_t* next, int64_t part, int64_t parts) {
  if constexpr (ROWS > 0) {
    if (rows == ROWS)
      return tile<ROWS, F>(x, x_row, sums, sums_row, panel, k_size, group, y, y_row, cols, next, part, parts);
    tile_of<F, ROWS - 1>(rows, x, x_row, sums, sums_row, panel, k_size, group, y, y_row, cols, next, part, parts);
  }
}

// work(b, next) for every b in [0, n), shared among PyTorch's threads: each starts on its own equal share, in order,
// then helps with what is left of the others'. The same scheme as linear_cpu.cpp's share_out, which says why.
struct alignas(64) Share {
  std::atomic<int64_t> next;
  int64_t end;
};

template <typename Work>
void share_out(int64_t n, Work&& work) {
  const int64_t count = std::max<int64_t>(1, std::min<int64_t>(n, at::get_num_threads()));
  std::vector<Share> shares(count);
  for (int64_t s = 0; s < count; ++s) {
    shares[s].next = s * n / count;
    shares[s].end = (s + 1) * n / count;
  }
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s)
      for (int64_t v = 0; v < count; ++v) {
        Share& share = shares[(s + v) % count];
        for (int64_t b; (b = share.next.fetch_add(1)) < share.end;) work(b, b + 1 < share.end ? b + 1 : -1);
      }
  });
}

template <typename F>
torch::Tensor product(const torch::Tensor& x, const torch::Tensor& packed, int64_t out_features, int64_t group,
                      bool gated) {
  const int64_t kinds = gated ? 2 : 1;  // panels per kPanel columns of the result: gate's and up's, or the one
  const int64_t y_cols = out_features / kinds;
  const int64_t rows = x.size(0), k_size = x.size(1), groups = (k_size + group - 1) / group;
  TORCH_CHECK(!gated || out_features % 2 == 0, "quantized_linear: a gated weight has an even count of columns");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == torch::kByte && packed.is_contiguous() &&
                  packed.size(0) == kinds * ((y_cols + kPanel - 1) / kPanel) && packed.size(1) == groups &&
                  packed.size(2) == block_bytes<F>(group),
              "quantized_linear: packed must be [panels, ", groups, ", ", block_bytes<F>(group),
              "] bytes, as quant_linear.py's pack makes for ", k_size, " inputs in groups of ", group);
  torch::Tensor y = torch::empty({rows, y_cols}, x.options());
  if (rows == 0) return y;
  const float* xp = x.data_ptr<float>();
  std::vector<float> sums(F::kMins ? rows * groups : 0);  // each row's sum of x over each group (q4's minimums)
  for (int64_t r = 0; r < (F::kMins ? rows : 0); ++r)
    for (int64_t g = 0; g < groups; ++g) {
      float s = 0.f;
      for (int64_t k = g * group; k < std::min((g + 1) * group, k_size); ++k) s += xp[r * k_size + k];
      sums[r * groups + g] = s;
    }
  // row tiles of equal height, at most kTileRows: 33 rows are 3 tiles of 11, not 12 + 12 + 9
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows, height = (rows + tiles - 1) / tiles;
  const int64_t panel_bytes = groups * block_bytes<F>(group);
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  share_out(packed.size(0) / kinds, [&](int64_t b, int64_t next_b) {  // the result's columns b * kPanel onwards
    float products[2][kTileRows * kPanel];  // a gated tile's two products, before the activation
    const int64_t col = b * kPanel, cols = std::min(kPanel, y_cols - col);
    for (int64_t r = 0, i = 0; r < rows; r += height, ++i) {
      const int64_t n = std::min(height, rows - r);
      for (int64_t g = 0; g < kinds; ++g) {  // each of the block's panels, while fetching next_b's of its kind
        const uint8_t* panel = wp + (b * kinds + g) * panel_bytes;
        const uint8_t* next = next_b < 0 ? nullptr : wp + (next_b * kinds + g) * panel_bytes;
        float* out = gated ? products[g] : yp + r * y_cols + col;
        const float* row_sums = F::kMins ? sums.data() + r * groups : nullptr;
        tile_of<F>(n, xp + r * k_size, k_size, row_sums, groups, panel, k_size, group, out, gated ? kPanel : y_cols,
                   gated ? kPanel : cols, next, i, tiles);
      }
      if (!gated) continue;
      for (int64_t t = 0; t < n; ++t) {
        float* out = yp + (r + t) * y_cols + col;
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) out[c] = silu(products[0][t * kPanel + c]) * products[1][t * kPanel + c];
      }
    }
  });
  return y;
}

}  // namespace

// Columns per packed panel: how quant_linear.py packs a weight for this build.
int64_t panel_width() { return kPanel; }

// x: [rows, in] float32, contiguous; packed: quant_linear.py's `pack` of an int8 ("int8") or 4-bit ("q4") weight;
// returns x @ W, [rows, out] -- or, gated, silu(x @ W_gate) * (x @ W_up), [rows, out / 2] (as linear_cpu.cpp).
torch::Tensor quantized_linear(const torch::Tensor& x, const torch::Tensor& packed, const std::string& format,
                               int64_t out_features, int64_t group, bool gated) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat && x.is_contiguous(),
              "quantized_linear: x must be a contiguous [rows, in] float32 tensor");
  TORCH_CHECK(group > 0, "quantized_linear: group must be positive");
  if (format == "int8") return product<Int8Format>(x, packed, out_features, group, gated);
  TORCH_CHECK(format == "q4", "quantized_linear: format must be 'int8' or 'q4', got '", format, "'");
  return product<Q4Format>(x, packed, out_features, group, gated);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("panel_width", &panel_width, "columns per packed panel");
  m.def("quantized_linear", &quantized_linear,
        "x @ W on an int8 or 4-bit weight packed in panels of blocks (gated: silu(x @ W_gate) * (x @ W_up))",
        py::arg("x"), py::arg("packed"), py::arg("format"), py::arg("out_features"), py::arg("group"),
        py::arg("gated") = false);
}
