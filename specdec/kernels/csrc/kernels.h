// specbench's exact kernels: the generic part. Every instruction-set path (reference.cpp, x86/avx2.cpp,
// x86/avx512.cpp, arm/neon.cpp) implements the functions declared here; module.cpp binds one path to torch and
// driver.cpp compares a path with the reference without torch (how the ARM path is tested under emulation).
//
// Why these kernels are exact: a verify block streams the same weights as a one-token step, and its extra arithmetic
// is small on the int8 dot-product units, so a block can cost about one step. torch's dynamic int8 Linear (fbgemm)
// quantizes a whole call's activations with one scale, so a row's logits move with the rows beside it. Here every
// activation row is quantized with its own scale and multiplied in exact int32, and every float operation is either
// per element or a reduction over one row in an order fixed below, never by the vector width, the tiling, the
// number of rows in the call or the thread split. So a (k+1)-token block computes, bit for bit, the logits of k+1
// one-token steps, on every path: the same logits on every processor.
//
// The definition of every number (reference.cpp spells it out in scalar C++; a path must reproduce it bit for bit):
//
//   quantize   a row x[K]: amax = max|x| (exact in any order), inv = amax > 0 ? 127 / amax : 0, scale = amax / 127,
//              q[k] = round-half-even(x[k] * inv) as int8 (|q| <= 127), q = 0 on the padding past K.
//   int8       packed w + 128 (0..255) as [N/16][K/4][16][4] bytes (specdec/kernels/pack.py), one float scale per
//              output column. dot = sum_k q[k] w[n,k] in int32 (exact: any order, any instruction);
//              y = ((float(dot) * col_scale[n]) * row_scale + bias[n]) + residual[m,n], each op rounded in turn.
//   int4       packed w + 8 (0..15) as nibbles [N/16][K/8][16][4] (low nibble k = 8c + t, high k = 8c + 4 + t),
//              one fp16 scale per 16 columns x G k. Per group g in order: total = fma(float(dot_g), scale_g, total)
//              from total = 0; then y = ((total * row_scale) + bias) + residual.
//   sum16      a reduction over a row: 16 lanes, lane l accumulates elements l, l + 16, l + 32, ... in order (fma for
//              dot products and squares, add for softmax sums); then lanes fold as (l, l + 8), (l, l + 4), (l, l + 2),
//              (0, 1): sum16() below. An AVX-512 register is 16 lanes, AVX2 keeps two, NEON four.
//   rms_norm   inv = 1 / sqrt(sum16(x^2) / K + eps) (float ops, sqrt rounded once); y = w * (x * inv).
//   exp        Cephes' polynomial (exp_ref() below): clamp to [-103, 88.376...], fx = floor(fma(x, log2 e, 0.5)),
//              x -= fx ln2 in two fmas, a degree-5 polynomial by fma, y * 2^fx by two exact-power multiplies.
//   silu_mul   y = (g / (1 + exp(0 - g))) * up.
//   attention  rotary in scalar (v cos - u sin, two roundings: -ffp-contract=off everywhere); a query row at
//              position p attends keys 0..p: score_j = sum16(q k_j) * scaling; top = max (exact);
//              e_j = exp(score_j - top); norm = 1 / sum16(e); out[d] = (fma over j in order of e_j v_j[d]) * norm.
//
// Integer sums are exact whatever the instruction (VNNI's vpdpbusd on w + 128 less 128 sum q, AVX2's vpmaddubsw on
// |w| and sign(q, w), NEON's sdot on w), so each path is free to tile rows and columns its own way.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace specbench {

constexpr int COLS = 16;  // output columns per packed block

struct Rows {  // a call's activations, quantized once for every column block
  const int8_t* q;  // [M, Kp]
  const float* scale;  // [M]
  const int32_t* sums;  // [M, groups]: sum of q over each group (int4) or the whole row (int8)
  int64_t Kp, groups;
};

struct Linear {  // one packed Linear: int8 (scale float [N]) or int4 (scale fp16 bits [N/16][K/G][16])
  const uint8_t* weight;
  const float* col_scale;  // int8
  const uint16_t* group_scale;  // int4
  const float* bias;  // [N] or null
  int64_t N, Kp, group;  // group = Kp for int8
};

