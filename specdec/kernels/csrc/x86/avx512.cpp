// The AVX-512 VNNI path (AMD Zen 4 on, Intel Xeon from Cascade Lake on): 16 columns a zmm, int8 products on vpdpbusd
// (w + 128 unsigned times q signed, less 128 sum q), up to 8 activation rows x 2 column blocks (int8) or 1 (int4) per
// pass over the weights. kernels.h defines every number; this file reproduces reference.cpp bit for bit.
#include "../kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

namespace specbench {
namespace path {

const char* const NAME = "avx512-vnni";

namespace {

constexpr int MAX_TILE = 8;  // activation rows per pass over a block's weights
// A step (1-2 rows) passes over one block at a time: two blocks a pass read two weight streams, and the 1.5B's
// kernels-int4 step took 1.12x [1.04-1.28] as long that way (AMD EPYC, 2026-11-29: 37.8 ms against 34.0, 7 rounds
// interleaved; its 5-token block unchanged; kernels-int8's step 0.99x [0.54-1.05], unchanged). int8 with more rows
// keeps two blocks a pass (16 integer sums, nothing else live); int4 takes one block at every row count (linear_int4).
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

// T activation rows x one column block (see linear_int4 for why one): each group's integer sums start at -8 sum q
// (vpdpbusd on w + 8 then sums w q exactly), and the group's scaled sum joins the row's total in group order.
template <int T>
void tile_int4(const Rows& rows, int64_t m0, const Linear& w, const float* residual, float* y, int64_t nb) {
  __m512 total[T];
  const int32_t* x[T];
  const uint8_t* block = w.weight + nb * COLS * w.Kp / 2;
  const uint16_t* group_scale = w.group_scale + nb * COLS * rows.groups;
  for (int r = 0; r < T; ++r) {
    total[r] = _mm512_setzero_ps();
    x[r] = reinterpret_cast<const int32_t*>(rows.q + (m0 + r) * rows.Kp);
  }
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int64_t per_group = w.group / 8;  // 64-byte chunks (8 k each) in a group
  for (int64_t g = 0; g < rows.groups; ++g) {
    __m512i acc[T];
    for (int r = 0; r < T; ++r) acc[r] = _mm512_set1_epi32(-8 * rows.sums[(m0 + r) * rows.groups + g]);
    for (int64_t c = g * per_group; c < (g + 1) * per_group; ++c) {
      _mm_prefetch(reinterpret_cast<const char*>(block + c * 64 + PREFETCH), _MM_HINT_T0);
      const __m512i v = _mm512_loadu_si512(block + c * 64);
      const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      for (int r = 0; r < T; ++r) {
        acc[r] = _mm512_dpbusd_epi32(acc[r], lo, _mm512_set1_epi32(x[r][2 * c]));
        acc[r] = _mm512_dpbusd_epi32(acc[r], hi, _mm512_set1_epi32(x[r][2 * c + 1]));
      }
    }
    const __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(group_scale + g * COLS)));
    for (int r = 0; r < T; ++r) total[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r]), scale, total[r]);
  }
  const int64_t n0 = nb * COLS;
  const __mmask16 mask = tail_mask(w.N - n0);
  for (int r = 0; r < T; ++r) {
    const int64_t m = m0 + r;
    store(total[r], rows.scale[m], w.bias ? w.bias + n0 : nullptr, residual ? residual + m * w.N + n0 : nullptr,
          y + m * w.N + n0, mask);
  }
}


// kernels.h's sum16 of 16 lane vectors at once: lane i of the result is sum16(acc[i]), each pair added as sum16 adds
// it ((l, l + 8), (l, l + 4), (l, l + 2), (0, 1)); the shuffles only move lanes, so every sum is bit for bit the scalar
// fold's. Lanes leave the network in the order 0 2 1 3 8 10 9 11 4 6 5 7 12 14 13 15 (its own inverse).
inline __m512 fold16(const __m512* acc) {
  __m512 t[8], u[4], w[2];
  for (int i = 0; i < 8; ++i)  // t: lanes 0-7 key i, 8-15 key i + 8
    t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[i], acc[i + 8], _MM_SHUFFLE(3, 2, 3, 2)),
                         _mm512_shuffle_f32x4(acc[i], acc[i + 8], _MM_SHUFFLE(1, 0, 1, 0)));
  for (int i = 0; i < 4; ++i)  // u: 4-lane chunks keys i, i + 8, i + 4, i + 12
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[i], t[i + 4], _MM_SHUFFLE(3, 1, 3, 1)),
                         _mm512_shuffle_f32x4(t[i], t[i + 4], _MM_SHUFFLE(2, 0, 2, 0)));
  for (int i = 0; i < 2; ++i)  // w: per chunk (u0 + u2, u1 + u3) of u[i]'s key, then of u[i + 2]'s
    w[i] = _mm512_add_ps(_mm512_shuffle_ps(u[i], u[i + 2], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(u[i], u[i + 2], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 out = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15), out);
}

// One query (V vectors of 16) against n <= 16 consecutive keys, key i at keys + i * stride: lane i its sum16 dot
// product (lanes past n: 0).
template <int V>
inline __m512 dots16(const float* q, const float* keys, int64_t stride, int64_t n) {
  __m512 qv[V], acc[16];
  for (int v = 0; v < V; ++v) qv[v] = _mm512_loadu_ps(q + 16 * v);
  for (int i = 0; i < 16; ++i) {
    acc[i] = _mm512_setzero_ps();
    if (i < n)
      for (int v = 0; v < V; ++v) acc[i] = _mm512_fmadd_ps(qv[v], _mm512_loadu_ps(keys + i * stride + 16 * v), acc[i]);
  }
  return fold16(acc);
}

