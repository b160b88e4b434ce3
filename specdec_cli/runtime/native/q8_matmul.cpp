// A weight-only int4/int8 matmul whose cost hardly grows with the rows of a verify block, and whose
// every row is bit-identical to the same row computed alone.
//
// Each activation row is quantised to int8 per block of 32 values (scale amax / 127, as llama.cpp's
// Q8_0), and multiplied by the unsigned weight codes with int32 dot products (AVX-512 VNNI's
// vpdpbusd; AVX2's maddubs/madd). Integer sums are exact, so their order does not matter; the float
// part, per row, output and block, is always the same two fused multiply-adds in block order:
//     y = fma(float(dot), d_w * d_x, y);   y = fma(m_w, d_x * float(sum of the row's codes), y)
// for weights w = d_w * code + m_w. A row never shares a reduction with another row and the work is
// split over outputs only, so neither the number of rows nor of threads can change a result. The
// weights of a 16-output tile are read once from memory for every row (later row blocks find them in
// L1), which is what keeps extra rows cheap. A long block (a prompt's) goes through each thread's
// tiles a chunk of rows at a time, so that the chunk's codes stay in L1/L2 while its tiles' weights
// stay in L2: one pass over all rows per tile streamed every row's codes again from L3.
//
// Weight layout, per tile of 16 outputs and block of 32 inputs: 8 quads of 4 inputs, each quad
// 64 bytes (output n's 4 codes at bytes 4n..4n+3, the order vpdpbusd multiplies in). 4-bit codes
// pack two quads in 64 bytes: quad 2i in the low nibbles, quad 2i + 1 in the high ones.
//
// bits 6 (a GGUF Q6_K tensor's scale per 16 weights): codes a byte each as at 8 bits (Q6_K's are 0..63;
// a sibling stacked with it may hold up to 255), and a scale and an offset per half block (inputs
// 0-15, 16-31); each half is its own integer dot and its own two fused multiply-adds, the first
// half's before the second's:
//     y = fma(float(dot_h), d_w,h * d_x, y);   y = fma(m_w,h, d_x * float(sum of the half's codes), y)
//
// Weight scales and offsets are float32 or float16 (a GGUF block's own: exact in float32 once loaded),
// and an offset is either stored or a fixed multiple of its scale (-8 d for Q4_0, -128 d for Q8_0:
// an exact float32 product), so that a weight takes as few bytes as the file's block. Either way the
// two fused multiply-adds above see the same float32 values.

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
#include <vector>

#include "cpu_features.h"

namespace {

constexpr int64_t BLOCK = 32;  // inputs per activation scale and per weight scale
constexpr int64_t TILE = 16;   // outputs per tile
constexpr int64_t CHUNK_CODES = 96 * 1024;  // activation codes (bytes) a chunk of rows holds: an L2's share beside the weights

// Rows per chunk for K inputs: a multiple of the 8 rows an AVX-512 pass takes, at least one pass.
constexpr int64_t chunk_rows(int64_t k) { return std::max<int64_t>(8, CHUNK_CODES / k / 8 * 8); }

// Bytes of one tile's weight codes for one block: 16 outputs x 32 inputs at 4 or 8 bits (6-bit codes take a byte).
constexpr int64_t block_bytes(int64_t bits) { return TILE * BLOCK * (bits == 6 ? 8 : bits) / 8; }
// Weight scales (and offsets) per tile and block: one per output, or one per output and half block at bits 6.
constexpr int64_t scales_per_block(int64_t bits) { return bits == 6 ? 2 * TILE : TILE; }

struct Quantised {
  std::vector<int8_t> codes;   // [rows, K]
  std::vector<float> scale;    // [rows, K / 32]
  std::vector<float> offset;   // [rows, K / 32]: scale * sum of the block's codes
  std::vector<float> halves;   // [rows, K / 32, 2]: scale * sum of each half's codes (bits 6 only, else empty)
};

// One tensor's weight scales and offsets, [tiles, blocks, 16] ([tiles, blocks, 2, 16] at bits 6), read 16
// (AVX-512) or 8 (AVX2) outputs at a time as float32.
struct WeightScales {
  const void* scale;
  const void* offset;  // nullptr: offset = multiple * scale
  bool half;           // float16, else float32
  float multiple;