struct Attention {  // one layer's attention of a block of M rows at positions start .. start + M - 1
  const float* rq;  // [M, H, D] rotated queries
  const float* keys;  // [capacity, Hkv, D], rotated
  const float* values;
  float* out;  // [M, H, D]
  int64_t M, start, heads, kv_heads, D;
  float scaling;
};

// Attention's unit of work: the query heads sharing one key-value head, for up to ATTENTION_ROWS consecutive rows,
// so a path reads each key and value once for all of them (a prefill's rows and the heads of a group re-read the same
// keys). Task t is row tile t / kv_heads and key-value head t % kv_heads. Each (row, head) is still computed alone,
// in the order the definition above fixes, so the tiling changes no bit.
constexpr int64_t ATTENTION_ROWS = 8;

struct AttentionTask {
  int64_t kv_head, m0, m1;  // rows m0 .. m1
};

inline int64_t attention_tasks(const Attention& a) { return (a.M + ATTENTION_ROWS - 1) / ATTENTION_ROWS * a.kv_heads; }

inline AttentionTask attention_task(const Attention& a, int64_t t) {
  const int64_t m0 = t / a.kv_heads * ATTENTION_ROWS;
  return {t % a.kv_heads, m0, std::min(a.M, m0 + ATTENTION_ROWS)};
}

// f(row, head) for every (row, head) of tasks t0 .. t1: the reference computes attention one pair at a time.
template <typename F>
void for_each_row_head(const Attention& a, int64_t t0, int64_t t1, F f) {
  const int64_t groups = a.heads / a.kv_heads;
  for (int64_t t = t0; t < t1; ++t) {
    const AttentionTask task = attention_task(a, t);
    for (int64_t m = task.m0; m < task.m1; ++m)
      for (int64_t h = task.kv_head * groups; h < (task.kv_head + 1) * groups; ++h) f(m, h);
  }
}

// --- shared scalar definitions (every path includes them; -ffp-contract=off keeps each op rounded alone) ------------

// The fold of 16 lane totals into one: (l, l+8), then (l, l+4), then (l, l+2), then (0, 1).
inline float sum16(const float* lane) {
  float t[8], u[4];
  for (int i = 0; i < 8; ++i) t[i] = lane[i + 8] + lane[i];
  for (int i = 0; i < 4; ++i) u[i] = t[i + 4] + t[i];
  return (u[0] + u[2]) + (u[1] + u[3]);
}

inline float bits_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// 2^e for -126 <= e <= 127, exactly.
inline float pow2(int32_t e) { return bits_float(uint32_t(e + 127) << 23); }

// y * 2^e for -149 <= e <= 128 (fx of exp's clamped range) rounded once: y * 2^(e >> 1) is exact (normal), the second
// multiply rounds. Equal to AVX-512's vscalefps.
inline float scale_pow2(float y, int32_t e) {
  const int32_t a = e >> 1;  // floor(e / 2)
  return (y * pow2(a)) * pow2(e - a);
}

constexpr float EXP_HI = 88.3762626647949f, EXP_LO = -103.0f, LOG2E = 1.44269504088896341f;
constexpr float LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;
constexpr float EXP_P0 = 1.9875691500E-4f, EXP_P1 = 1.3981999507E-3f, EXP_P2 = 8.3334519073E-3f,
                EXP_P3 = 4.1665795894E-2f, EXP_P4 = 1.6666665459E-1f, EXP_P5 = 5.0000001201E-1f;

inline float exp_ref(float x) {
  x = x < EXP_HI ? x : EXP_HI;  // vminps / vmaxps operand order
  x = x > EXP_LO ? x : EXP_LO;
  const float fx = std::floor(std::fma(x, LOG2E, 0.5f));
  x = std::fma(-fx, LN2_HI, x);
  x = std::fma(-fx, LN2_LO, x);
  const float z = x * x;
  float y = EXP_P0;
  y = std::fma(y, x, EXP_P1);
  y = std::fma(y, x, EXP_P2);
  y = std::fma(y, x, EXP_P3);
  y = std::fma(y, x, EXP_P4);
  y = std::fma(y, x, EXP_P5);
  y = std::fma(y, z, x) + 1.0f;
  return scale_pow2(y, int32_t(fx));
}

