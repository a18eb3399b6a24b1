// Decode attention on the CPU, reading each request's keys and values in place through its block table.
//
// The PyTorch reference (minfer/ops/paged_attention.py) first *copies* every request's K and V out of
// their scattered blocks into one padded tensor, then scaled_dot_product_attention reads that copy again:
// three passes over the cache, plus the padding. A decode step is bound by memory traffic, not arithmetic
// (one query row per request meets its whole context), so this kernel makes one pass: for each request it
// walks the block table, and every key and value row is read once, where it lies.
//
// One task per request. A block holds block_size tokens, each with the rows of every KV head side by side,
// so a task reads each block as one contiguous stretch of memory -- the pattern the CPU's prefetcher follows
// best (a task per (request, KV head) read a third of every row and was about 30% slower; so was a loop over
// query heads inside the task, even with its sums held in registers: the block pool hands a request consecutive
// blocks, and a walk over whole blocks reads them as one stream). Inside a block the loop goes token by token,
// KV head by KV head, and each key row serves the G = Hq / Hkv query heads that share it (grouped-query
// attention). Threads take requests one at a time (OpenMP's dynamic schedule): the runner sorts decodes longest
// first, so a fixed half of the list each would leave one thread most of the work.
// Softmax is the plain two-pass kind: all scores first (a few KB), then exp and the sum, then the weighted
// sum of V rows. Accumulation is in float32 whatever the cache's dtype.
//
// The arithmetic must keep up with the memory. Each score is a dot product of D values, added in 16 running sums
// by vector_math.h's lane_sum: with the plain `s += q[d] * k[d]` the compiler adds the D products one at a time,
// in order, and the kernel ran at two thirds of the speed at which it could read the cache. exp_poly vectorizes
// the softmax's exponentials (std::exp is a library call per score).
//
// The head size is a template parameter for the common sizes (64, 128): with a constant trip count the
// compiler unrolls the loops over it into a handful of vector instructions. Walking the table block by block,
// rather than computing table[t / block_size] for every token t, also keeps an integer division (tens of cycles)
// out of the innermost loop.

#include <torch/extension.h>
#include <ATen/Parallel.h>  // at::get_num_threads: as many threads as PyTorch's own operators

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "panel_tile.h"
#include "vector_math.h"

using minfer::as_float;
using minfer::exp_poly;
using minfer::lane_sum;
using minfer::narrow;
using minfer::widen;