  WeightScales at(int64_t element) const {
    const int64_t bytes = element * (half ? 2 : 4);
    return {static_cast<const char*>(scale) + bytes, offset ? static_cast<const char*>(offset) + bytes : nullptr, half,
            multiple};
  }

  __attribute__((target("avx512f"))) static __m512 load16(const void* base, int64_t i, bool half) {
    return half ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i)))
                : _mm512_loadu_ps(static_cast<const float*>(base) + i);
  }
  __attribute__((target("avx512f"))) __m512 scale16(int64_t i) const { return load16(scale, i, half); }
  __attribute__((target("avx512f"))) __m512 offset16(int64_t i) const {
    return offset ? load16(offset, i, half) : _mm512_mul_ps(scale16(i), _mm512_set1_ps(multiple));
  }

  __attribute__((target("avx2,f16c"))) static __m256 load8(const void* base, int64_t i, bool half) {
    return half ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i)))
                : _mm256_loadu_ps(static_cast<const float*>(base) + i);
  }
  __attribute__((target("avx2,f16c"))) __m256 scale8(int64_t i) const { return load8(scale, i, half); }
  __attribute__((target("avx2,f16c"))) __m256 offset8(int64_t i) const {
    return offset ? load8(offset, i, half) : _mm256_mul_ps(scale8(i), _mm256_set1_ps(multiple));
  }
};

struct Sums {
  int32_t low, high;  // of codes 0-15 and 16-31
};

// One block of 32 values: code = round-to-even(v * (1 / d)), d = amax / 127. Both versions do these
// same float ops per value (a maximum is exact in any order), so they give the same codes.
Sums quantise_block(const float* v, int8_t* out, float inverse) {
  Sums sums{0, 0};
  for (int64_t i = 0; i < BLOCK; ++i) {
    const int32_t c = static_cast<int32_t>(std::nearbyint(v[i] * inverse));
    out[i] = static_cast<int8_t>(c);
    (i < BLOCK / 2 ? sums.low : sums.high) += c;
  }
  return sums;
}

__attribute__((target("avx512f")))
Sums quantise_block_avx512(const float* v, int8_t* out, float inverse) {
  const __m512 by = _mm512_set1_ps(inverse);
  const __m512i low = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v), by));  // rounds to even
  const __m512i high = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + 16), by));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(low));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm512_cvtepi32_epi8(high));
  return Sums{_mm512_reduce_add_epi32(low), _mm512_reduce_add_epi32(high)};
}

__attribute__((target("avx512f")))
float block_amax_avx512(const float* v) {
  const __m512 both = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(v)), _mm512_abs_ps(_mm512_loadu_ps(v + 16)));
  return _mm512_reduce_max_ps(both);
}

// Whether a block holds only finite values: v * 0 is NaN for a NaN or an infinity, else 0.
bool finite_block(const float* v) {
  float probe = 0.f;
  for (int64_t i = 0; i < BLOCK; ++i) probe += v[i] * 0.f;
  return probe == 0.f;
}

// Row by row, block by block: a row gets the same codes alone or in a block of rows. A block with a
// NaN or an infinity gets no codes (converting them to integers is undefined behaviour) and a NaN
// scale, so its row's outputs are NaN, as a float matmul's would be. Rows are independent, so the
// threads share them in tasks of 64 rows (a prompt's thousands of rows on one thread left the others
// waiting; a verify block stays on one).
Quantised quantise_rows(const float* x, int64_t rows, int64_t k, bool avx512, bool halves) {
  const int64_t blocks = k / BLOCK;
  Quantised q{std::vector<int8_t>(rows * k), std::vector<float>(rows * blocks), std::vector<float>(rows * blocks),
              std::vector<float>(halves ? 2 * rows * blocks : 0)};
  at::parallel_for(0, rows, 64, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        const float* v = x + r * k + b * BLOCK;
        if (!finite_block(v)) {  // the codes stay 0
          q.scale[r * blocks + b] = q.offset[r * blocks + b] = std::numeric_limits<float>::quiet_NaN();
          if (halves) q.halves[2 * (r * blocks + b)] = q.halves[2 * (r * blocks + b) + 1] = q.scale[r * blocks + b];
          continue;
        }
        float amax = 0.f;
        if (avx512) {
          amax = block_amax_avx512(v);
        } else {
          for (int64_t i = 0; i < BLOCK; ++i) amax = std::fmax(amax, std::fabs(v[i]));
        }
        const float d = amax / 127.f;
        const float inverse = d != 0.f ? 1.f / d : 0.f;
        int8_t* out = q.codes.data() + r * k + b * BLOCK;
        const Sums sums = avx512 ? quantise_block_avx512(v, out, inverse) : quantise_block(v, out, inverse);
        q.scale[r * blocks + b] = d;
        q.offset[r * blocks + b] = d * static_cast<float>(sums.low + sums.high);
        if (halves) {
          q.halves[2 * (r * blocks + b)] = d * static_cast<float>(sums.low);
          q.halves[2 * (r * blocks + b) + 1] = d * static_cast<float>(sums.high);
        }
      }
    }
  });
  return q;
}