// NP (row, head) pairs' weighted sums of values 0 .. length - 1: out = (sum_j e_j v_j, fma in j order) * norm. Each
// value vector is loaded once for the NP pairs (NP * V accumulators in registers).
template <int V, int NP>
void weighted_sums(const float* const* e, const float* norm, const float* values, int64_t stride, int64_t length,
                   float* const* out) {
  __m512 acc[NP][V];
  for (int p = 0; p < NP; ++p)
    for (int v = 0; v < V; ++v) acc[p][v] = _mm512_setzero_ps();
  for (int64_t j = 0; j < length; ++j) {
    __m512 weight[NP];
    for (int p = 0; p < NP; ++p) weight[p] = _mm512_set1_ps(e[p][j]);
    const float* row = values + j * stride;
    for (int v = 0; v < V; ++v) {
      const __m512 value = _mm512_loadu_ps(row + 16 * v);
      for (int p = 0; p < NP; ++p) acc[p][v] = _mm512_fmadd_ps(weight[p], value, acc[p][v]);
    }
  }
  for (int p = 0; p < NP; ++p)
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(out[p] + 16 * v, _mm512_mul_ps(acc[p][v], _mm512_set1_ps(norm[p])));
}

// kernels.h's softmax of one (row, head)'s scores 0 .. length - 1, in place; returns 1 / the sum of the weights.
inline float softmax16(float* s, int64_t length) {
  __m512 peak = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < length; j += 16) peak = _mm512_mask_max_ps(peak, tail_mask(length - j), peak, _mm512_loadu_ps(s + j));
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(peak));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < length; j += 16) {
    const __m512 e = _mm512_maskz_mov_ps(tail_mask(length - j), exp512(_mm512_sub_ps(_mm512_loadu_ps(s + j), top)));
    _mm512_storeu_ps(s + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  return 1.0f / fold(sum);
}

// One task (kernels.h's attend_task): scores 16 keys at a time; each value read once for up to PAIRS heads of a row.
template <int V>
void attend(const Attention& a, const AttentionTask& task, std::vector<float>& scratch) {
  constexpr int PAIRS = std::max(1, std::min(8, 24 / V));  // weighted_sums' accumulators within 32 zmm
  const __m512 scaling = _mm512_set1_ps(a.scaling);
  const int64_t stride = a.kv_heads * a.D;
  attend_task<16>(
      a, task, scratch, PAIRS,
      [&](float* s, const float* q, const float* keys, int64_t n) {
        _mm512_storeu_ps(s, _mm512_mul_ps(dots16<V>(q, keys, stride, n), scaling));
      },
      softmax16,
      [&](const TaskScores& view, int64_t m, int64_t g0, int64_t count, int64_t length) {
        with_rows<PAIRS>(count, [&](auto np) {
          constexpr int NP = decltype(np)::value;
          const float* e[NP];
          float* out[NP];
          for (int p = 0; p < NP; ++p) {
            e[p] = view.scores(m, g0 + p);
            out[p] = view.out(m, g0 + p);
          }
          weighted_sums<V, NP>(e, view.norms(m, g0), view.values(), stride, length, out);
        });
      });
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
  if (M <= 2) {  // a step or a 2-token block: one block a pass, one weight stream (measured below)
    for (int64_t nb = nb0; nb < nb1; ++nb)
      over_rows<MAX_TILE>(M, [&](auto tile, int64_t m0) { tile_int8<decltype(tile)::value, 1>(rows, m0, w, residual, y, nb); });
    return;
  }
  for (int64_t nb = nb0; nb < nb1; nb += 2) {
    if (nb + 1 < nb1)
      over_rows<MAX_TILE>(M, [&](auto tile, int64_t m0) { tile_int8<decltype(tile)::value, 2>(rows, m0, w, residual, y, nb); });
    else
      over_rows<MAX_TILE>(M, [&](auto tile, int64_t m0) { tile_int8<decltype(tile)::value, 1>(rows, m0, w, residual, y, nb); });
  }
}

void linear_int4(const Rows& rows, int64_t M, const Linear& w, int64_t nb0, int64_t nb1, const float* residual,
                 float* y) {
  // One block a pass at every row count. Two blocks of 8 rows hold 16 integer sums and 16 running totals, all 32
  // registers before the weights and the broadcasts, and GCC spilled; with one block the tile fits, and a step reads
  // one weight stream (measured: the 1.5B's kernels-int4 step 1.12x [1.04-1.28] faster than with two, 2026-11-29).
  // The 1.5B's four int4 Linears, 800 rows (a prefill), interleaved against two blocks a pass in one process (AMD
  // EPYC, 2 threads, 7 rounds, the same bits): 1.11-1.14x [1.06-1.16]; 40 rows 1.09-1.12x; 8 and 9 rows 1.17-1.20x.
  for (int64_t nb = nb0; nb < nb1; ++nb)
    over_rows<MAX_TILE>(M, [&](auto tile, int64_t m0) { tile_int4<decltype(tile)::value>(rows, m0, w, residual, y, nb); });
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
  std::vector<float> scratch;
  with_rows<16>(a.D / 16, [&](auto vecs) {  // D <= 256, checked by the caller
    for (int64_t t = t0; t < t1; ++t) attend<decltype(vecs)::value>(a, attention_task(a, t), scratch);
  });
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
