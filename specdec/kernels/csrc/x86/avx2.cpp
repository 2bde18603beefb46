// The 256-bit x86 paths: AVX2 + FMA + F16C (AMD Zen 2/3, CPUs or VMs without AVX-512), and, built with
// SPECBENCH_AVX_VNNI, AVX-VNNI (Intel's client CPUs since Alder Lake: the 256-bit vpdpbusd without AVX-512; built
// for a CPU with AVX-512 VNNI instead, the same instruction in its EVEX encoding, so that CPU runs and tests this path).
// kernels.h defines every number; this file reproduces reference.cpp bit for bit. kernels.h's 16 lanes are two ymm
// here (lanes 0-7, 8-15), so every row reduction folds exactly as on AVX-512.
//
// int8 without VNNI: vpmaddubsw multiplies unsigned by signed bytes into saturating int16 pairs, so it takes |w| as
// the unsigned side and sign(q, w) as the signed one (llama.cpp's trick, ggml-cpu's mul_sum_us8_pairs_float, with the
// roles of its operands swapped: |w| is computed once a weight vector for all the rows, and a row takes one broadcast a
// chunk (q) where |q| and sign(w, q) took two): |w| <= 128 and |q| <= 127, so a pair is at most 2 * 128 * 127 = 32512
// and never saturates; vpmaddwd against ones widens to int32. The packed w + 128 becomes w with one XOR of 0x80.
// int4 needs no trick: a nibble (0..15) times q fits, and a whole group of 32 (16 products an int16 lane, at most
// 16 * 15 * 127 = 30480) sums in int16 before one vpmaddwd. With AVX-VNNI, vpdpbusd does each in one instruction
// on w + 128 (less 128 sum q, as AVX-512 does).
#include "../kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

namespace specbench {
namespace path {

#ifdef SPECBENCH_AVX_VNNI
const char* const NAME = "avx-vnni";
#else
const char* const NAME = "avx2";
#endif

namespace {

constexpr int MAX_TILE = 6;  // activation rows per pass over one 8-column half: 6 ymm accumulators
constexpr int64_t PREFETCH = 4096;
// k a pass over one 8-column half before the other half's: a 16-column block's lines for it (16 KB int8, 8 KB int4)
// and 6 rows' q (6 KB) stay in L1 for the second pass, where a whole k (the down projection's 8960: a 143 KB int8
// block) sent it to L2. Interleaved against whole-k passes (AMD EPYC, AVX2 path, 2 threads, the 1.5B's Linears, 5
// rows, weights warm): int8 1.15-1.37x faster, int4 1.03x; the 5-token block of the real 1.5B, 2.41 -> 1.82 of its
// steps in int8, 2.28 -> 1.83 in int4 (runtime_costs, docs/runtimes.md).
constexpr int64_t SPAN = 1024;


struct Lanes16 {  // kernels.h's 16 lanes
  __m256 lo, hi;
};

// Lanes i with i < remaining on (all-ones int32), the rest off.
inline __m256i lane_mask(int64_t remaining) {
  const int32_t r = int32_t(std::max<int64_t>(0, std::min<int64_t>(8, remaining)));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline __m256 load(const float* p, int64_t remaining) {  // zeros past `remaining`
  return remaining >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lane_mask(remaining));
}

inline void store(float* p, __m256 v, int64_t remaining) {
  if (remaining >= 8)
    _mm256_storeu_ps(p, v);
  else if (remaining > 0)
    _mm256_maskstore_ps(p, lane_mask(remaining), v);
}

inline float fold(Lanes16 v) {  // kernels.h's sum16
  alignas(32) float lane[16];
  _mm256_store_ps(lane, v.lo);
  _mm256_store_ps(lane + 8, v.hi);
  return sum16(lane);
}

inline float max8(__m256 v) {  // exact in any order
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// exp_ref for 8 values.
inline __m256 exp256(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(EXP_HI)), _mm256_set1_ps(EXP_LO));
  const __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(LOG2E), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(LN2_HI), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(LN2_LO), x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(EXP_P0);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(EXP_P1));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(EXP_P2));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(EXP_P3));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(EXP_P4));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(EXP_P5));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, z, x), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_cvtps_epi32(fx), a = _mm256_srai_epi32(e, 1), b = _mm256_sub_epi32(e, a);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 pa = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(a, bias), 23));
  const __m256 pb = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(b, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(y, pa), pb);  // scale_pow2
}

