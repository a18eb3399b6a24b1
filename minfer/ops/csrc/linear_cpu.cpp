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
// The threads share the panels out (`share_out`, on ATen's parallel_for: the threads PyTorch's own operators use),
// each walking its own share in order and then helping with what is left of the others'. Each output is summed over
// k with fused multiply-adds, in short chunks (see tile), so results differ from PyTorch's in the last bits only.
// The MLP's gate and up products can come out already activated (`gated`): silu(gate) * up, computed on each tile
// before it is written, so neither the product of twice the width nor a separate activation kernel touches memory.
// Measured against oneDNN on packed weights (the README's benchmark, docs/architecture.md): faster at a decode
// step's 8-64 rows, about level at thousands, and no kernel to compile per row count.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "panel_tile.h"
#include "vector_math.h"

using minfer::kPanel;
using minfer::kTileRows;
using minfer::silu;
using minfer::tile_of;

// Columns per panel: how minfer/ops/linear.py packs a weight for this build.
int64_t panel_width() { return kPanel; }

// work(b, next) for every b in [0, n), shared among PyTorch's threads. Each thread starts on its own equal share,
// in order, as a static split would (next: the block it will take after b, whose weights it can fetch meanwhile,
// or -1); one that finishes its share then takes what is left of the others', a block at a time. A static split
// waits for its slowest thread, and on a shared machine one core is often slower than the other for a while
// (measured on a 2-core VM: one thread busy 14-24% longer than the other on the same work); this evens it out.
struct alignas(64) Share {  // one per thread, a cache line each, so that taking a block contends with nobody
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
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {  // a share per thread where threads run
    for (int64_t s = begin; s < end; ++s)
      for (int64_t v = 0; v < count; ++v) {  // its own share first, then the others'
        Share& share = shares[(s + v) % count];
        for (int64_t b; (b = share.next.fetch_add(1)) < share.end;) work(b, b + 1 < share.end ? b + 1 : -1);
      }
  });
}

// x: [rows, in] float32, contiguous; packed: [panels, in, kPanel] (linear.py's `pack`); returns [rows, out].
// gated: the weight is [in, 2 * n], gate's n columns then up's, packed with their panels alternating (linear.py's
// `pack_gated`: gate's panel j, then up's panel j); returns silu(x @ W_gate) * (x @ W_up), [rows, n]. A tile of
// each product goes to a buffer on the stack (it stays in the L1 cache) and is activated from there, so the
// [rows, 2n] product is never written to memory, nor read back by a separate activation kernel.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t out_features, bool gated) {
  const int64_t group = gated ? 2 : 1;  // panels per kPanel columns of the result: gate's and up's, or the one
  const int64_t y_cols = out_features / group;
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat && x.is_contiguous(),
              "linear: x must be a contiguous [rows, in] float32 tensor");
  TORCH_CHECK(!gated || out_features % 2 == 0, "linear: a gated weight has gate's and up's columns, an even count");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == torch::kFloat && packed.is_contiguous() &&
                  packed.size(1) == x.size(1) && packed.size(2) == kPanel &&
                  packed.size(0) == group * ((y_cols + kPanel - 1) / kPanel),
              "linear: packed must be [", group, " * ceil(out / ", group * kPanel, "), in, ", kPanel,
              "] float32, as linear.py's pack", gated ? "_gated" : "", " makes");
  const int64_t rows = x.size(0), k_size = x.size(1), blocks = packed.size(0) / group;
  torch::Tensor y = torch::empty({rows, y_cols}, x.options());
  if (rows == 0) return y;
  // row tiles of equal height, at most kTileRows: 33 rows are 3 tiles of 11, not 12 + 12 + 9
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows, height = (rows + tiles - 1) / tiles;
  const int64_t share = (k_size + tiles - 1) / tiles;  // rows of a next panel each row tile fetches
  const int64_t panel_size = k_size * kPanel;
  const float* xp = x.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  share_out(blocks, [&](int64_t b, int64_t next_b) {  // the result's columns b * kPanel onwards
    float products[2][kTileRows * kPanel];  // a gated tile's two products, before the activation
    const int64_t col = b * kPanel, cols = std::min(kPanel, y_cols - col);
    for (int64_t r = 0, i = 0; r < rows; r += height, ++i) {
      const int64_t n = std::min(height, rows - r);
      for (int64_t g = 0; g < group; ++g) {  // each of the block's panels, while fetching next_b's of its kind
        const float* panel = wp + (b * group + g) * panel_size;
        const float* next = next_b < 0 ? nullptr : wp + (next_b * group + g) * panel_size + i * share * kPanel;
        float* out = gated ? products[g] : yp + r * y_cols + col;
        tile_of(n, xp + r * k_size, k_size, panel, k_size, out, gated ? kPanel : y_cols, gated ? kPanel : cols,
                next, tiles);
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("panel_width", &panel_width, "columns per packed panel");
  m.def("linear", &linear, "x @ W on a weight packed in column panels (gated: silu(x @ W_gate) * (x @ W_up))",
        py::arg("x"), py::arg("packed"), py::arg("out_features"), py::arg("gated") = false);
}
