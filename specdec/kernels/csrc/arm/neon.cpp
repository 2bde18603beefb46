// The ARM path: AArch64 NEON with the dot-product extension (ARMv8.2 dotprod: Apple M1 on, Graviton 2 on, Ampere,
// Snapdragon): int8 products on sdot (w signed: the packed w + 128 with its top bit flipped; int4 nibbles 0..15 less
// 8 sum q). kernels.h defines every number; this file reproduces reference.cpp bit for bit: its 16 lanes are four
// q registers here. Tested under user-mode emulation against the reference (driver.cpp); its speed is not measured.
#include "../kernels.h"

#include <arm_neon.h>

#include <algorithm>
#include <vector>

namespace specbench {
namespace path {

const char* const NAME = "neon";

namespace {

constexpr int MAX_TILE = 4;  // activation rows per pass: 4 rows x 4 int32x4 accumulators of one 16-column block

inline float32x4_t load(const float* p, int64_t remaining) {  // zeros past `remaining`
  if (remaining >= 4) return vld1q_f32(p);
  float tmp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t i = 0; i < remaining; ++i) tmp[i] = p[i];
  return vld1q_f32(tmp);
}

inline void store(float* p, float32x4_t v, int64_t remaining) {
  if (remaining >= 4) {
    vst1q_f32(p, v);
    return;
  }
  float tmp[4];
  vst1q_f32(tmp, v);
  for (int64_t i = 0; i < remaining; ++i) p[i] = tmp[i];
}

inline float fold(const float32x4_t* v) {  // kernels.h's sum16 over four registers
  float lane[16];
  for (int i = 0; i < 4; ++i) vst1q_f32(lane + 4 * i, v[i]);
  return sum16(lane);
}

inline float32x4_t exp4(float32x4_t x) {  // exp_ref for 4 values
  x = vmaxq_f32(vminq_f32(x, vdupq_n_f32(EXP_HI)), vdupq_n_f32(EXP_LO));
  const float32x4_t fx = vrndmq_f32(vfmaq_f32(vdupq_n_f32(0.5f), x, vdupq_n_f32(LOG2E)));
  x = vfmsq_f32(x, fx, vdupq_n_f32(LN2_HI));
  x = vfmsq_f32(x, fx, vdupq_n_f32(LN2_LO));
  const float32x4_t z = vmulq_f32(x, x);
  float32x4_t y = vdupq_n_f32(EXP_P0);
  y = vfmaq_f32(vdupq_n_f32(EXP_P1), y, x);
  y = vfmaq_f32(vdupq_n_f32(EXP_P2), y, x);
  y = vfmaq_f32(vdupq_n_f32(EXP_P3), y, x);
  y = vfmaq_f32(vdupq_n_f32(EXP_P4), y, x);
  y = vfmaq_f32(vdupq_n_f32(EXP_P5), y, x);
  y = vaddq_f32(vfmaq_f32(x, y, z), vdupq_n_f32(1.0f));
  const int32x4_t e = vcvtq_s32_f32(fx), a = vshrq_n_s32(e, 1), b = vsubq_s32(e, a);
  const float32x4_t pa = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(a, vdupq_n_s32(127)), 23));
  const float32x4_t pb = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(b, vdupq_n_s32(127)), 23));
  return vmulq_f32(vmulq_f32(y, pa), pb);  // scale_pow2
}

inline void epilogue(float32x4_t t, float x_scale, const float* bias, const float* residual, float* y,
                     int64_t remaining) {
  t = vmulq_f32(t, vdupq_n_f32(x_scale));
  if (bias) t = vaddq_f32(t, load(bias, remaining));
  if (residual) t = vaddq_f32(t, load(residual, remaining));
  store(y, t, remaining);
}

inline int8x16_t broadcast(int32_t four) { return vreinterpretq_s8_s32(vdupq_n_s32(four)); }