template <typename scalar_t, int64_t kHeadDim>  // kHeadDim: the head size, or 0 to read it at run time
static void decode_attention_kernel(const torch::Tensor& q, const torch::Tensor& k_cache,
                                    const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                                    const torch::Tensor& seq_lens, double scale, torch::Tensor& out) {
  const int64_t num_reqs = q.size(0), num_heads = q.size(1), head_dim = kHeadDim > 0 ? kHeadDim : q.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  const int64_t group = num_heads / num_kv_heads;  // query heads per KV head
  const int64_t q_row = q.stride(0), q_head = q.stride(1), out_row = out.stride(0), out_head = out.stride(1);
  const int64_t token_stride = num_kv_heads * head_dim;       // one slot: every KV head of one token
  const int64_t block_stride = block_size * token_stride;     // one block: block_size slots
  const int64_t max_blocks = block_tables.size(1);
  constexpr int64_t kLineFloats = 64 / sizeof(scalar_t);      // values in a 64-byte cache line

  const scalar_t* q_ptr = q.data_ptr<scalar_t>();
  const scalar_t* k_ptr = k_cache.data_ptr<scalar_t>();
  const scalar_t* v_ptr = v_cache.data_ptr<scalar_t>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  scalar_t* out_ptr = out.data_ptr<scalar_t>();

#pragma omp parallel num_threads(at::get_num_threads())
  {
    std::vector<float> queries, scores, acc, inv_sum, row(head_dim);  // per thread, reused across requests
#pragma omp for schedule(dynamic, 1)
    for (int64_t r = 0; r < num_reqs; ++r) {
      const int64_t len = lens[r];
      const int32_t* table = tables + r * max_blocks;
      // visit(row, t, h) for every token t < len and KV head h of `cache`, block by block: token t lies in slot
      // t % block_size of block table[t / block_size], found here without a division per token. While it reads a
      // slot, it asks for the same slot of the request's next block (one cache line at a time): the blocks lie
      // wherever the pool had them free, so the prefetcher, which follows addresses, cannot guess the next one
      // (measured: a decode step's attention a sixth faster)
      auto for_each_row = [&](const scalar_t* cache, auto&& visit) {
        for (int64_t first = 0, b = 0; first < len; first += block_size, ++b) {
          const scalar_t* block = cache + table[b] * block_stride;
          const scalar_t* next = first + block_size < len ? cache + table[b + 1] * block_stride : nullptr;
          const int64_t n = std::min(block_size, len - first);
          for (int64_t i = 0; i < n; ++i) {
            if (next)
              for (int64_t c = 0; c < token_stride; c += kLineFloats) __builtin_prefetch(next + i * token_stride + c);
            for (int64_t h = 0; h < num_kv_heads; ++h) visit(block + i * token_stride + h * head_dim, first + i, h);
          }
        }
      };

      // every query head's row, in float32 and pre-scaled by 1/sqrt(head_dim)
      queries.resize(num_heads * head_dim);
      for (int64_t hq = 0; hq < num_heads; ++hq)
        for (int64_t d = 0; d < head_dim; ++d)
          queries[hq * head_dim + d] = widen(q_ptr + r * q_row + hq * q_head + d) * float(scale);

      // pass 1: every score; a key row serves the query heads that share its KV head (a 16-bit row is widened to
      // float32 once for all of them: bfloat16 decodes 1.6x as fast as widening every value at every use)
      scores.resize(num_heads * len);  // one row of len scores per query head
      for_each_row(k_ptr, [&](const scalar_t* k, int64_t t, int64_t h) {
        const float* key = as_float(k, head_dim, row.data());
        for (int64_t hq = h * group; hq < (h + 1) * group; ++hq) {
          const float* qh = queries.data() + hq * head_dim;
          scores[hq * len + t] = lane_sum(head_dim, [&](int64_t d) { return qh[d] * key[d]; });
        }
      });
      // softmax weights: exp(s - max), and 1 / their sum (applied once, to the output)
      inv_sum.resize(num_heads);
      for (int64_t hq = 0; hq < num_heads; ++hq) {
        float* s = scores.data() + hq * len;
        float max = -std::numeric_limits<float>::infinity(), sum = 0.f;
        for (int64_t t = 0; t < len; ++t) max = std::max(max, s[t]);
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < len; ++t) sum += (s[t] = exp_poly(s[t] - max));
        inv_sum[hq] = 1.f / sum;
      }
      // pass 2: the weighted sum of value rows, walked the same way
      acc.assign(num_heads * head_dim, 0.f);
      for_each_row(v_ptr, [&](const scalar_t* v, int64_t t, int64_t h) {
        const float* value = as_float(v, head_dim, row.data());
        for (int64_t hq = h * group; hq < (h + 1) * group; ++hq) {
          const float p = scores[hq * len + t];
          float* a = acc.data() + hq * head_dim;
#pragma omp simd
          for (int64_t d = 0; d < head_dim; ++d) a[d] += p * value[d];
        }
      });
      for (int64_t hq = 0; hq < num_heads; ++hq)
        for (int64_t d = 0; d < head_dim; ++d)
          narrow(out_ptr + r * out_row + hq * out_head + d, acc[hq * head_dim + d] * inv_sum[hq]);
    }
  }
}

// What both kernels take: q, out: [T, Hq, D] (rows may be strided; each head's D values contiguous); caches
// [blocks, B, Hkv, D]; one int32 block table per request; int64 lengths.
static void check_inputs(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                         const torch::Tensor& block_tables, const torch::Tensor& seq_lens, const torch::Tensor& out) {
  TORCH_CHECK(q.device().is_cpu(), "the attention kernels run on the CPU");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && q.stride(2) == 1 && out.stride(2) == 1,
              "q and out must be [T, Hq, D] with contiguous heads; caches [blocks, block_size, Hkv, D]");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the KV caches must be contiguous");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && out.scalar_type() == q.scalar_type(),
              "q, the caches and out must share one dtype");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && block_tables.is_contiguous(),
              "block_tables must be contiguous int32");
  TORCH_CHECK(seq_lens.scalar_type() == torch::kInt64 && seq_lens.is_contiguous(), "seq_lens must be int64");
}