// y = (t * x_scale + bias) + residual for 8 columns, `remaining` of them real.
inline void epilogue(__m256 t, float x_scale, const float* bias, const float* residual, float* y, int64_t remaining) {
  t = _mm256_mul_ps(t, _mm256_set1_ps(x_scale));
  if (bias) t = _mm256_add_ps(t, load(bias, remaining));
  if (residual) t = _mm256_add_ps(t, load(residual, remaining));
  store(y, t, remaining);
}

#if defined(SPECBENCH_AVX_VNNI) && defined(__AVXVNNI__)
inline __m256i dot_u8s8(__m256i acc, __m256i w_u8, __m256i x) { return _mm256_dpbusd_avx_epi32(acc, w_u8, x); }
#elif defined(SPECBENCH_AVX_VNNI)  // the same instruction, EVEX-encoded: an AVX-512 VNNI CPU runs this path too
inline __m256i dot_u8s8(__m256i acc, __m256i w_u8, __m256i x) { return _mm256_dpbusd_epi32(acc, w_u8, x); }
#endif

// T rows' q from row m0 on, as 4-byte groups: x(r, j) is row r's group j broadcast to the 8 lanes.
struct Activations {
  const int32_t* x[MAX_TILE];
  Activations(const Rows& rows, int64_t m0, int T) {
    for (int r = 0; r < T; ++r) x[r] = reinterpret_cast<const int32_t*>(rows.q + (m0 + r) * rows.Kp);
  }
  __m256i operator()(int r, int64_t j) const { return _mm256_set1_epi32(x[r][j]); }
};

// Where each row's int4 group sums start, so that no correction is left for after them: an int4 product is computed on
// the stored nibble w + 8, and Σ (w + 8) q less 8 Σ q is the exact Σ w q. In int32 (AVX-VNNI, or groups over 32) the
// start is -8 Σ q. In the int16 lanes of a short group it is split by lane: vpmaddubsw pairs bytes (0, 1) and (2, 3)
// of a column's four, and a byte's low nibble carries k 0-3 of its 8-k chunk and its high nibble k 4-7, so the even
// lane sums k = 0, 1, 4, 5 and the odd lane k = 2, 3, 6, 7 of every chunk; each starts at -8 times its own k's sum.
// After any chunks a lane holds Σ (w + 8 - 8) q over the k seen less 8 Σ q over the rest: 16 terms of at most 8 * 127,
// so within ±16256 all the way, never near int16's limits. One broadcast load a row and group replaces the
// subtraction and the multiply that followed each group's sum.
std::vector<int32_t>& group_starts(const Rows& rows, int64_t M, bool short_group) {
  thread_local std::vector<int32_t> starts;
  starts.resize(M * rows.groups);
  const int64_t group = rows.Kp / rows.groups;
#ifdef SPECBENCH_AVX_VNNI
  const bool lanes = false;  // vpdpbusd sums in int32
#else
  const bool lanes = short_group;
#endif
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < rows.groups; ++g) {
      const int8_t* q = rows.q + m * rows.Kp + g * group;
      int32_t lane[2] = {0, 0};
      for (int64_t k = 0; k < group; ++k) lane[(k >> 1) & 1] += q[k];
      starts[m * rows.groups + g] =
          lanes ? int32_t(uint32_t(uint16_t(int16_t(-8 * lane[0]))) | (uint32_t(uint16_t(int16_t(-8 * lane[1]))) << 16))
                : -8 * (lane[0] + lane[1]);
    }
  return starts;
}