template <int T>
void tile_int8(const Rows& rows, int64_t m0, const Linear& w, const float* residual, float* y, int64_t nb) {
  int32x4_t acc[T][4];
  const int32_t* x[T];
  const uint8_t* block = w.weight + nb * COLS * w.Kp;
  for (int r = 0; r < T; ++r) {
    for (int i = 0; i < 4; ++i) acc[r][i] = vdupq_n_s32(0);
    x[r] = reinterpret_cast<const int32_t*>(rows.q + (m0 + r) * rows.Kp);
  }
  const uint8x16_t flip = vdupq_n_u8(0x80);
  for (int64_t c = 0; c < rows.Kp / 4; ++c) {
    int8x16_t wv[4];
    for (int i = 0; i < 4; ++i) wv[i] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(block + c * 64 + 16 * i), flip));
    for (int r = 0; r < T; ++r) {
      const int8x16_t xr = broadcast(x[r][c]);
      for (int i = 0; i < 4; ++i) acc[r][i] = vdotq_s32(acc[r][i], wv[i], xr);
    }
  }
  for (int i = 0; i < 4; ++i) {
    const int64_t n = nb * COLS + 4 * i, remaining = w.N - n;
    if (remaining <= 0) break;
    const float32x4_t scale = load(w.col_scale + n, remaining);
    for (int r = 0; r < T; ++r) {
      const int64_t m = m0 + r;
      epilogue(vmulq_f32(vcvtq_f32_s32(acc[r][i]), scale), rows.scale[m], w.bias ? w.bias + n : nullptr,
               residual ? residual + m * w.N + n : nullptr, y + m * w.N + n, remaining);
    }
  }
}

template <int T>
void tile_int4(const Rows& rows, int64_t m0, const Linear& w, const float* residual, float* y, int64_t nb) {
  float32x4_t total[T][4];
  const int32_t* x[T];
  const uint8_t* block = w.weight + nb * COLS * w.Kp / 2;
  const uint16_t* group_scale = w.group_scale + nb * COLS * rows.groups;
  for (int r = 0; r < T; ++r) {
    for (int i = 0; i < 4; ++i) total[r][i] = vdupq_n_f32(0.0f);
    x[r] = reinterpret_cast<const int32_t*>(rows.q + (m0 + r) * rows.Kp);
  }
  const uint8x16_t low = vdupq_n_u8(0x0F);
  const int64_t per_group = w.group / 8;
  for (int64_t g = 0; g < rows.groups; ++g) {
    int32x4_t acc[T][4];
    for (int r = 0; r < T; ++r)
      for (int i = 0; i < 4; ++i) acc[r][i] = vdupq_n_s32(0);
    for (int64_t c = g * per_group; c < (g + 1) * per_group; ++c) {
      int8x16_t lo[4], hi[4];
      for (int i = 0; i < 4; ++i) {
        const uint8x16_t v = vld1q_u8(block + c * 64 + 16 * i);
        lo[i] = vreinterpretq_s8_u8(vandq_u8(v, low));
        hi[i] = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
      }
      for (int r = 0; r < T; ++r) {
        const int8x16_t xlo = broadcast(x[r][2 * c]), xhi = broadcast(x[r][2 * c + 1]);
        for (int i = 0; i < 4; ++i) acc[r][i] = vdotq_s32(vdotq_s32(acc[r][i], lo[i], xlo), hi[i], xhi);
      }
    }
    for (int i = 0; i < 4; ++i) {
      const float32x4_t scale = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(group_scale + g * COLS + 4 * i)));
      for (int r = 0; r < T; ++r) {
        const int32x4_t exact = vsubq_s32(acc[r][i], vdupq_n_s32(8 * rows.sums[(m0 + r) * rows.groups + g]));
        total[r][i] = vfmaq_f32(total[r][i], vcvtq_f32_s32(exact), scale);
      }
    }
  }
  for (int i = 0; i < 4; ++i) {
    const int64_t n = nb * COLS + 4 * i, remaining = w.N - n;
    if (remaining <= 0) break;
    for (int r = 0; r < T; ++r) {
      const int64_t m = m0 + r;
      epilogue(total[r][i], rows.scale[m], w.bias ? w.bias + n : nullptr, residual ? residual + m * w.N + n : nullptr,
               y + m * w.N + n, remaining);
    }
  }
}