// out[r, head] = softmax(q[r, head] . K_r / sqrt(D)) V_r over the first seq_lens[r] tokens of request r.
// q, out: [R, Hq, D] (rows may be strided; each head's D values contiguous); caches [blocks, B, Hkv, D].
void decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                      const torch::Tensor& block_tables, const torch::Tensor& seq_lens, double scale,
                      torch::Tensor out) {
  check_inputs(q, k_cache, v_cache, block_tables, seq_lens, out);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "decode_attention", [&] {
    switch (q.size(2)) {  // the common head sizes get loops of constant length
      case 64: decode_attention_kernel<scalar_t, 64>(q, k_cache, v_cache, block_tables, seq_lens, scale, out); break;
      case 128: decode_attention_kernel<scalar_t, 128>(q, k_cache, v_cache, block_tables, seq_lens, scale, out); break;
      default: decode_attention_kernel<scalar_t, 0>(q, k_cache, v_cache, block_tables, seq_lens, scale, out);
    }
  });
}

// Prefill chunks, float32: request r's n queries (rows query_start_loc[r]..query_start_loc[r + 1] of q, at
// positions len - n .. len - 1, where len = seq_lens[r]) attend causally to its first len cached tokens.
//
// A chunk has many queries per request, so its attention is two matrix products per query head, S = Q K^T and
// O = softmax(S) V, and it runs on the products' own inner loop (panel_tile.h): a tile of up to kTileRows queries'
// scores (then outputs) held in registers. That loop multiplies by a matrix packed in column panels, so each
// request's keys and values are first copied out of their blocks into that order, per KV head: K^T as panels of
// kPanel tokens ([D, kPanel] each), V as panels of kPanel dimensions ([len, kPanel] each). The copy reads each key
// and value once; the products then read the copies once per query tile, from the cache. (PyTorch's
// scaled_dot_product_attention on the gathered K/V ran at a tenth of the products' rate at these sizes: it works in
// blocks of 64 to 512 queries and keys, and splits them among threads by head and query block only.)
//
// Tasks are (request, query head, query tile), shared out dynamically, the last tiles of each request -- the ones
// that see the most keys -- first. A tile's scores are exact for every key up to its last query's position; each
// row then keeps the keys up to its own (causal), softmax by exp_poly, and the products' chunked sums.
static void prefill_attention_kernel(const torch::Tensor& q, const torch::Tensor& k_cache,
                                     const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                                     const torch::Tensor& query_start_loc, const torch::Tensor& seq_lens,
                                     int64_t first, double scale, torch::Tensor& out) {
  using minfer::kPanel;
  using minfer::kTileRows;
  using minfer::tile_of;
  const int64_t num_reqs = seq_lens.size(0), num_heads = q.size(1), head_dim = q.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2), group = num_heads / num_kv_heads;
  const int64_t q_row = q.stride(0), out_row = out.stride(0), out_head = out.stride(1);
  const int64_t token_stride = num_kv_heads * head_dim, block_stride = block_size * token_stride;
  const int64_t max_blocks = block_tables.size(1), dim_panels = (head_dim + kPanel - 1) / kPanel;
  const float* q_ptr = q.data_ptr<float>();
  const float* k_ptr = k_cache.data_ptr<float>();
  const float* v_ptr = v_cache.data_ptr<float>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int64_t* starts = query_start_loc.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  float* out_ptr = out.data_ptr<float>();

  // request r, KV head h: K^T in panels [key_panels, D, kPanel], then V in panels [dim_panels, len, kPanel]
  auto key_floats = [&](int64_t r) { return (lens[r] + kPanel - 1) / kPanel * head_dim * kPanel; };
  auto head_floats = [&](int64_t r) { return key_floats(r) + dim_panels * lens[r] * kPanel; };
  struct Tile { int64_t req, head, row, rows; };  // `rows` queries of `head` from the chunk's query `row` on
  std::vector<Tile> tiles;
  std::vector<int64_t> packed_at(num_reqs + 1, 0);  // where request r's packed keys and values start
  for (int64_t r = first; r < num_reqs; ++r) {
    const int64_t n = starts[r + 1] - starts[r];
    packed_at[r + 1] = packed_at[r] + num_kv_heads * head_floats(r);
    if (n == 0) continue;
    const int64_t count = (n + kTileRows - 1) / kTileRows, height = (n + count - 1) / count;  // equal-height tiles
    for (int64_t row = (count - 1) * height; row >= 0; row -= height)  // the last tile (most keys) first
      for (int64_t h = 0; h < num_heads; ++h) tiles.push_back({r, h, row, std::min(height, n - row)});
  }
  thread_local std::vector<float> buffer;  // reused across calls: fresh pages would cost more than the copy
  buffer.resize(packed_at[num_reqs]);
  float* packed = buffer.data();  // (the worker threads see this thread's buffer through the pointer)
  auto keys_of = [&](int64_t r, int64_t h) { return packed + packed_at[r] + h * head_floats(r); };
  auto values_of = [&](int64_t r, int64_t h) { return keys_of(r, h) + key_floats(r); };