// T activation rows x one 8-column half (h) of a 16-column block, over chunks [c0, c1) (4 k each), added to `acc`: T
// integer accumulators, the half's weights and the row's q fit AVX2's 16 registers, so nothing spills in the innermost
// loop (with both halves at once GCC spilled accumulators every chunk). rows_int8 takes a block's k a SPAN at a time,
// both halves each, so the other half's pass finds the lines (and the rows' q) in L1.
template <int T>
void tile_int8(const Activations& x, const Linear& w, int64_t nb, int h, int64_t c0, int64_t c1, __m256i* sums) {
  __m256i acc[T];
  const uint8_t* block = w.weight + nb * COLS * w.Kp + 32 * h;
  for (int r = 0; r < T; ++r) acc[r] = sums[r];
#ifndef SPECBENCH_AVX_VNNI
  const __m256i flip = _mm256_set1_epi8(char(0x80)), ones = _mm256_set1_epi16(1);
#endif
  for (int64_t c = c0; c < c1; ++c) {
    _mm_prefetch(reinterpret_cast<const char*>(block + c * 64 + PREFETCH), _MM_HINT_T0);
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + c * 64));
#ifdef SPECBENCH_AVX_VNNI
    for (int r = 0; r < T; ++r) acc[r] = dot_u8s8(acc[r], wv, x(r, c));
#else
    const __m256i ws = _mm256_xor_si256(wv, flip);  // w + 128 -> w
    const __m256i magnitude = _mm256_abs_epi8(ws);  // |w|, unsigned (-128 -> 128)
    for (int r = 0; r < T; ++r) {
      const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(x(r, c), ws));
      acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(pairs, ones));
    }
#endif
  }
  for (int r = 0; r < T; ++r) sums[r] = acc[r];
}

// The int8 epilogue of T rows' integer sums of one 8-column half.
template <int T>
void write_int8(const Rows& rows, int64_t m0, const Linear& w, int64_t n, const __m256i* sums, const float* residual,
                float* y) {
  const int64_t remaining = w.N - n;
  const __m256 scale = load(w.col_scale + n, remaining);
  for (int r = 0; r < T; ++r) {
    const int64_t m = m0 + r;
#ifdef SPECBENCH_AVX_VNNI
    const __m256i exact = _mm256_sub_epi32(sums[r], _mm256_set1_epi32(128 * rows.sums[m]));
#else
    const __m256i exact = sums[r];
#endif
    epilogue(_mm256_mul_ps(_mm256_cvtepi32_ps(exact), scale), rows.scale[m], w.bias ? w.bias + n : nullptr,
             residual ? residual + m * w.N + n : nullptr, y + m * w.N + n, remaining);
  }
}

template <int T>
void rows_int8(const Rows& rows, int64_t m0, const Linear& w, const float* residual, float* y,
               int64_t nb) {
  const Activations x(rows, m0, T);
  __m256i acc[2][T];
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < T; ++r) acc[h][r] = _mm256_setzero_si256();
  const int64_t chunks = rows.Kp / 4;  // integer sums: any split of k gives the same bits
  for (int64_t c0 = 0; c0 < chunks; c0 += SPAN / 4)
    for (int h = 0; h < 2; ++h) tile_int8<T>(x, w, nb, h, c0, std::min(chunks, c0 + SPAN / 4), acc[h]);
  for (int h = 0; h < 2; ++h) {
    const int64_t n = nb * COLS + 8 * h;
    if (w.N - n <= 0) return;
    write_int8<T>(rows, m0, w, n, acc[h], residual, y);
  }
}