// IEEE half to float, exactly (subnormals included).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  if (exponent == 0x1F) return bits_float(sign | 0x7F800000u | (mantissa << 13));
  if (exponent != 0) return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
  const float magnitude = float(mantissa) * pow2(-24);  // exact: a subnormal half is mantissa * 2^-24
  return sign ? -magnitude : magnitude;
}

// Rotary embedding (rotate-half form) of one head vector of D: out = v * cos + rotate_half(v) * sin.
inline void rope(const float* v, const float* cos, const float* sin, float* out, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < half; ++i) {
    out[i] = v[i] * cos[i] - v[i + half] * sin[i];
    out[i + half] = v[i + half] * cos[i + half] + v[i] * sin[i + half];
  }
}

// The column-block sums each row's quantization needs: per group (int4) or the whole row (group = Kp).
inline void group_sums(const int8_t* q, int64_t Kp, int64_t group, int32_t* sums) {
  for (int64_t g = 0; g < Kp / group; ++g) {
    int32_t s = 0;
    for (int64_t k = g * group; k < (g + 1) * group; ++k) s += q[k];
    sums[g] = s;
  }
}

// `f` called with std::integral_constant<int, n> for 1 <= n <= N: a tile's row count as a compile-time constant.
template <int N, typename F>
void with_rows(int64_t n, F f) {
  if constexpr (N > 1) {
    if (n < N) return with_rows<N - 1>(n, f);
  }
  f(std::integral_constant<int, N>{});
}

// Rows 0 .. M in tiles of at most MAX, `tile(rows, m0)` with rows a compile-time constant (a path's register budget).
template <int MAX, typename Tile>
void over_rows(int64_t M, Tile tile) {
  for (int64_t m0 = 0; m0 < M; m0 += MAX)
    with_rows<MAX>(std::min<int64_t>(MAX, M - m0), [&](auto rows) { tile(rows, m0); });
}

// A task's working memory and addresses: each (row, head) pair's scores over the task's keys (a row of `width`
// floats, the longest row's keys rounded up to 16) and its softmax's norm; the pair's query and output rows.
class TaskScores {
 public:
  TaskScores(const Attention& a, const AttentionTask& task, std::vector<float>& scratch)
      : a_(a), task_(task), groups_(a.heads / a.kv_heads), width_((a.start + task.m1 + 15) / 16 * 16) {
    const int64_t pairs = (task.m1 - task.m0) * groups_;
    scratch.resize(pairs * (width_ + 1));  // no clearing: a score past its row's length is stored, never used
    scores_ = scratch.data();
    norms_ = scores_ + pairs * width_;
  }
  int64_t groups() const { return groups_; }
  int64_t stride() const { return a_.kv_heads * a_.D; }  // floats from one position's key (value) to the next's
  const float* keys() const { return a_.keys + task_.kv_head * a_.D; }
  const float* values() const { return a_.values + task_.kv_head * a_.D; }
  const float* query(int64_t m, int64_t g) const { return a_.rq + (m * a_.heads + task_.kv_head * groups_ + g) * a_.D; }
  float* out(int64_t m, int64_t g) const { return a_.out + (m * a_.heads + task_.kv_head * groups_ + g) * a_.D; }
  float* scores(int64_t m, int64_t g) const { return scores_ + ((m - task_.m0) * groups_ + g) * width_; }
  float* norms(int64_t m, int64_t g) const { return norms_ + (m - task_.m0) * groups_ + g; }

 private:
  const Attention& a_;
  AttentionTask task_;
  int64_t groups_, width_;
  float *scores_, *norms_;
};

