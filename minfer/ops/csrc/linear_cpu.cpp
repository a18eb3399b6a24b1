// The model's matrix products y = x @ W on the CPU, float32: the weight packed once into column panels, and an
// inner loop that keeps a tile of y in registers.
//
// A product is K multiply-adds per output value. Done as written (for each row, for each column, sum over k) it
// reads a value of x and a value of W from memory for every multiply-add. The loop below instead holds a tile of
// y -- up to kTileRows rows by two vectors of columns -- in vector registers while it runs through k: each step
// loads two vectors of one row of W, and for each of the tile's rows broadcasts one value of x and adds its product
// with both vectors. That is 2 x rows fused multiply-adds for 2 loads of W and `rows` loads of x, so the arithmetic
// units, not the loads, set the pace (the register count sets the tile: 12 rows x 2 accumulators + 2 of W + 1 of
// x fill AVX-512's 32 registers; AVX2 has 16, so 6 rows there).
//
// The weight is packed once, at load time (minfer/ops/linear.py, `pack`): stored [in, out], the two vectors a
// step needs sit `out` floats apart from the previous step's; packed, each panel of kPanel columns is its own
// [in, kPanel] block, so a tile reads it as one contiguous stream, which stays in the core's L2 cache while the next
// row tiles read it again. The first tile to read a panel waits on main memory, though: the hardware prefetcher
// only follows a stream once it sees one. So the last tile of each panel also asks for the next panel, a cache line
// at a time (`__builtin_prefetch`), while its own loads hit L2: in a decode step (33 rows), that made the products
// about a fifth faster.
//
// The threads split the panels (ATen's parallel_for: the threads PyTorch's own operators use). Each output is
// summed over k with fused multiply-adds, in short chunks (see tile), so results differ from PyTorch's in the last
// bits only.
// Measured against oneDNN on packed weights (the README's benchmark, docs/architecture.md): faster at a decode
// step's 8-64 rows, about level at thousands, and no kernel to compile per row count.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

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
// floats apart; `next`, when not null, is the panel to fetch into the cache meanwhile. ROWS is a compile-time
// constant, so the compiler keeps every accumulator in a register. The sum over k runs in chunks of kChunk, each
// summed afresh and then added to the total: a float sum's rounding error grows with the length of its chain of
// additions, and 1,536 terms in one chain drift visibly (logits 1e-4 off PyTorch's, whose library sums in blocks
// too); chunks of 64 keep every chain short.
template <int64_t ROWS>
void tile(const float* x, int64_t x_row, const float* panel, int64_t k_size, float* y, int64_t y_row,
          int64_t cols, const float* next) {
  Vec total[ROWS][2] = {};
  for (int64_t k0 = 0; k0 < k_size; k0 += kChunk) {
    Vec acc[ROWS][2] = {};
    for (int64_t k = k0; k < std::min(k0 + kChunk, k_size); ++k) {
      const Vec w0 = load(panel + k * kPanel), w1 = load(panel + k * kPanel + kWidth);
      if (next) {  // the same row of the next panel (two cache lines with AVX-512, one with AVX2)
        __builtin_prefetch(next + k * kPanel);
        __builtin_prefetch(next + k * kPanel + kWidth);
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
             int64_t y_row, int64_t cols, const float* next) {
  if constexpr (ROWS > 0) {
    if (rows == ROWS) return tile<ROWS>(x, x_row, panel, k_size, y, y_row, cols, next);
    tile_of<ROWS - 1>(rows, x, x_row, panel, k_size, y, y_row, cols, next);
  }
}

}  // namespace

// Columns per panel: how minfer/ops/linear.py packs a weight for this build.
int64_t panel_width() { return kPanel; }

// x: [rows, in] float32, contiguous; packed: [panels, in, kPanel] (linear.py's `pack`); returns [rows, out].
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t out_features) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat && x.is_contiguous(),
              "linear: x must be a contiguous [rows, in] float32 tensor");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == torch::kFloat && packed.is_contiguous() &&
                  packed.size(1) == x.size(1) && packed.size(2) == kPanel &&
                  packed.size(0) == (out_features + kPanel - 1) / kPanel,
              "linear: packed must be [ceil(out / ", kPanel, "), in, ", kPanel, "] float32, as linear.py's pack makes");
  const int64_t rows = x.size(0), k_size = x.size(1), panels = packed.size(0);
  torch::Tensor y = torch::empty({rows, out_features}, x.options());
  if (rows == 0) return y;
  // row tiles of equal height, at most kTileRows: 33 rows are 3 tiles of 11, not 12 + 12 + 9
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows, height = (rows + tiles - 1) / tiles;
  const float* xp = x.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t col = p * kPanel, cols = std::min(kPanel, out_features - col);
      const float* next = p + 1 < end ? wp + (p + 1) * k_size * kPanel : nullptr;  // this thread's next panel
      for (int64_t r = 0; r < rows; r += height)
        tile_of(std::min(height, rows - r), xp + r * k_size, k_size, wp + p * k_size * kPanel, k_size,
                yp + r * out_features + col, out_features, cols, r + height >= rows ? next : nullptr);
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("panel_width", &panel_width, "columns per packed panel");
  m.def("linear", &linear, "x @ W on a weight packed in column panels", py::arg("x"), py::arg("packed"),
        py::arg("out_features"));
}
