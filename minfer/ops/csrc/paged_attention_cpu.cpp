// Decode attention on the CPU, reading each request's keys and values in place through its block table.
//
// The PyTorch reference (minfer/ops/paged_attention.py) first *copies* every request's K and V out of
// their scattered blocks into one padded tensor, then scaled_dot_product_attention reads that copy again:
// three passes over the cache, plus the padding. A decode step is bound by memory traffic, not arithmetic
// (one query row per request meets its whole context), so this kernel makes one pass: for each
// (request, KV head) it walks the block table, and every key and value row is read once, where it lies.
//
// One task per (request, KV head) pair; the task serves all G = Hq / Hkv query heads that share that KV
// head (grouped-query attention), so a K row, once loaded, is used G times. Threads take tasks one at a
// time (OpenMP's dynamic schedule): the runner sorts decodes longest first, so handing each thread a fixed
// half of the list would give one thread most of the work.
// Softmax is the plain two-pass kind: all scores first (a few KB), then exp and the sum, then the
// weighted sum of V rows. Accumulation is in float32 whatever the cache's dtype.

#include <torch/extension.h>
#include <ATen/Parallel.h>  // at::get_num_threads: as many threads as PyTorch's own operators

#include <cmath>
#include <limits>
#include <vector>

template <typename scalar_t>
static void decode_attention_kernel(const torch::Tensor& q, const torch::Tensor& k_cache,
                                    const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                                    const torch::Tensor& seq_lens, double scale, torch::Tensor& out) {
  const int64_t num_reqs = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  const int64_t group = num_heads / num_kv_heads;  // query heads per KV head
  const int64_t q_row = q.stride(0), q_head = q.stride(1), out_row = out.stride(0), out_head = out.stride(1);
  const int64_t token_stride = num_kv_heads * head_dim;       // one slot: every KV head of one token
  const int64_t block_stride = block_size * token_stride;     // one block: block_size slots
  const int64_t max_blocks = block_tables.size(1);

  const scalar_t* q_ptr = q.data_ptr<scalar_t>();
  const scalar_t* k_ptr = k_cache.data_ptr<scalar_t>();
  const scalar_t* v_ptr = v_cache.data_ptr<scalar_t>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  scalar_t* out_ptr = out.data_ptr<scalar_t>();

  const int64_t num_tasks = num_reqs * num_kv_heads;
#pragma omp parallel num_threads(at::get_num_threads())
  {
    std::vector<float> queries, scores, max_score, acc;  // per thread, reused across tasks
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < num_tasks; ++task) {
      const int64_t r = task / num_kv_heads, h = task % num_kv_heads, len = lens[r];
      const int32_t* table = tables + r * max_blocks;
      // where token t's row for KV head h lies: block table[t / B], slot t % B
      auto row = [&](const scalar_t* cache, int64_t t) {
        return cache + table[t / block_size] * block_stride + (t % block_size) * token_stride + h * head_dim;
      };

      // this group's query rows, in float32 and pre-scaled by 1/sqrt(head_dim)
      queries.resize(group * head_dim);
      for (int64_t g = 0; g < group; ++g)
        for (int64_t d = 0; d < head_dim; ++d)
          queries[g * head_dim + d] = float(q_ptr[r * q_row + (h * group + g) * q_head + d]) * float(scale);

      // pass 1: every score, and each head's maximum (for a softmax that cannot overflow)
      scores.resize(group * len);
      max_score.assign(group, -std::numeric_limits<float>::infinity());
      for (int64_t t = 0; t < len; ++t) {
        const scalar_t* k = row(k_ptr, t);
        for (int64_t g = 0; g < group; ++g) {
          const float* qg = queries.data() + g * head_dim;
          float s = 0.f;
#pragma omp simd reduction(+ : s)
          for (int64_t d = 0; d < head_dim; ++d) s += qg[d] * float(k[d]);
          scores[g * len + t] = s;
          max_score[g] = std::max(max_score[g], s);
        }
      }
      // softmax weights: exp(s - max) / sum
      for (int64_t g = 0; g < group; ++g) {
        float* sg = scores.data() + g * len;
        float sum = 0.f;
        for (int64_t t = 0; t < len; ++t) sum += (sg[t] = std::exp(sg[t] - max_score[g]));
        for (int64_t t = 0; t < len; ++t) sg[t] /= sum;
      }
      // pass 2: the weighted sum of value rows
      acc.assign(group * head_dim, 0.f);
      for (int64_t t = 0; t < len; ++t) {
        const scalar_t* v = row(v_ptr, t);
        for (int64_t g = 0; g < group; ++g) {
          const float p = scores[g * len + t];
          float* a = acc.data() + g * head_dim;
#pragma omp simd
          for (int64_t d = 0; d < head_dim; ++d) a[d] += p * float(v[d]);
        }
      }
      for (int64_t g = 0; g < group; ++g)
        for (int64_t d = 0; d < head_dim; ++d)
          out_ptr[r * out_row + (h * group + g) * out_head + d] = scalar_t(acc[g * head_dim + d]);
    }
  }
}

// out[r, head] = softmax(q[r, head] . K_r / sqrt(D)) V_r over the first seq_lens[r] tokens of request r.
// q, out: [R, Hq, D] (rows may be strided; each head's D values contiguous); caches [blocks, B, Hkv, D].
void decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                      const torch::Tensor& block_tables, const torch::Tensor& seq_lens, double scale,
                      torch::Tensor out) {
  TORCH_CHECK(q.device().is_cpu(), "decode_attention runs on the CPU");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && q.stride(2) == 1 && out.stride(2) == 1,
              "q and out must be [R, Hq, D] with contiguous heads; caches [blocks, block_size, Hkv, D]");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the KV caches must be contiguous");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && out.scalar_type() == q.scalar_type(),
              "q, the caches and out must share one dtype");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && block_tables.is_contiguous(),
              "block_tables must be contiguous int32");
  TORCH_CHECK(seq_lens.scalar_type() == torch::kInt64 && seq_lens.is_contiguous(), "seq_lens must be int64");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "decode_attention", [&] {
    decode_attention_kernel<scalar_t>(q, k_cache, v_cache, block_tables, seq_lens, scale, out);
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &decode_attention, "paged decode attention, reading blocks in place");
}
