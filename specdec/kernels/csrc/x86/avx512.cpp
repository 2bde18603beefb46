// The AVX-512 VNNI path (AMD Zen 4 on, Intel Xeon from Cascade Lake on): 16 columns a zmm, int8 products on vpdpbusd
// (w + 128 unsigned times q signed, less 128 sum q), up to 8 activation rows x 2 column blocks per pass over the
// weights. kernels.h defines every number; this file reproduces reference.cpp bit for bit.
#include "../kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

namespace specbench {
namespace path {

const char* const NAME = "avx512-vnni";

namespace {

constexpr int MAX_TILE = 8;  // activation rows per pass over a block's weights
constexpr int64_t PREFETCH = 4096;  // bytes ahead of each weight stream: more lines in flight than the prefetchers keep

// Lanes past `remaining` off; none when remaining <= 0 (a padded int4 row runs past K by up to a group).
inline __mmask16 tail_mask(int64_t remaining) {
  return remaining >= 16 ? __mmask16(0xFFFF) : remaining <= 0 ? __mmask16(0) : __mmask16((1u << remaining) - 1u);
}

inline float fold(__m512 v) {  // kernels.h's sum16
  alignas(64) float lane[16];
  _mm512_store_ps(lane, v);
  return sum16(lane);
}

// exp_ref for 16 values (masked tails, never scalar, so a value's exp is the same wherever it sits).
inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(EXP_HI)), _mm512_set1_ps(EXP_LO));
  __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(LOG2E), _mm512_set1_ps(0.5f)),
                                   _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(LN2_HI), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(LN2_LO), x);
  __m512 z = _mm512_mul_ps(x, x);
  __m512 y = _mm512_set1_ps(EXP_P0);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(EXP_P1));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(EXP_P2));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(EXP_P3));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(EXP_P4));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(EXP_P5));
  y = _mm512_add_ps(_mm512_fmadd_ps(y, z, x), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, fx);  // y * 2^fx, rounded once: scale_pow2
}

// y = (t * x_scale + bias) + residual, per element.
inline void store(__m512 t, float x_scale, const float* bias, const float* residual, float* y, __mmask16 mask) {
  t = _mm512_mul_ps(t, _mm512_set1_ps(x_scale));
  if (bias) t = _mm512_add_ps(t, _mm512_maskz_loadu_ps(mask, bias));
  if (residual) t = _mm512_add_ps(t, _mm512_maskz_loadu_ps(mask, residual));
  _mm512_mask_storeu_ps(y, mask, t);
}

// T activation rows x B column blocks (B <= 2): one pass over the blocks' weights, T * B independent accumulators.
template <int T, int B>
void tile_int8(const Rows& rows, int64_t m0, const Linear& w, const float* residual, float* y, int64_t nb) {
  __m512i acc[T][B];
  const int32_t* x[T];
  const uint8_t* block[B];
  for (int b = 0; b < B; ++b) block[b] = w.weight + (nb + b) * COLS * w.Kp;
  for (int r = 0; r < T; ++r) {
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_si512();
    x[r] = reinterpret_cast<const int32_t*>(rows.q + (m0 + r) * rows.Kp);
  }
  const int64_t chunks = rows.Kp / 4;
  for (int64_t c = 0; c < chunks; ++c) {
    __m512i wv[B];
    for (int b = 0; b < B; ++b) {
      _mm_prefetch(reinterpret_cast<const char*>(block[b] + c * 64 + PREFETCH), _MM_HINT_T0);
      wv[b] = _mm512_loadu_si512(block[b] + c * 64);
    }
    for (int r = 0; r < T; ++r) {
      const __m512i xr = _mm512_set1_epi32(x[r][c]);
      for (int b = 0; b < B; ++b) acc[r][b] = _mm512_dpbusd_epi32(acc[r][b], wv[b], xr);
    }
  }
  for (int b = 0; b < B; ++b) {
    const int64_t n0 = (nb + b) * COLS;
    const __mmask16 mask = tail_mask(w.N - n0);
    const __m512 scale = _mm512_maskz_loadu_ps(mask, w.col_scale + n0);
    for (int r = 0; r < T; ++r) {
      const int64_t m = m0 + r;
      __m512i exact = _mm512_sub_epi32(acc[r][b], _mm512_set1_epi32(128 * rows.sums[m]));
      __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(exact), scale);
      store(t, rows.scale[m], w.bias ? w.bias + n0 : nullptr, residual ? residual + m * w.N + n0 : nullptr,
            y + m * w.N + n0, mask);
    }
  }
}