// SHORT: a group of at most 32 k, summed in int16 lanes before one vpmaddwd (a template argument, so the innermost
// loop holds no branch). One 8-column half a pass over groups [g0, g1), each group's scaled sum added to `total` in
// group order (the reference's order, whatever the split), as tile_int8.
template <int T, bool SHORT>
void tile_int4(const Activations& x, const int32_t* starts, int64_t groups, int64_t m0, const Linear& w,
               int64_t nb, int h, int64_t g0, int64_t g1, __m256* totals) {
  __m256 total[T];
  const uint8_t* block = w.weight + nb * COLS * w.Kp / 2 + 32 * h;
  const uint16_t* group_scale = w.group_scale + nb * COLS * groups + 8 * h;
  for (int r = 0; r < T; ++r) total[r] = totals[r];
  const __m256i low = _mm256_set1_epi8(0x0F);
  const int64_t per_group = w.group / 8;  // 64-byte chunks (8 k each) in a group
#ifndef SPECBENCH_AVX_VNNI
  const __m256i ones = _mm256_set1_epi16(1);
#endif
  for (int64_t g = g0; g < g1; ++g) {
    __m256i acc[T];
    for (int r = 0; r < T; ++r) acc[r] = _mm256_set1_epi32(starts[(m0 + r) * groups + g]);
    for (int64_t c = g * per_group; c < (g + 1) * per_group; ++c) {
      _mm_prefetch(reinterpret_cast<const char*>(block + c * 64 + PREFETCH), _MM_HINT_T0);
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + c * 64));
      const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      for (int r = 0; r < T; ++r) {
#ifdef SPECBENCH_AVX_VNNI
        acc[r] = dot_u8s8(dot_u8s8(acc[r], lo, x(r, 2 * c)), hi, x(r, 2 * c + 1));
#else
        const __m256i pairs =
            _mm256_add_epi16(_mm256_maddubs_epi16(lo, x(r, 2 * c)), _mm256_maddubs_epi16(hi, x(r, 2 * c + 1)));
        acc[r] = SHORT ? _mm256_add_epi16(acc[r], pairs) : _mm256_add_epi32(acc[r], _mm256_madd_epi16(pairs, ones));
#endif
      }
    }
    const __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group_scale + g * COLS)));
    for (int r = 0; r < T; ++r) {
#ifdef SPECBENCH_AVX_VNNI
      const __m256i dot = acc[r];
#else
      const __m256i dot = SHORT ? _mm256_madd_epi16(acc[r], ones) : acc[r];
#endif
      total[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, total[r]);
    }
  }
  for (int r = 0; r < T; ++r) totals[r] = total[r];
}

// The int4 epilogue of T rows' scaled sums of one 8-column half.
template <int T>
void write_int4(const Rows& rows, int64_t m0, const Linear& w, int64_t n, const __m256* totals, const float* residual,
                float* y) {
  const int64_t remaining = w.N - n;
  for (int r = 0; r < T; ++r) {
    const int64_t m = m0 + r;
    epilogue(totals[r], rows.scale[m], w.bias ? w.bias + n : nullptr, residual ? residual + m * w.N + n : nullptr,
             y + m * w.N + n, remaining);
  }
}

template <int T, bool SHORT>
void rows_int4(const Rows& rows, const int32_t* starts, int64_t m0, const Linear& w,
               const float* residual, float* y, int64_t nb) {
  const Activations x(rows, m0, T);
  __m256 total[2][T];
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < T; ++r) total[h][r] = _mm256_setzero_ps();
  const int64_t span = std::max<int64_t>(1, SPAN / w.group);  // groups a pass
  for (int64_t g0 = 0; g0 < rows.groups; g0 += span)
    for (int h = 0; h < 2; ++h)
      tile_int4<T, SHORT>(x, starts, rows.groups, m0, w, nb, h, g0, std::min(rows.groups, g0 + span), total[h]);
  for (int h = 0; h < 2; ++h) {
    const int64_t n = nb * COLS + 8 * h;
    if (w.N - n <= 0) return;
    write_int4<T>(rows, m0, w, n, total[h], residual, y);
  }
}