// The steps of a task every vector path takes. Scores BLOCK keys at a time for every row and head whose keys reach
// them, so each block of keys is read once for them all: `score(scores + j, query, keys + j * stride, n)` stores n <=
// BLOCK scaled scores (zeros past n). Then each pair's softmax: `softmax(scores, length)` turns its scores into
// weights and returns 1 / their sum. Then the weighted sums, up to `pairs` heads of a row at a time:
// `sums(view, row, first head, heads, length)`. Each pair's arithmetic is its own, in the definition's order.
template <int64_t BLOCK, typename Score, typename Softmax, typename Sums>
void attend_task(const Attention& a, const AttentionTask& task, std::vector<float>& scratch, int64_t pairs,
                 Score score, Softmax softmax, Sums sums) {
  const TaskScores view(a, task, scratch);
  for (int64_t j = 0; j < a.start + task.m1; j += BLOCK)
    for (int64_t m = std::max(task.m0, j - a.start); m < task.m1; ++m) {  // rows whose keys reach j
      const int64_t n = std::min<int64_t>(BLOCK, a.start + m + 1 - j);
      for (int64_t g = 0; g < view.groups(); ++g)
        score(view.scores(m, g) + j, view.query(m, g), view.keys() + j * view.stride(), n);
    }
  for (int64_t m = task.m0; m < task.m1; ++m) {
    const int64_t length = a.start + m + 1;
    for (int64_t g = 0; g < view.groups(); ++g) *view.norms(m, g) = softmax(view.scores(m, g), length);
    for (int64_t g0 = 0; g0 < view.groups(); g0 += pairs) sums(view, m, g0, std::min(pairs, view.groups() - g0), length);
  }
}

// attend_task's `sums` for a path whose registers hold 16 of a pair's columns, not its whole row: for each 16
// columns of D, `sums16(np, weights, norms, values, out)` with np a compile-time count of heads (at most PAIRS).
template <int PAIRS, typename Sums16>
auto by_16_columns(int64_t D, Sums16 sums16) {
  return [=](const TaskScores& view, int64_t m, int64_t g0, int64_t count, int64_t length) {
    with_rows<PAIRS>(count, [&](auto np) {
      constexpr int NP = decltype(np)::value;
      const float* e[NP];
      for (int p = 0; p < NP; ++p) e[p] = view.scores(m, g0 + p);
      for (int64_t d = 0; d < D; d += 16) {
        float* out[NP];
        for (int p = 0; p < NP; ++p) out[p] = view.out(m, g0 + p) + d;
        sums16(np, e, view.norms(m, g0), view.values() + d, length, out);
      }
    });
  };
}

// --- what each path implements (namespace specbench::reference in reference.cpp, specbench::path elsewhere) --------
#define SPECBENCH_DECLARE_PATH(ns)                                                                                  \
  namespace ns {                                                                                                    \
  extern const char* const NAME;                                                                                    \
  /* rows m0 .. m1 of x [M, K] quantized into q [M, Kp], scale [M], sums [M, Kp / group] */                        \
  void quantize_rows(const float* x, int64_t m0, int64_t m1, int64_t K, int64_t Kp, int64_t group, int8_t* q,      \
                     float* scale, int32_t* sums);                                                                  \
  /* y [M, N] for column blocks nb0 .. nb1 (of 16 columns), every row */                                          \
  void linear_int8(const Rows& rows, int64_t M, const Linear& w, int64_t nb0, int64_t nb1, const float* residual,   \
                   float* y);                                                                                       \
  void linear_int4(const Rows& rows, int64_t M, const Linear& w, int64_t nb0, int64_t nb1, const float* residual,   \
                   float* y);                                                                                       \
  void rms_norm(const float* x, const float* weight, float eps, int64_t m0, int64_t m1, int64_t K, float* y);     \
  void silu_mul(const float* gate_up, int64_t m0, int64_t m1, int64_t I, float* y);                               \
  /* attention of tasks t0 .. t1 (attention_task above) */                                                       \
  void attention(const Attention& a, int64_t t0, int64_t t1);                                                      \
  /* XOR of lines l0 .. l1 (64 bytes each) read as `streams` interleaved streams; the 8 int64 lanes summed */       \
  int64_t stream_read(const char* base, int64_t l0, int64_t l1, int64_t streams);                                  \
  }

SPECBENCH_DECLARE_PATH(reference)
SPECBENCH_DECLARE_PATH(path)

}  // namespace specbench
