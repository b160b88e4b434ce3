// Attention for every row of a verify block in one call, each row with the arithmetic a one-token
// forward gives it: its own keys (a causal prefix, or a tree node's ancestors gathered in order), a
// fixed order of float ops, an exp of its own. attention_rows.inc is the generic body, compiled once
// per CPU path; head_dim 64 and 128 on AVX-512 take the wide versions (attention_wide.inc), which
// share each read of a key and a value among a kv head's queries and sum every dot product by one lane
// tree (sum16), so that a query's bits do not depend on the queries beside it.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "cpu_features.h"

namespace {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
namespace path_avx512 {
#include "attention_rows.inc"
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace path_avx2 {
#include "attention_rows.inc"
}
#pragma GCC pop_options

#include "attention_wide.inc"

// One answer's part of a call: its queries, cache and key choice, and how its rows are split into
// tasks. Every task of a part computes what a call of that part alone computes, bit for bit: the
// path (shared or one row at a time) and the arithmetic are the part's own, whatever else the call holds.
struct Part {
  const float *qp, *kp, *vp;
  float* op;
  int64_t q_row, q_head, key_head, key_row, value_head, value_row;
  int64_t rows, heads, dim, kv_heads, groups, widest;
  const int64_t* count;
  const int64_t* chosen;  // per row its keys, index_stride apart; null: the causal prefix
  int64_t index_stride;
  bool shared;  // AVX-512, causal, several rows, head_dim 64 or 128: a kv head's queries share each key read
  int64_t half, per_head, tasks;
};

// q [rows, heads, dim] (dim contiguous), key and value [kv_heads, keys, dim] (dim contiguous); row r sees
// keys index[r, 0..counts[r]) when index is given, else keys 0..counts[r]; its output rows start at ``op``.
// first_row, rows, keys: the part is q's rows [first_row, first_row + rows) against the first ``keys``
// positions of key and value (default: all of each), as that narrowing of them would give it.
Part make_part(const at::Tensor& q, const at::Tensor& key, const at::Tensor& value, const at::Tensor& counts,
               const std::optional<at::Tensor>& index, bool avx512, float* op, int64_t first_row = 0,
               int64_t rows = -1, int64_t keys = -1) {
  TORCH_CHECK(q.dim() == 3 && key.dim() == 3 && value.dim() == 3, "q, key, value: 3 dimensions");
  TORCH_CHECK(q.scalar_type() == at::kFloat && key.scalar_type() == at::kFloat && value.scalar_type() == at::kFloat,
              "float32 only");
  TORCH_CHECK(q.stride(2) == 1 && key.stride(2) == 1 && value.stride(2) == 1, "the last dimension must be contiguous");
  rows = rows < 0 ? q.size(0) : rows;
  keys = keys < 0 ? key.size(1) : keys;
  const int64_t heads = q.size(1), dim = q.size(2), kv_heads = key.size(0);
  TORCH_CHECK(first_row >= 0 && first_row + rows <= q.size(0) && keys <= key.size(1), "rows or keys out of range");
  TORCH_CHECK(heads % kv_heads == 0 && key.size(2) == dim && value.size(0) == kv_heads && value.size(1) == key.size(1) &&
              value.size(2) == dim, "shapes do not match");
  TORCH_CHECK(counts.scalar_type() == at::kLong && counts.is_contiguous() && counts.numel() == rows, "counts: int64 [rows]");
  Part part{q.data_ptr<float>() + first_row * q.stride(0), key.data_ptr<float>(), value.data_ptr<float>(), op, q.stride(0), q.stride(1),
            key.stride(0), key.stride(1), value.stride(0), value.stride(1), rows, heads, dim, kv_heads,
            heads / kv_heads, 0, counts.data_ptr<int64_t>(), nullptr, 0, false, 0, 0, 0};
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(part.count[r] >= 1 && part.count[r] <= keys, "a row must see between 1 and all keys");
    part.widest = std::max(part.widest, part.count[r]);
  }
  if (index.has_value()) {
    TORCH_CHECK(index->scalar_type() == at::kLong && index->dim() == 2 && index->size(0) == rows &&
                index->size(1) >= part.widest && index->stride(1) == 1, "index: int64 [rows, >= counts]");
    part.chosen = index->data_ptr<int64_t>();
    part.index_stride = index->stride(0);
    for (int64_t r = 0; r < rows; ++r) {  // a key outside the cache would be read from past its end
      const int64_t* seen = part.chosen + r * part.index_stride;
      int64_t low = 0, high = 0;
      for (int64_t j = 0; j < part.count[r]; ++j) {
        low = std::min(low, seen[j]);
        high = std::max(high, seen[j]);
      }
      TORCH_CHECK(low >= 0 && high < keys, "index: row ", r, " names key ", low < 0 ? low : high, " of ", keys);
    }
  }
  part.shared = avx512 && !index.has_value() && rows > 1 && (dim == 64 || dim == 128);
  part.per_head = rows * part.groups;
  part.half = (part.per_head + 1) / 2;
  part.tasks = part.shared ? kv_heads * 2 : rows * heads;  // the shared path: per kv head, its queries in two halves
  return part;
}

// A thread's scratch, sized for the largest part: each task uses the start of each buffer as its part alone would.
struct Scratch {
  std::vector<float> scores, sums;
  std::vector<const float*> qs;
  std::vector<float*> outs;
  std::vector<int64_t> counts;
};

void run_task(const Part& p, int64_t task, const int64_t* causal, bool avx512, float scale, Scratch& s) {
  if (p.shared) {
    const int64_t g = task / 2, first = (task % 2) * p.half;
    const int n = static_cast<int>(std::min(p.half, p.per_head - first));
    if (n <= 0) return;
    for (int i = 0; i < n; ++i) {
      const int64_t r = (first + i) / p.groups, h = g * p.groups + (first + i) % p.groups;
      s.qs[i] = p.qp + r * p.q_row + h * p.q_head;
      s.outs[i] = p.op + (r * p.heads + h) * p.dim;
      s.counts[i] = p.count[r];
    }
    if (p.dim == 64)
      attend_shared_wide<64>(s.qs.data(), s.outs.data(), s.counts.data(), n, p.kp + g * p.key_head, p.vp + g * p.value_head,
                             p.key_row, p.value_row, scale, s.scores.data(), p.widest, s.sums.data());
    else
      attend_shared_wide<128>(s.qs.data(), s.outs.data(), s.counts.data(), n, p.kp + g * p.key_head, p.vp + g * p.value_head,
                              p.key_row, p.value_row, scale, s.scores.data(), p.widest, s.sums.data());
    return;
  }
  const int64_t r = task / p.heads, h = task % p.heads, g = h / p.groups;
  const float* qr = p.qp + r * p.q_row + h * p.q_head;
  const float* kg = p.kp + g * p.key_head;
  const float* vg = p.vp + g * p.value_head;
  const int64_t* keys_r = p.chosen ? p.chosen + r * p.index_stride : causal;
  float* o = p.op + (r * p.heads + h) * p.dim;
  if (avx512 && p.dim == 64) attend_one_wide<64>(qr, kg, vg, p.key_row, p.value_row, keys_r, p.count[r], scale, s.scores.data(), o);
  else if (avx512 && p.dim == 128) attend_one_wide<128>(qr, kg, vg, p.key_row, p.value_row, keys_r, p.count[r], scale,
                                                        s.scores.data(), o);
  else if (avx512) path_avx512::attend_one(qr, kg, vg, p.key_row, p.value_row, keys_r, p.count[r], p.dim, scale,
                                           s.scores.data(), o);
  else path_avx2::attend_one(qr, kg, vg, p.key_row, p.value_row, keys_r, p.count[r], p.dim, scale, s.scores.data(), o);
}

void run_parts(const std::vector<Part>& parts, bool avx512, double scale);

// The rows of several answers in one call (batched decoding), each answer on its own cache: q[i] its
// queries, key[i] and value[i] its cache, counts[i] and index[i] its key choice (see make_part).
// Returns every answer's [rows_i, heads, dim] one after another, as [sum of rows, heads, dim].
at::Tensor attend_rows(at::TensorList q, at::TensorList key, at::TensorList value, at::TensorList counts,
                       const c10::List<std::optional<at::Tensor>>& index, double scale, bool avx512) {
  require_cpu(avx512);
  const size_t answers = q.size();
  TORCH_CHECK(answers >= 1 && key.size() == answers && value.size() == answers && counts.size() == answers &&
              index.size() == answers, "one q, key, value, counts and index an answer");
  int64_t total = 0;
  for (size_t i = 0; i < answers; ++i) {
    TORCH_CHECK(q[i].dim() == 3 && q[i].size(1) == q[0].size(1) && q[i].size(2) == q[0].size(2), "answers' heads differ");
    total += q[i].size(0);
  }
  auto out = at::empty({total, q[0].size(1), q[0].size(2)}, q[0].options());
  std::vector<Part> parts;
  int64_t rows_before = 0;
  for (size_t i = 0; i < answers; ++i) {
    const std::optional<at::Tensor> chosen = index.get(i);
    parts.push_back(make_part(q[i], key[i], value[i], counts[i], chosen, avx512,
                              out.data_ptr<float>() + rows_before * q[0].size(1) * q[0].size(2)));
    rows_before += q[i].size(0);
  }
  run_parts(parts, avx512, scale);
  return out;
}

// Every task of every part, split over torch's threads; a task's result is its part's alone.
void run_parts(const std::vector<Part>& parts, bool avx512, double scale) {
  const size_t answers = parts.size();
  std::vector<int64_t> first_task(answers + 1, 0);
  int64_t widest = 0, half = 0;
  for (size_t i = 0; i < answers; ++i) {
    first_task[i + 1] = first_task[i] + parts[i].tasks;
    widest = std::max(widest, parts[i].widest);
    half = std::max(half, parts[i].half);
  }
  std::vector<int64_t> causal(widest);
  for (int64_t j = 0; j < widest; ++j) causal[j] = j;
  const int64_t dim = parts[0].dim, padded = (half + 3) / 4 * 4;
  at::parallel_for(0, first_task[answers], 1, [&](int64_t begin, int64_t end) {
    Scratch s{std::vector<float>(std::max(padded, int64_t{1}) * widest), std::vector<float>(half * dim),
              std::vector<const float*>(half), std::vector<float*>(half), std::vector<int64_t>(half)};
    size_t i = std::upper_bound(first_task.begin(), first_task.end(), begin) - first_task.begin() - 1;
    for (int64_t task = begin; task < end; ++task) {
      while (task >= first_task[i + 1]) ++i;
      run_task(parts[i], task - first_task[i], causal.data(), avx512, static_cast<float>(scale), s);
    }
  });
}

// answer i's new rows, rows [start, start + count) of k_new or v_new ([rows, kv_heads, dim]), into its
// buffer [kv_heads, room, dim] at positions cached, cached + 1, ...: the bytes a copy of them gives.
void write_rows(const at::Tensor& rows, int64_t start, int64_t count, const at::Tensor& buffer, int64_t cached) {
  const float* from = rows.data_ptr<float>();
  float* to = buffer.data_ptr<float>();
  const int64_t dim = rows.size(2), bytes = dim * static_cast<int64_t>(sizeof(float));
  for (int64_t r = 0; r < count; ++r)
    for (int64_t h = 0; h < rows.size(1); ++h)
      std::memcpy(to + h * buffer.stride(0) + (cached + r) * buffer.stride(1), from + (start + r) * rows.stride(0) + h * rows.stride(1),
                  bytes);
}

// attend_rows for answers whose caches have room (runtime/reserved_cache.py): q, k_new and v_new hold
// every answer's new rows one after another ([rows, heads or kv heads, dim]), answer i's are the next
// counts[i].numel(); they are written into key_buffers[i] and value_buffers[i] ([kv_heads, room, dim])
// after its cached[i] positions, and each answer attends over its buffers' first cached[i] + rows
// positions, as attend_rows computes it. One call a layer for a batch: in Python each answer's
// slices, copies and views cost more than its attention.
at::Tensor attend_cached(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new, at::TensorList key_buffers,
                         at::TensorList value_buffers, at::IntArrayRef cached, at::TensorList counts,
                         const c10::List<std::optional<at::Tensor>>& index, double scale, bool avx512) {
  const size_t answers = key_buffers.size();
  TORCH_CHECK(answers >= 1 && value_buffers.size() == answers && cached.size() == answers && counts.size() == answers &&
              index.size() == answers, "one key buffer, value buffer, cached length, counts and index an answer");
  TORCH_CHECK(q.dim() == 3 && k_new.dim() == 3 && v_new.sizes() == k_new.sizes() && q.size(0) == k_new.size(0) &&
              q.size(2) == k_new.size(2), "q, k_new and v_new: [rows, heads, dim], one row each");
  TORCH_CHECK(k_new.scalar_type() == at::kFloat && v_new.scalar_type() == at::kFloat && k_new.stride(2) == 1 &&
              v_new.stride(2) == 1, "k_new and v_new: float32, the last dimension contiguous");
  auto out = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  std::vector<Part> parts;
  int64_t start = 0;
  for (size_t i = 0; i < answers; ++i) {
    const at::Tensor &kb = key_buffers[i], &vb = value_buffers[i];
    const int64_t rows = counts[i].numel(), seen = cached[i] + rows;
    TORCH_CHECK(kb.dim() == 3 && vb.sizes() == kb.sizes() && kb.size(0) == k_new.size(1) && kb.size(2) == k_new.size(2) &&
                kb.scalar_type() == at::kFloat && vb.scalar_type() == at::kFloat && kb.stride(2) == 1 && vb.stride(2) == 1,
                "buffers: float32 [kv_heads, room, dim], the last dimension contiguous");
    TORCH_CHECK(cached[i] >= 0 && seen <= kb.size(1) && start + rows <= k_new.size(0), "answer ", i, ": ", rows,
                " rows after ", cached[i], " cached do not fit its buffer of ", kb.size(1));
    parts.push_back(make_part(q, kb, vb, counts[i], index.get(i), avx512, out.data_ptr<float>() + start * q.size(1) * q.size(2),
                              start, rows, seen));
    start += rows;
  }
  TORCH_CHECK(start == q.size(0), "the answers' rows are ", start, " of ", q.size(0));
  start = 0;  // every answer checked: only now is anything written
  for (size_t i = 0; i < answers; ++i) {
    write_rows(k_new, start, parts[i].rows, key_buffers[i], cached[i]);
    write_rows(v_new, start, parts[i].rows, value_buffers[i], cached[i]);
    start += parts[i].rows;
  }
  run_parts(parts, avx512, scale);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("attend_rows", &attend_rows);
  m.impl("attend_cached", &attend_cached);
}
