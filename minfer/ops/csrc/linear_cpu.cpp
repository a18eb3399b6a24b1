// The model's matrix products y = x @ W on the CPU, float32: the weight packed once into column panels, and an
// inner loop that keeps a tile of y in registers.
//
// A product is K multiply-adds per output value. Done as written (for each row, for each column, sum over k) it
// reads a value of x and a value of W from memory for every multiply-add. The inner loop (panel_tile.h, `tile`)
// instead holds a tile of y -- up to kTileRows rows by two vectors of columns -- in vector registers while it runs
// through k, so each value of W it loads serves every row of the tile, and the arithmetic units set the pace.
//
// The weight is packed once, at load time (minfer/ops/linear.py, `pack`): stored [in, out], the two vectors a
// step needs sit `out` floats apart from the previous step's; packed, each panel of kPanel columns is its own
// [in, kPanel] block, so a tile reads it as one contiguous stream, which stays in the core's L2 cache while the next
// row tiles read it again. The first tile to read a panel waits on main memory, though: the hardware prefetcher
// only follows a stream once it sees one. So while a thread works through a panel it also asks for its next one, a
// cache line at a time (`__builtin_prefetch`), each row tile fetching an equal share: in a decode step (33 rows) that
// made the products about a fifth faster than without, and sharing the fetch among the tiles (rather than leaving it
// all to the last) another tenth -- the requests reach memory at an even pace.
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

#include "panel_tile.h"

using minfer::kPanel;
using minfer::kTileRows;
using minfer::tile_of;

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
      const int64_t share = (k_size + tiles - 1) / tiles;  // rows of the next panel each row tile fetches
      for (int64_t r = 0, i = 0; r < rows; r += height, ++i)
        tile_of(std::min(height, rows - r), xp + r * k_size, k_size, wp + p * k_size * kPanel, k_size,
                yp + r * out_features + col, out_features, cols, next ? next + i * share * kPanel : nullptr, tiles);
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("panel_width", &panel_width, "columns per packed panel");
  m.def("linear", &linear, "x @ W on a weight packed in column panels", py::arg("x"), py::arg("packed"),
        py::arg("out_features"));
}