#pragma omp parallel num_threads(at::get_num_threads())
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t r = first; r < num_reqs; ++r) {  // copy each request's keys and values into panels
      const int32_t* table = tables + r * max_blocks;
      for (int64_t t = 0; t < lens[r]; ++t) {
        const int64_t offset = table[t / block_size] * block_stride + t % block_size * token_stride;
        for (int64_t h = 0; h < num_kv_heads; ++h) {
          const float* k = k_ptr + offset + h * head_dim;
          const float* v = v_ptr + offset + h * head_dim;
          float* kt = keys_of(r, h) + (t / kPanel) * head_dim * kPanel + t % kPanel;
          float* vp = values_of(r, h) + t * kPanel;
          for (int64_t d = 0; d < head_dim; ++d) kt[d * kPanel] = k[d];
          for (int64_t p = 0; p < dim_panels; ++p)
            std::copy(v + p * kPanel, v + std::min(head_dim, (p + 1) * kPanel), vp + p * lens[r] * kPanel);
        }
      }
    }
    std::vector<float> scores;  // per thread: one tile's rows of scores, then of softmax weights
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < tiles.size(); ++i) {
      const Tile& tile = tiles[i];
      const int64_t r = tile.req, start = lens[r] - (starts[r + 1] - starts[r]);  // the chunk's first position
      const int64_t keys = start + tile.row + tile.rows;  // keys the tile's last query sees
      const int64_t row_size = (keys + kPanel - 1) / kPanel * kPanel;
      scores.resize(tile.rows * row_size);
      const float* queries = q_ptr + (starts[r] + tile.row) * q_row + tile.head * q.stride(1);
      const float* kt = keys_of(r, tile.head / group);
      for (int64_t p = 0; p * kPanel < keys; ++p)  // S = Q K^T, kPanel keys at a time
        tile_of(tile.rows, queries, q_row, kt + p * head_dim * kPanel, head_dim, scores.data() + p * kPanel,
                row_size, kPanel);
      float inv_sum[kTileRows];
      for (int64_t j = 0; j < tile.rows; ++j) {  // causal softmax of each row: keys 0..its own position
        float* s = scores.data() + j * row_size;
        const int64_t visible = start + tile.row + j + 1;
        float max = -std::numeric_limits<float>::infinity(), sum = 0.f;
        for (int64_t t = 0; t < visible; ++t) max = std::max(max, s[t] *= float(scale));
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < visible; ++t) sum += (s[t] = exp_poly(s[t] - max));
        std::fill(s + visible, s + keys, 0.f);  // the keys after this query's position weigh nothing
        inv_sum[j] = 1.f / sum;
      }
      float* o = out_ptr + (starts[r] + tile.row) * out_row + tile.head * out_head;
      const float* vp = values_of(r, tile.head / group);
      for (int64_t p = 0; p < dim_panels; ++p)  // O = softmax(S) V, kPanel dimensions at a time
        tile_of(tile.rows, scores.data(), row_size, vp + p * lens[r] * kPanel, keys, o + p * kPanel, out_row,
                std::min(kPanel, head_dim - p * kPanel));
      for (int64_t j = 0; j < tile.rows; ++j)
        for (int64_t d = 0; d < head_dim; ++d) o[j * out_row + d] *= inv_sum[j];
    }
  }
}