// ---- AVX-512 VNNI -------------------------------------------------------------------------------

template <int BITS, int R>
__attribute__((target("avx512f,avx512bw,avx512vnni,fma")))
void tile_avx512(const uint8_t* w, const WeightScales& ws, const Quantised& q, int64_t row0,
                 int64_t k, float* y, int64_t n_total, int64_t n0) {
  const int64_t blocks = k / BLOCK;
  __m512 acc[R][2];  // even and odd blocks: two float chains, summed at the end
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* wb = w + b * block_bytes(BITS);
    __m512i quads[8];
    if (BITS == 4) {
      for (int i = 0; i < 4; ++i) {
        const __m512i packed = _mm512_loadu_si512(wb + 64 * i);
        quads[2 * i] = _mm512_and_si512(packed, low);
        quads[2 * i + 1] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
      }
    } else {
      for (int i = 0; i < 8; ++i) quads[i] = _mm512_loadu_si512(wb + 64 * i);
    }
    const __m512 scale_w = ws.scale16(b * scales_per_block(BITS));  // at bits 6: the first half's
    const __m512 offset_w = ws.offset16(b * scales_per_block(BITS));
    for (int r = 0; r < R; ++r) {
      const int64_t row = row0 + r;
      const int32_t* codes = reinterpret_cast<const int32_t*>(q.codes.data() + row * k + b * BLOCK);
      __m512i dots[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};  // two chains; integer sums are exact
      for (int i = 0; i < 8; ++i) {
        int32_t four;
        std::memcpy(&four, codes + i, 4);
        const int chain = BITS == 6 ? i / 4 : i & 1;  // at bits 6 a chain per half block
        dots[chain] = _mm512_dpbusd_epi32(dots[chain], quads[i], _mm512_set1_epi32(four));
      }
      const __m512 d_x = _mm512_set1_ps(q.scale[row * blocks + b]);
      __m512& sum = acc[r][b & 1];
      if constexpr (BITS == 6) {
        const float* halves = q.halves.data() + 2 * (row * blocks + b);
        for (int h = 0; h < 2; ++h) {
          const __m512 scale_h = _mm512_mul_ps(ws.scale16(b * 2 * TILE + h * TILE), d_x);
          sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[h]), scale_h, sum);
          sum = _mm512_fmadd_ps(ws.offset16(b * 2 * TILE + h * TILE), _mm512_set1_ps(halves[h]), sum);
        }
      } else {
        const __m512i dot = _mm512_add_epi32(dots[0], dots[1]);
        const __m512 scale = _mm512_mul_ps(scale_w, d_x);
        sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, sum);
        sum = _mm512_fmadd_ps(offset_w, _mm512_set1_ps(q.offset[row * blocks + b]), sum);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + (row0 + r) * n_total + n0, _mm512_add_ps(acc[r][0], acc[r][1]));
}

// ---- AVX2 (no VNNI): the same integers by maddubs/madd, the same float ops -----------------------

