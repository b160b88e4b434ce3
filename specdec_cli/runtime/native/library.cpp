// specdec's kernel library: its ops, declared once here; each source file registers its own
// implementation (q8_matmul.cpp, attention_rows.cpp).

#include <torch/library.h>

TORCH_LIBRARY(specdec, m) {
  m.def("q8_matmul(Tensor x, Tensor codes, Tensor scale, Tensor offset, int bits, bool avx512) -> Tensor");
  m.def("attend_rows(Tensor[] q, Tensor[] key, Tensor[] value, Tensor[] counts, Tensor?[] index, float scale, bool avx512) -> Tensor");
  m.def("attend_cached(Tensor q, Tensor k_new, Tensor v_new, Tensor(a!)[] key_buffers, Tensor(b!)[] value_buffers, int[] cached, "
        "Tensor[] counts, Tensor?[] index, float scale, bool avx512) -> Tensor");
}