// The prefill chunks of a step: requests first..R-1 (the runner puts decodes first). q, out: [T, Hq, D] float32;
// query_start_loc: [R + 1] int64, each request's first row in q; block_tables, seq_lens as decode_attention's.
void prefill_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                       const torch::Tensor& block_tables, const torch::Tensor& query_start_loc,
                       const torch::Tensor& seq_lens, int64_t first, double scale, torch::Tensor out) {
  check_inputs(q, k_cache, v_cache, block_tables, seq_lens, out);
  TORCH_CHECK(q.scalar_type() == torch::kFloat, "prefill_attention takes float32 (the reference serves others)");
  TORCH_CHECK(query_start_loc.scalar_type() == torch::kInt64 && query_start_loc.is_contiguous() &&
                  query_start_loc.size(0) == seq_lens.size(0) + 1,
              "query_start_loc must be int64, one more entry than seq_lens");
  TORCH_CHECK(0 <= first && first <= seq_lens.size(0), "first must index a request");
  prefill_attention_kernel(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, first, scale, out);
}

// Each new token's key and value rows into its slot of the caches: the reference's two index_copy_ calls
// (minfer/ops/paged_attention.py, store_kv) in one pass. The copy itself is tiny at a decode step (a few KB);
// what this saves is the operators' dispatch, 8-20 us each, twice a layer. k, v: [T, Hkv, D], rows may be
// strided (they are views of the fused q/k/v product), each row's Hkv * D values contiguous; caches
// [blocks, B, Hkv, D], contiguous, of k's dtype; slot_mapping: [T] int64. Every slot is checked before any is
// written, so a bad one leaves the caches as they were.
void store_kv(const torch::Tensor& k, const torch::Tensor& v, torch::Tensor k_cache, torch::Tensor v_cache,
              const torch::Tensor& slot_mapping) {
  TORCH_CHECK(k.device().is_cpu() && k_cache.device().is_cpu(), "store_kv runs on the CPU");
  TORCH_CHECK(k.dim() == 3 && k_cache.dim() == 4 && k.sizes() == v.sizes() && k_cache.sizes() == v_cache.sizes(),
              "store_kv: k, v must be [T, Hkv, D] and the caches [blocks, block_size, Hkv, D]");
  TORCH_CHECK(k.size(1) == k_cache.size(2) && k.size(2) == k_cache.size(3), "store_kv: k's heads and size must "
              "match the caches'");
  const int64_t tokens = k.size(0), row = k.size(1) * k.size(2), slots = k_cache.size(0) * k_cache.size(1);
  for (const torch::Tensor* t : {&k, &v})
    TORCH_CHECK(t->stride(2) == 1 && t->stride(1) == t->size(2), "store_kv: each token's K/V row must be contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the KV caches must be contiguous");
  TORCH_CHECK(k.scalar_type() == k_cache.scalar_type() && v.scalar_type() == k_cache.scalar_type() &&
                  v_cache.scalar_type() == k_cache.scalar_type(), "store_kv: k, v and the caches must share one dtype");
  TORCH_CHECK(slot_mapping.scalar_type() == torch::kInt64 && slot_mapping.dim() == 1 &&
                  slot_mapping.size(0) == tokens && slot_mapping.is_contiguous(),
              "store_kv: slot_mapping must be [T] contiguous int64");
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK_INDEX(0 <= slot[t] && slot[t] < slots, "store_kv: slot ", slot[t], " of token ", t,
                      " is out of range for a cache of ", slots, " slots");
  const int64_t bytes = row * k.element_size();
  const char* kp = static_cast<const char*>(k.data_ptr());
  const char* vp = static_cast<const char*>(v.data_ptr());
  char* kc = static_cast<char*>(k_cache.data_ptr());
  char* vc = static_cast<char*>(v_cache.data_ptr());
  const int64_t k_row = k.stride(0) * k.element_size(), v_row = v.stride(0) * v.element_size();
  for (int64_t t = 0; t < tokens; ++t) {
    std::memcpy(kc + slot[t] * bytes, kp + t * k_row, bytes);
    std::memcpy(vc + slot[t] * bytes, vp + t * v_row, bytes);
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("store_kv", &store_kv, "each new token's K and V rows into its cache slot");
  m.def("decode_attention", &decode_attention, "paged decode attention, reading blocks in place");
  m.def("prefill_attention", &prefill_attention, "causal attention of prefill chunks on the products' register tile");
}