template <int T, int B>
void tile_int4(const Rows& rows, int64_t m0, const Linear& w, const float* residual, float* y, int64_t nb) {
  __m512 total[T][B];
  const int32_t* x[T];
  const uint8_t* block[B];
  const uint16_t* group_scale[B];
  for (int b = 0; b < B; ++b) {
    block[b] = w.weight + (nb + b) * COLS * w.Kp / 2;
    group_scale[b] = w.group_scale + (nb + b) * COLS * rows.groups;
  }
  for (int r = 0; r < T; ++r) {
    for (int b = 0; b < B; ++b) total[r][b] = _mm512_setzero_ps();
    x[r] = reinterpret_cast<const int32_t*>(rows.q + (m0 + r) * rows.Kp);
  }
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int64_t per_group = w.group / 8;  // 64-byte chunks (8 k each) in a group
  for (int64_t g = 0; g < rows.groups; ++g) {
    __m512i acc[T][B];
    for (int r = 0; r < T; ++r)
      for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_si512();
    for (int64_t c = g * per_group; c < (g + 1) * per_group; ++c) {
      __m512i lo[B], hi[B];
      for (int b = 0; b < B; ++b) {
        _mm_prefetch(reinterpret_cast<const char*>(block[b] + c * 64 + PREFETCH), _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512(block[b] + c * 64);
        lo[b] = _mm512_and_si512(v, low);
        hi[b] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
      for (int r = 0; r < T; ++r) {
        const __m512i xlo = _mm512_set1_epi32(x[r][2 * c]), xhi = _mm512_set1_epi32(x[r][2 * c + 1]);
        for (int b = 0; b < B; ++b) {
          acc[r][b] = _mm512_dpbusd_epi32(acc[r][b], lo[b], xlo);
          acc[r][b] = _mm512_dpbusd_epi32(acc[r][b], hi[b], xhi);
        }
      }
    }
    for (int b = 0; b < B; ++b) {
      const __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(group_scale[b] + g * COLS)));
      for (int r = 0; r < T; ++r) {
        __m512i exact = _mm512_sub_epi32(acc[r][b], _mm512_set1_epi32(8 * rows.sums[(m0 + r) * rows.groups + g]));
        total[r][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), scale, total[r][b]);
      }
    }
  }
  for (int b = 0; b < B; ++b) {
    const int64_t n0 = (nb + b) * COLS;
    const __mmask16 mask = tail_mask(w.N - n0);
    for (int r = 0; r < T; ++r) {
      const int64_t m = m0 + r;
      store(total[r][b], rows.scale[m], w.bias ? w.bias + n0 : nullptr, residual ? residual + m * w.N + n0 : nullptr,
            y + m * w.N + n0, mask);
    }
  }
}

}  // namespace

void quantize_rows(const float* x, int64_t m0, int64_t m1, int64_t K, int64_t Kp, int64_t group, int8_t* q,
                   float* scale, int32_t* sums) {
  for (int64_t m = m0; m < m1; ++m) {
    const float* row = x + m * K;
    __m512 peak = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16)
      peak = _mm512_max_ps(peak, _mm512_abs_ps(_mm512_maskz_loadu_ps(tail_mask(K - k), row + k)));
    const float amax = _mm512_reduce_max_ps(peak);  // max is exact in any order
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    scale[m] = amax / 127.0f;
    const __m512 vinv = _mm512_set1_ps(inv);
    int8_t* qm = q + m * Kp;
    for (int64_t k = 0; k < Kp; k += 16) {
      __m512 v = _mm512_maskz_loadu_ps(tail_mask(K - k), row + k);  // zeros past K
      __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(v, vinv));  // nearest, ties to even; |r| <= 127
      _mm512_mask_cvtsepi32_storeu_epi8(qm + k, tail_mask(Kp - k), r);
    }
    group_sums(qm, Kp, group, sums + m * (Kp / group));
  }
}

void linear_int8(const Rows& rows, int64_t M, const Linear& w, int64_t nb0, int64_t nb1, const float* residual,
                 float* y) {
  for (int64_t nb = nb0; nb < nb1; nb += 2) {
    if (nb + 1 < nb1)
      over_rows<MAX_TILE>(M, [&](auto tile, int64_t m0) { tile_int8<decltype(tile)::value, 2>(rows, m0, w, residual, y, nb); });
    else
      over_rows<MAX_TILE>(M, [&](auto tile, int64_t m0) { tile_int8<decltype(tile)::value, 1>(rows, m0, w, residual, y, nb); });
  }
}