// One or two rows (a step, a 2-token block): both halves in one pass, so each weight line is touched once and each
// row's q is loaded once for both; 2 x T accumulators still fit the registers. Each function writes its rows out itself:
// one writer shared through a lambda that read the accumulators by reference made GCC keep them in memory (int8's 2-row
// pass 1.7x slower, measured). Measured on the 1.5B (AMD EPYC, AVX2 path, 2 threads, runtime_costs): a step 33-39 ms
// this way, 51 ms in two half passes; 3 rows and more run in half passes (5 tokens: 2.1 steps, against 2.9 with both
// halves at once).
template <int T>
void narrow_int8(const Rows& rows, const Linear& w, const float* residual, float* y,
                 int64_t nb) {
  const Activations x(rows, 0, T);
  __m256i acc[T][2];
  const uint8_t* block = w.weight + nb * COLS * w.Kp;
  for (int r = 0; r < T; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
#ifndef SPECBENCH_AVX_VNNI
  const __m256i flip = _mm256_set1_epi8(char(0x80)), ones = _mm256_set1_epi16(1);
#endif
  for (int64_t c = 0; c < rows.Kp / 4; ++c) {
    _mm_prefetch(reinterpret_cast<const char*>(block + c * 64 + PREFETCH), _MM_HINT_T0);
    __m256i q[T];
    for (int r = 0; r < T; ++r) q[r] = x(r, c);
    for (int h = 0; h < 2; ++h) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + c * 64 + 32 * h));
#ifdef SPECBENCH_AVX_VNNI
      for (int r = 0; r < T; ++r) acc[r][h] = dot_u8s8(acc[r][h], wv, q[r]);
#else
      const __m256i ws = _mm256_xor_si256(wv, flip), magnitude = _mm256_abs_epi8(ws);
      for (int r = 0; r < T; ++r) {
        const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(q[r], ws));
        acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(pairs, ones));
      }
#endif
    }
  }
  for (int h = 0; h < 2; ++h) {
    const int64_t n = nb * COLS + 8 * h;
    if (w.N - n <= 0) break;
    __m256i sums[T];
    for (int r = 0; r < T; ++r) sums[r] = acc[r][h];
    write_int8<T>(rows, 0, w, n, sums, residual, y);
  }
}

template <int T, bool SHORT>
void narrow_int4(const Rows& rows, const int32_t* starts, const Linear& w,
                 const float* residual, float* y, int64_t nb) {
  const Activations x(rows, 0, T);
  __m256 total[T][2];
  const uint8_t* block = w.weight + nb * COLS * w.Kp / 2;
  const uint16_t* group_scale = w.group_scale + nb * COLS * rows.groups;
  for (int r = 0; r < T; ++r) total[r][0] = total[r][1] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0F);
  const int64_t per_group = w.group / 8;
#ifndef SPECBENCH_AVX_VNNI
  const __m256i ones = _mm256_set1_epi16(1);
#endif
  for (int64_t g = 0; g < rows.groups; ++g) {
    __m256i acc[T][2];
    for (int r = 0; r < T; ++r) acc[r][0] = acc[r][1] = _mm256_set1_epi32(starts[r * rows.groups + g]);
    for (int64_t c = g * per_group; c < (g + 1) * per_group; ++c) {
      _mm_prefetch(reinterpret_cast<const char*>(block + c * 64 + PREFETCH), _MM_HINT_T0);
      __m256i xlo[T], xhi[T];
      for (int r = 0; r < T; ++r) xlo[r] = x(r, 2 * c), xhi[r] = x(r, 2 * c + 1);
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + c * 64 + 32 * h));
        const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        for (int r = 0; r < T; ++r) {
#ifdef SPECBENCH_AVX_VNNI
          acc[r][h] = dot_u8s8(dot_u8s8(acc[r][h], lo, xlo[r]), hi, xhi[r]);
#else
          const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo[r]), _mm256_maddubs_epi16(hi, xhi[r]));
          acc[r][h] = SHORT ? _mm256_add_epi16(acc[r][h], pairs)
                            : _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(pairs, ones));