// kernels.h's sum16 of 4 keys at once (acc[i]: key i's 16 lanes, four registers): lane i of the result is sum16 of
// key i, each pair added as sum16 adds it; the permutes only move lanes, so every sum is the scalar fold's bit for bit.
inline float32x4_t fold4(const float32x4_t (*acc)[4]) {
  float32x4_t pairs[4];
  for (int i = 0; i < 4; ++i) {
    // (l, l + 8) then (l, l + 4): lanes 0-3 of u are sum16's u[0..3]
    const float32x4_t u = vaddq_f32(vaddq_f32(acc[i][3], acc[i][1]), vaddq_f32(acc[i][2], acc[i][0]));
    pairs[i] = vaddq_f32(u, vextq_f32(u, u, 2));  // (u0 + u2, u1 + u3, u2 + u0, u3 + u1)
  }
  // (u0 + u2) + (u1 + u3) per key: lanes k0 k0 k1 k1 | k2 k2 k3 k3, then every other one
  return vuzp1q_f32(vpaddq_f32(pairs[0], pairs[1]), vpaddq_f32(pairs[2], pairs[3]));
}

// One query of D against n <= 4 consecutive keys (key i at keys + i * stride): lane i its sum16 dot product (0 past n).
inline float32x4_t dots4(const float* q, const float* keys, int64_t stride, int64_t n, int64_t D) {
  float32x4_t acc[4][4];
  for (int i = 0; i < 4; ++i)
    for (int l = 0; l < 4; ++l) acc[i][l] = vdupq_n_f32(0.0f);
  for (int64_t d = 0; d < D; d += 16) {
    float32x4_t qv[4];
    for (int l = 0; l < 4; ++l) qv[l] = vld1q_f32(q + d + 4 * l);
    for (int i = 0; i < 4; ++i)
      if (i < n)
        for (int l = 0; l < 4; ++l) acc[i][l] = vfmaq_f32(acc[i][l], qv[l], vld1q_f32(keys + i * stride + d + 4 * l));
  }
  return fold4(acc);
}

// NP (row, head) pairs' weighted sums over values 0 .. length - 1, 16 of D's columns: (sum_j e_j v_j, fma in j
// order) * norm, each value's four vectors loaded once for the NP pairs.
template <int NP>
void weighted_sums16(const float* const* e, const float* norm, const float* values, int64_t stride, int64_t length,
                     float* const* out) {
  float32x4_t acc[NP][4];
  for (int p = 0; p < NP; ++p)
    for (int l = 0; l < 4; ++l) acc[p][l] = vdupq_n_f32(0.0f);
  for (int64_t j = 0; j < length; ++j) {
    float32x4_t v[4];
    for (int l = 0; l < 4; ++l) v[l] = vld1q_f32(values + j * stride + 4 * l);
    for (int p = 0; p < NP; ++p)
      for (int l = 0; l < 4; ++l) acc[p][l] = vfmaq_n_f32(acc[p][l], v[l], e[p][j]);
  }
  for (int p = 0; p < NP; ++p)
    for (int l = 0; l < 4; ++l) vst1q_f32(out[p] + 4 * l, vmulq_n_f32(acc[p][l], norm[p]));
}

// kernels.h's softmax of one (row, head)'s scores 0 .. length - 1, in place; returns 1 / the sum of the weights.
inline float softmax16(float* s, int64_t length) {
  float top = -INFINITY;
  for (int64_t j = 0; j < length; ++j) top = std::max(top, s[j]);  // exact in any order
  float32x4_t sum[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
  for (int64_t j = 0; j < length; j += 16)
    for (int l = 0; l < 4; ++l) {
      const int64_t at = j + 4 * l;
      if (at >= length) break;  // lanes past the row add nothing (as a masked zero would)
      float32x4_t e = exp4(vsubq_f32(vld1q_f32(s + at), vdupq_n_f32(top)));
      if (length - at < 4) {
        static const uint32_t iota[4] = {0, 1, 2, 3};
        const uint32x4_t keep = vcltq_u32(vld1q_u32(iota), vdupq_n_u32(uint32_t(length - at)));
        e = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(e), keep));
      }
      vst1q_f32(s + at, e);
      sum[l] = vaddq_f32(sum[l], e);
    }
  return 1.0f / fold(sum);
}