template <int BITS, int R>
__attribute__((target("avx2,fma,f16c")))
void tile_avx2(const uint8_t* w, const WeightScales& ws, const Quantised& q, int64_t row0,
               int64_t k, float* y, int64_t n_total, int64_t n0) {
  const int64_t blocks = k / BLOCK;
  __m256 acc[R][2][2];  // per half of the tile, even and odd blocks (as the AVX-512 path)
  for (int r = 0; r < R; ++r)
    for (int half = 0; half < 2; ++half) acc[r][half][0] = acc[r][half][1] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* wb = w + b * block_bytes(BITS);
    __m256i quads[8][2];  // per quad, outputs 0-7 and 8-15
    for (int half = 0; half < 2; ++half) {
      if (BITS == 4) {
        for (int i = 0; i < 4; ++i) {
          const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * i + 32 * half));
          quads[2 * i][half] = _mm256_and_si256(packed, low);
          quads[2 * i + 1][half] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
        }
      } else {
        for (int i = 0; i < 8; ++i)
          quads[i][half] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * i + 32 * half));
      }
    }
    for (int half = 0; half < 2; ++half) {
      const __m256 scale_w = ws.scale8(b * scales_per_block(BITS) + 8 * half);
      const __m256 offset_w = ws.offset8(b * scales_per_block(BITS) + 8 * half);
      for (int r = 0; r < R; ++r) {
        const int64_t row = row0 + r;
        const uint8_t* codes = reinterpret_cast<const uint8_t*>(q.codes.data() + row * k + b * BLOCK);
        __m256i dot = _mm256_setzero_si256();
        __m256i dots[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};  // bits 6: per half block
        for (int i = 0; i < 8; ++i) {
          int32_t four;
          std::memcpy(&four, codes + 4 * i, 4);
          const __m256i x = _mm256_set1_epi32(four);
          if (BITS == 4) {  // codes <= 15: a pair's sum stays far inside int16
            dot = _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(quads[i][half], x), ones));
          } else {  // codes up to 255 would saturate int16: (code - 128) * x, then + 128 * x
            const __m256i centred = _mm256_xor_si256(quads[i][half], bias);  // signed code - 128
            const __m256i magnitude = _mm256_sign_epi8(centred, centred);
            const __m256i signed_x = _mm256_sign_epi8(x, centred);
            __m256i& chain = BITS == 6 ? dots[i / 4] : dot;  // at bits 6 a sum per half block
            chain = _mm256_add_epi32(chain, _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, signed_x), ones));
          }
        }
        if (BITS == 8) {
          int32_t sum = 0;
          for (int i = 0; i < BLOCK; ++i) sum += static_cast<int8_t>(codes[i]);
          dot = _mm256_add_epi32(dot, _mm256_set1_epi32(128 * sum));
        }
        if (BITS == 6) {
          for (int h = 0; h < 2; ++h) {
            int32_t sum = 0;
            for (int i = 0; i < BLOCK / 2; ++i) sum += static_cast<int8_t>(codes[h * BLOCK / 2 + i]);
            dots[h] = _mm256_add_epi32(dots[h], _mm256_set1_epi32(128 * sum));
          }
        }
        const __m256 d_x = _mm256_set1_ps(q.scale[row * blocks + b]);
        __m256& sum = acc[r][half][b & 1];
        if constexpr (BITS == 6) {
          const float* halves = q.halves.data() + 2 * (row * blocks + b);
          for (int h = 0; h < 2; ++h) {
            const __m256 scale_h = _mm256_mul_ps(ws.scale8(b * 2 * TILE + h * TILE + 8 * half), d_x);
            sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[h]), scale_h, sum);
            const __m256 offset_h = ws.offset8(b * 2 * TILE + h * TILE + 8 * half);
            sum = _mm256_fmadd_ps(offset_h, _mm256_set1_ps(halves[h]), sum);
          }
        } else {
          const __m256 scale = _mm256_mul_ps(scale_w, d_x);
          sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, sum);
          sum = _mm256_fmadd_ps(offset_w, _mm256_set1_ps(q.offset[row * blocks + b]), sum);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int half = 0; half < 2; ++half)
      _mm256_storeu_ps(y + (row0 + r) * n_total + n0 + 8 * half, _mm256_add_ps(acc[r][half][0], acc[r][half][1]));
}

// Rows in passes of up to 8 (AVX-512: 32 registers) or 4 (AVX2: 16) over one tile: the weights are
// unpacked once a pass, and only the first pass reads them from memory.
template <int BITS, int R>
void pass(bool avx512, const uint8_t* w, const WeightScales& ws, const Quantised& q, int64_t row, int64_t k,
          float* y, int64_t n, int64_t n0) {
  if constexpr (R <= 4) {
    if (!avx512) return tile_avx2<BITS, R>(w, ws, q, row, k, y, n, n0);
  }
  if constexpr (R <= 8) tile_avx512<BITS, R>(w, ws, q, row, k, y, n, n0);
}