#endif
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group_scale + g * COLS + 8 * h)));
      for (int r = 0; r < T; ++r) {
#ifdef SPECBENCH_AVX_VNNI
        const __m256i dot = acc[r][h];
#else
        const __m256i dot = SHORT ? _mm256_madd_epi16(acc[r][h], ones) : acc[r][h];
#endif
        total[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, total[r][h]);
      }
    }
  }
  for (int h = 0; h < 2; ++h) {
    const int64_t n = nb * COLS + 8 * h;
    if (w.N - n <= 0) break;
    __m256 sums[T];
    for (int r = 0; r < T; ++r) sums[r] = total[r][h];
    write_int4<T>(rows, 0, w, n, sums, residual, y);
  }
}

// kernels.h's sum16 of 8 keys' 16 lanes at once (lo[i], hi[i]: lanes 0-7 and 8-15 of key i): lane i of the result is
// sum16 of key i, each pair added as sum16 adds it ((l, l + 8), (l, l + 4), (l, l + 2), (0, 1)); shuffles only move
// lanes, so every sum is bit for bit the scalar fold's.
inline __m256 fold8(const __m256* t) {  // t[i] = hi[i] + lo[i]: sum16's first step, done by the caller
  __m256 u[4], w[2];
  for (int i = 0; i < 4; ++i)  // u: keys i (lanes 0-3) and i + 4 (lanes 4-7)
    u[i] = _mm256_add_ps(_mm256_permute2f128_ps(t[i], t[i + 4], 0x31), _mm256_permute2f128_ps(t[i], t[i + 4], 0x20));
  for (int i = 0; i < 2; ++i)  // w: per 128-bit half (u0 + u2, u1 + u3) of u[i]'s key, then of u[i + 2]'s
    w[i] = _mm256_add_ps(_mm256_shuffle_ps(u[i], u[i + 2], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(u[i], u[i + 2], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 out = _mm256_add_ps(_mm256_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm256_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm256_permute_ps(out, _MM_SHUFFLE(3, 1, 2, 0));  // keys leave as 0 2 1 3 | 4 6 5 7
}

// One query of D against n <= 8 consecutive keys (key i at keys + i * stride): lane i its sum16 dot product, lanes
// past n 0. Four keys at a time so their 8 accumulators and the query's two vectors fit the 16 ymm.
inline __m256 dots8(const float* q, const float* keys, int64_t stride, int64_t n, int64_t D) {
  __m256 t[8];
  for (int half = 0; half < 2; ++half) {
    Lanes16 acc[4];
    for (int i = 0; i < 4; ++i) acc[i] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    const int keys_here = int(std::max<int64_t>(0, std::min<int64_t>(4, n - 4 * half)));
    for (int64_t d = 0; d < D; d += 16) {
      const __m256 qlo = _mm256_loadu_ps(q + d), qhi = _mm256_loadu_ps(q + d + 8);
      for (int i = 0; i < 4; ++i)
        if (i < keys_here) {
          const float* k = keys + (4 * half + i) * stride + d;
          acc[i].lo = _mm256_fmadd_ps(qlo, _mm256_loadu_ps(k), acc[i].lo);
          acc[i].hi = _mm256_fmadd_ps(qhi, _mm256_loadu_ps(k + 8), acc[i].hi);
        }
    }
    for (int i = 0; i < 4; ++i) t[4 * half + i] = _mm256_add_ps(acc[i].hi, acc[i].lo);
  }
  return fold8(t);
}

// NP (row, head) pairs' weighted sums over values 0 .. length - 1, 16 of D's columns: out = (sum_j e_j v_j, fma in
// j order) * norm. Two 8-column vectors a value row, loaded once for the NP pairs.
template <int NP>
void weighted_sums16(const float* const* e, const float* norm, const float* values, int64_t stride, int64_t length,
                     float* const* out) {
  __m256 lo[NP], hi[NP];
  for (int p = 0; p < NP; ++p) lo[p] = hi[p] = _mm256_setzero_ps();
  for (int64_t j = 0; j < length; ++j) {
    const __m256 vlo = _mm256_loadu_ps(values + j * stride), vhi = _mm256_loadu_ps(values + j * stride + 8);
    for (int p = 0; p < NP; ++p) {
      const __m256 weight = _mm256_broadcast_ss(e[p] + j);
      lo[p] = _mm256_fmadd_ps(weight, vlo, lo[p]);
      hi[p] = _mm256_fmadd_ps(weight, vhi, hi[p]);
    }
  }
  for (int p = 0; p < NP; ++p) {
    _mm256_storeu_ps(out[p], _mm256_mul_ps(lo[p], _mm256_set1_ps(norm[p])));
    _mm256_storeu_ps(out[p] + 8, _mm256_mul_ps(hi[p], _mm256_set1_ps(norm[p])));
  }
}

// kernels.h's softmax of one (row, head)'s scores 0 .. length - 1, in place; returns 1 / the sum of the weights.
inline float softmax16(float* s, int64_t length) {
  float top = -INFINITY;
  for (int64_t j = 0; j < length; ++j) top = std::max(top, s[j]);  // exact in any order
  const __m256 vtop = _mm256_set1_ps(top);
  Lanes16 sum{_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t j = 0; j < length; j += 16) {
    const __m256 lo = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), vtop)),
                                    _mm256_castsi256_ps(lane_mask(length - j)));
    const __m256 hi = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), vtop)),
                                    _mm256_castsi256_ps(lane_mask(length - j - 8)));
    _mm256_storeu_ps(s + j, lo);
    _mm256_storeu_ps(s + j + 8, hi);
    sum.lo = _mm256_add_ps(sum.lo, lo);
    sum.hi = _mm256_add_ps(sum.hi, hi);
  }
  return 1.0f / fold(sum);
}