void linear_int4(const Rows& rows, int64_t M, const Linear& w, int64_t nb0, int64_t nb1, const float* residual,
                 float* y) {
  for (int64_t nb = nb0; nb < nb1; nb += 2) {
    if (nb + 1 < nb1)
      over_rows<MAX_TILE>(M, [&](auto tile, int64_t m0) { tile_int4<decltype(tile)::value, 2>(rows, m0, w, residual, y, nb); });
    else
      over_rows<MAX_TILE>(M, [&](auto tile, int64_t m0) { tile_int4<decltype(tile)::value, 1>(rows, m0, w, residual, y, nb); });
  }
}

void rms_norm(const float* x, const float* weight, float eps, int64_t m0, int64_t m1, int64_t K, float* y) {
  for (int64_t m = m0; m < m1; ++m) {
    const float* row = x + m * K;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
      __m512 v = _mm512_maskz_loadu_ps(tail_mask(K - k), row + k);
      acc = _mm512_fmadd_ps(v, v, acc);
    }
    const float inv = 1.0f / std::sqrt(fold(acc) / float(K) + eps);
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 mask = tail_mask(K - k);
      __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, row + k), _mm512_set1_ps(inv));
      _mm512_mask_storeu_ps(y + m * K + k, mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, weight + k), v));
    }
  }
}

void silu_mul(const float* gate_up, int64_t m0, int64_t m1, int64_t I, float* y) {
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t i = 0; i < I; i += 16) {
      const __mmask16 mask = tail_mask(I - i);
      __m512 gate = _mm512_maskz_loadu_ps(mask, gate_up + m * 2 * I + i);
      __m512 up = _mm512_maskz_loadu_ps(mask, gate_up + m * 2 * I + I + i);
      __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), gate));
      __m512 silu = _mm512_div_ps(gate, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
      _mm512_mask_storeu_ps(y + m * I + i, mask, _mm512_mul_ps(silu, up));
    }
}

void attention(const Attention& a, int64_t t0, int64_t t1) {
  const int64_t groups = a.heads / a.kv_heads, D = a.D, vecs = D / 16;
  std::vector<float> scores;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t m = t / a.heads, h = t % a.heads, kvh = h / groups, length = a.start + m + 1;
    const float* q = a.rq + (m * a.heads + h) * D;
    scores.resize((length + 15) / 16 * 16);
    for (int64_t j = 0; j < length; ++j) {
      const float* k = a.keys + (j * a.kv_heads + kvh) * D;
      __m512 acc = _mm512_setzero_ps();
      for (int64_t i = 0; i < vecs; ++i) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * i), _mm512_loadu_ps(k + 16 * i), acc);
      scores[j] = fold(acc) * a.scaling;
    }
    __m512 peak = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < length; j += 16)
      peak = _mm512_mask_max_ps(peak, tail_mask(length - j), peak, _mm512_loadu_ps(&scores[j]));
    const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(peak));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < length; j += 16) {
      const __mmask16 mask = tail_mask(length - j);
      __m512 e = _mm512_maskz_mov_ps(mask, exp512(_mm512_sub_ps(_mm512_loadu_ps(&scores[j]), top)));
      _mm512_storeu_ps(&scores[j], e);
      sum = _mm512_add_ps(sum, e);
    }
    const float norm = 1.0f / fold(sum);
    __m512 acc[16];  // D <= 256, checked by the caller
    for (int64_t i = 0; i < vecs; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t j = 0; j < length; ++j) {
      const __m512 weight = _mm512_set1_ps(scores[j]);
      const float* v = a.values + (j * a.kv_heads + kvh) * D;
      for (int64_t i = 0; i < vecs; ++i) acc[i] = _mm512_fmadd_ps(weight, _mm512_loadu_ps(v + 16 * i), acc[i]);
    }
    for (int64_t i = 0; i < vecs; ++i)
      _mm512_storeu_ps(a.out + (m * a.heads + h) * D + 16 * i, _mm512_mul_ps(acc[i], _mm512_set1_ps(norm)));
  }
}

int64_t stream_read(const char* base, int64_t l0, int64_t l1, int64_t streams) {
  const int64_t per = (l1 - l0) / streams;
  __m512i acc = _mm512_setzero_si512();
  for (int64_t i = 0; i < per; ++i)
    for (int64_t s = 0; s < streams; ++s) {
      const char* line = base + (l0 + s * per + i) * 64;
      _mm_prefetch(line + PREFETCH, _MM_HINT_T0);
      acc = _mm512_xor_si512(acc, _mm512_loadu_si512(line));
    }
  for (int64_t l = l0 + streams * per; l < l1; ++l) acc = _mm512_xor_si512(acc, _mm512_loadu_si512(base + l * 64));
  return _mm512_reduce_add_epi64(acc);
}

}  // namespace path
}  // namespace specbench