// Rows [first, last) of one tile.
template <int BITS>
void tiles(bool avx512, const uint8_t* w, const WeightScales& ws, const Quantised& q, int64_t first, int64_t last,
           int64_t k, float* y, int64_t n, int64_t tile) {
  const int64_t blocks = k / BLOCK;
  const int64_t tile_bytes = blocks * block_bytes(BITS);
  const uint8_t* wt = w + tile * tile_bytes;
  const WeightScales st = ws.at(tile * blocks * scales_per_block(BITS));
  const int64_t most = avx512 ? 8 : 4, n0 = tile * TILE;
  for (int64_t row = first; row < last; row += most) {
    switch (std::min(most, last - row)) {
      case 8: pass<BITS, 8>(avx512, wt, st, q, row, k, y, n, n0); break;
      case 7: pass<BITS, 7>(avx512, wt, st, q, row, k, y, n, n0); break;
      case 6: pass<BITS, 6>(avx512, wt, st, q, row, k, y, n, n0); break;
      case 5: pass<BITS, 5>(avx512, wt, st, q, row, k, y, n, n0); break;
      case 4: pass<BITS, 4>(avx512, wt, st, q, row, k, y, n, n0); break;
      case 3: pass<BITS, 3>(avx512, wt, st, q, row, k, y, n, n0); break;
      case 2: pass<BITS, 2>(avx512, wt, st, q, row, k, y, n, n0); break;
      default: pass<BITS, 1>(avx512, wt, st, q, row, k, y, n, n0); break;
    }
  }
}

// x [rows, K] float32; codes [N / 16, K / 32, 256 or 512] uint8; scale [N / 16, K / 32, 16] float32 or
// float16 ([N / 16, K / 32, 2, 16] at bits 6); offset the same as scale, or one float32 value: the multiple
// of the scale that every offset is.
at::Tensor q8_matmul(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& offset,
                     int64_t bits, bool avx512) {
  require_cpu(avx512);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x: contiguous float32 [rows, K]");
  TORCH_CHECK(bits == 4 || bits == 6 || bits == 8, "bits: 4, 6 (8-bit codes, scales per 16) or 8");
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.dim() == 3 && codes.is_contiguous(), "codes: uint8 [tiles, blocks, bytes]");
  const int64_t rows = x.size(0), k = x.size(1), tiles_n = codes.size(0), n = tiles_n * TILE;
  TORCH_CHECK(k % BLOCK == 0 && codes.size(1) == k / BLOCK && codes.size(2) == block_bytes(bits), "codes do not fit x");
  const bool half = scale.scalar_type() == at::kHalf;
  const bool multiple = offset.numel() == 1 && offset.scalar_type() == at::kFloat;
  TORCH_CHECK((half || scale.scalar_type() == at::kFloat) && scale.is_contiguous() &&
              scale.numel() == n / TILE * (k / BLOCK) * scales_per_block(bits),
              "scale: float32 or float16 [tiles, blocks, 16] ([tiles, blocks, 2, 16] at bits 6)");
  TORCH_CHECK(multiple || (offset.scalar_type() == scale.scalar_type() && offset.is_contiguous() &&
                           offset.numel() == scale.numel()),
              "offset: scale's dtype and shape, or one float32 value (the multiple of the scale)");
  auto y = at::empty({rows, n}, x.options());
  if (rows == 0) return y;
  const Quantised q = quantise_rows(x.data_ptr<float>(), rows, k, avx512, bits == 6);
  const uint8_t* w = codes.data_ptr<uint8_t>();
  const WeightScales ws{scale.data_ptr(), multiple ? nullptr : offset.data_ptr(), half,
                        multiple ? offset.data_ptr<float>()[0] : 0.f};
  float* out = y.data_ptr<float>();
  const int64_t chunk = chunk_rows(k);
  at::parallel_for(0, tiles_n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t first = 0; first < rows; first += chunk) {
      const int64_t last = std::min(rows, first + chunk);
      for (int64_t tile = begin; tile < end; ++tile) {
        if (bits == 4) tiles<4>(avx512, w, ws, q, first, last, k, out, n, tile);
        else if (bits == 6) tiles<6>(avx512, w, ws, q, first, last, k, out, n, tile);
        else tiles<8>(avx512, w, ws, q, first, last, k, out, n, tile);
      }
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("q8_matmul", &q8_matmul);
}