// One task (kernels.h's attend_task): scores 8 keys at a time; each value's 16 columns read once for up to 4 heads.
void attend(const Attention& a, const AttentionTask& task, std::vector<float>& scratch) {
  constexpr int PAIRS = 4;  // weighted_sums16: 8 accumulators and 4 weights in the 16 ymm
  const __m256 scaling = _mm256_set1_ps(a.scaling);
  const int64_t stride = a.kv_heads * a.D, D = a.D;
  attend_task<8>(
      a, task, scratch, PAIRS,
      [&](float* s, const float* q, const float* keys, int64_t n) {
        _mm256_storeu_ps(s, _mm256_mul_ps(dots8(q, keys, stride, n, D), scaling));
      },
      softmax16,
      by_16_columns<PAIRS>(D, [stride](auto np, const float* const* e, const float* norms, const float* values,
                                       int64_t length, float* const* out) {
        weighted_sums16<decltype(np)::value>(e, norms, values, stride, length, out);
      }));
}
}  // namespace

void quantize_rows(const float* x, int64_t m0, int64_t m1, int64_t K, int64_t Kp, int64_t group, int8_t* q,
                   float* scale, int32_t* sums) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  alignas(32) int32_t rounded[8];
  for (int64_t m = m0; m < m1; ++m) {
    const float* row = x + m * K;
    __m256 peak = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 8) peak = _mm256_max_ps(peak, _mm256_andnot_ps(sign, load(row + k, K - k)));
    const float amax = max8(peak);
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    scale[m] = amax / 127.0f;
    const __m256 vinv = _mm256_set1_ps(inv);
    int8_t* qm = q + m * Kp;
    for (int64_t k = 0; k < Kp; k += 8) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(rounded),
                         _mm256_cvtps_epi32(_mm256_mul_ps(load(row + k, K - k), vinv)));  // nearest, ties to even
      for (int i = 0; i < 8 && k + i < Kp; ++i) qm[k + i] = int8_t(rounded[i]);
    }
    group_sums(qm, Kp, group, sums + m * (Kp / group));
  }
}