// One task (kernels.h's attend_task): scores 4 keys at a time; each value's 16 columns read once for up to 4 heads.
void attend(const Attention& a, const AttentionTask& task, std::vector<float>& scratch) {
  constexpr int PAIRS = 4;  // weighted_sums16: 16 accumulators, 4 values
  const int64_t stride = a.kv_heads * a.D, D = a.D;
  attend_task<4>(
      a, task, scratch, PAIRS,
      [&](float* s, const float* q, const float* keys, int64_t n) {
        vst1q_f32(s, vmulq_n_f32(dots4(q, keys, stride, n, D), a.scaling));
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
  for (int64_t m = m0; m < m1; ++m) {
    const float* row = x + m * K;
    float32x4_t peak = vdupq_n_f32(0.0f);
    for (int64_t k = 0; k < K; k += 4) peak = vmaxq_f32(peak, vabsq_f32(load(row + k, K - k)));
    const float amax = vmaxvq_f32(peak);
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    scale[m] = amax / 127.0f;
    int8_t* qm = q + m * Kp;
    int32_t rounded[4];
    for (int64_t k = 0; k < Kp; k += 4) {
      vst1q_s32(rounded, vcvtnq_s32_f32(vmulq_n_f32(load(row + k, K - k), inv)));  // nearest, ties to even
      for (int i = 0; i < 4 && k + i < Kp; ++i) qm[k + i] = int8_t(rounded[i]);
    }
    group_sums(qm, Kp, group, sums + m * (Kp / group));
  }
}

void linear_int8(const Rows& rows, int64_t M, const Linear& w, int64_t nb0, int64_t nb1, const float* residual,
                 float* y) {
  for (int64_t nb = nb0; nb < nb1; ++nb)
    over_rows<MAX_TILE>(M, [&](auto tile, int64_t m0) { tile_int8<decltype(tile)::value>(rows, m0, w, residual, y, nb); });
}

void linear_int4(const Rows& rows, int64_t M, const Linear& w, int64_t nb0, int64_t nb1, const float* residual,
                 float* y) {
  for (int64_t nb = nb0; nb < nb1; ++nb)
    over_rows<MAX_TILE>(M, [&](auto tile, int64_t m0) { tile_int4<decltype(tile)::value>(rows, m0, w, residual, y, nb); });
}

void rms_norm(const float* x, const float* weight, float eps, int64_t m0, int64_t m1, int64_t K, float* y) {
  for (int64_t m = m0; m < m1; ++m) {
    const float* row = x + m * K;
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (int64_t k = 0; k < K; k += 16)
      for (int i = 0; i < 4; ++i) {
        const float32x4_t v = load(row + k + 4 * i, K - k - 4 * i);
        acc[i] = vfmaq_f32(acc[i], v, v);
      }
    const float32x4_t inv = vdupq_n_f32(1.0f / std::sqrt(fold(acc) / float(K) + eps));
    for (int64_t k = 0; k < K; k += 4)
      store(y + m * K + k, vmulq_f32(load(weight + k, K - k), vmulq_f32(load(row + k, K - k), inv)), K - k);
  }
}

void silu_mul(const float* gate_up, int64_t m0, int64_t m1, int64_t I, float* y) {
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t i = 0; i < I; i += 4) {
      const float32x4_t gate = load(gate_up + m * 2 * I + i, I - i), up = load(gate_up + m * 2 * I + I + i, I - i);
      const float32x4_t e = exp4(vsubq_f32(vdupq_n_f32(0.0f), gate));
      store(y + m * I + i, vmulq_f32(vdivq_f32(gate, vaddq_f32(vdupq_n_f32(1.0f), e)), up), I - i);
    }
}

void attention(const Attention& a, int64_t t0, int64_t t1) {
  std::vector<float> scratch;
  for (int64_t t = t0; t < t1; ++t) attend(a, attention_task(a, t), scratch);
}

int64_t stream_read(const char* base, int64_t l0, int64_t l1, int64_t streams) {
  const int64_t per = (l1 - l0) / streams;
  uint64x2_t acc[4] = {vdupq_n_u64(0), vdupq_n_u64(0), vdupq_n_u64(0), vdupq_n_u64(0)};
  auto read = [&](const char* line) {
    for (int i = 0; i < 4; ++i) acc[i] = veorq_u64(acc[i], vld1q_u64(reinterpret_cast<const uint64_t*>(line + 16 * i)));
  };
  for (int64_t i = 0; i < per; ++i)
    for (int64_t s = 0; s < streams; ++s) read(base + (l0 + s * per + i) * 64);
  for (int64_t l = l0 + streams * per; l < l1; ++l) read(base + l * 64);
  uint64_t total = 0;
  for (int i = 0; i < 4; ++i) total += vgetq_lane_u64(acc[i], 0) + vgetq_lane_u64(acc[i], 1);
  return int64_t(total);
}

}  // namespace path
}  // namespace specbench