void linear_int8(const Rows& rows, int64_t M, const Linear& w, int64_t nb0, int64_t nb1, const float* residual,
                 float* y) {
  for (int64_t nb = nb0; nb < nb1; ++nb) {
    if (M == 1) {
      narrow_int8<1>(rows, w, residual, y, nb);
    } else if (M == 2) {
      narrow_int8<2>(rows, w, residual, y, nb);
    } else {
      over_rows<MAX_TILE>(M, [&](auto tile, int64_t m0) {
        rows_int8<decltype(tile)::value>(rows, m0, w, residual, y, nb);
      });
    }
  }
}

void linear_int4(const Rows& rows, int64_t M, const Linear& w, int64_t nb0, int64_t nb1, const float* residual,
                 float* y) {
  const bool short_group = w.group <= 32;  // int16 sums of a whole group cannot overflow (header)
  const int32_t* starts = group_starts(rows, M, short_group).data();
  for (int64_t nb = nb0; nb < nb1; ++nb) {
    if (M <= 2) {
      if (M == 1 && short_group) narrow_int4<1, true>(rows, starts, w, residual, y, nb);
      if (M == 1 && !short_group) narrow_int4<1, false>(rows, starts, w, residual, y, nb);
      if (M == 2 && short_group) narrow_int4<2, true>(rows, starts, w, residual, y, nb);
      if (M == 2 && !short_group) narrow_int4<2, false>(rows, starts, w, residual, y, nb);
      continue;
    }
    over_rows<MAX_TILE>(M, [&](auto tile, int64_t m0) {
      if (short_group)
        rows_int4<decltype(tile)::value, true>(rows, starts, m0, w, residual, y, nb);
      else
        rows_int4<decltype(tile)::value, false>(rows, starts, m0, w, residual, y, nb);
    });
  }
}

void rms_norm(const float* x, const float* weight, float eps, int64_t m0, int64_t m1, int64_t K, float* y) {
  for (int64_t m = m0; m < m1; ++m) {
    const float* row = x + m * K;
    Lanes16 acc{_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t k = 0; k < K; k += 16) {
      const __m256 lo = load(row + k, K - k), hi = load(row + k + 8, K - k - 8);
      acc.lo = _mm256_fmadd_ps(lo, lo, acc.lo);
      acc.hi = _mm256_fmadd_ps(hi, hi, acc.hi);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / std::sqrt(fold(acc) / float(K) + eps));
    for (int64_t k = 0; k < K; k += 8)
      store(y + m * K + k, _mm256_mul_ps(load(weight + k, K - k), _mm256_mul_ps(load(row + k, K - k), inv)), K - k);
  }
}

void silu_mul(const float* gate_up, int64_t m0, int64_t m1, int64_t I, float* y) {
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t i = 0; i < I; i += 8) {
      const __m256 gate = load(gate_up + m * 2 * I + i, I - i), up = load(gate_up + m * 2 * I + I + i, I - i);
      const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), gate));
      const __m256 silu = _mm256_div_ps(gate, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
      store(y + m * I + i, _mm256_mul_ps(silu, up), I - i);
    }
}

void attention(const Attention& a, int64_t t0, int64_t t1) {
  std::vector<float> scratch;
  for (int64_t t = t0; t < t1; ++t) attend(a, attention_task(a, t), scratch);
}

int64_t stream_read(const char* base, int64_t l0, int64_t l1, int64_t streams) {
  const int64_t per = (l1 - l0) / streams;
  __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
  auto read = [&](const char* line) {
    lo = _mm256_xor_si256(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line)));
    hi = _mm256_xor_si256(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + 32)));
  };
  for (int64_t i = 0; i < per; ++i)
    for (int64_t s = 0; s < streams; ++s) {
      const char* line = base + (l0 + s * per + i) * 64;
      _mm_prefetch(line + PREFETCH, _MM_HINT_T0);
      read(line);
    }
  for (int64_t l = l0 + streams * per; l < l1; ++l) read(base + l * 64);
  alignas(32) int64_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), lo);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes + 4), hi);
  uint64_t total = 0;
  for (int64_t v : lanes) total += uint64_t(v);
  return int64_t(total);
}

}  // namespace path
}  // namespace specbench
