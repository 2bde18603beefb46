// The reference path: kernels.h's definitions in plain scalar C++. It defines every number the vector paths must
// reproduce bit for bit, runs on any CPU (slowly: SPECBENCH_KERNELS=reference), and is the other side of every
// exactness test, in Python (tests/test_kernels.py) and under emulation (driver.cpp).
#include "kernels.h"

#include <vector>

#include <algorithm>

namespace specbench {
namespace reference {

const char* const NAME = "reference";

void quantize_rows(const float* x, int64_t m0, int64_t m1, int64_t K, int64_t Kp, int64_t group, int8_t* q,
                   float* scale, int32_t* sums) {
  for (int64_t m = m0; m < m1; ++m) {
    const float* row = x + m * K;
    float amax = 0.0f;
    for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(row[k]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    scale[m] = amax / 127.0f;
    int8_t* qm = q + m * Kp;
    for (int64_t k = 0; k < Kp; ++k) qm[k] = k < K ? int8_t(std::nearbyint(row[k] * inv)) : int8_t(0);
    group_sums(qm, Kp, group, sums + m * (Kp / group));
  }
}

// The packed byte of weight (n, k) in a [N/16][K/4][16][4] layout.
static inline uint8_t int8_at(const Linear& w, int64_t n, int64_t k) {
  return w.weight[((n / COLS) * (w.Kp / 4) + k / 4) * 64 + (n % COLS) * 4 + k % 4];
}

// The nibble (0..15) of weight (n, k) in a [N/16][K/8][16][4] layout.
static inline int32_t int4_at(const Linear& w, int64_t n, int64_t k) {
  const uint8_t byte = w.weight[((n / COLS) * (w.Kp / 8) + k / 8) * 64 + (n % COLS) * 4 + k % 4];
  return (k % 8) < 4 ? (byte & 0x0F) : (byte >> 4);
}

static inline float epilogue(float total, float row_scale, const float* bias, const float* residual, int64_t n) {
  float t = total * row_scale;
  if (bias) t = t + bias[n];
  if (residual) t = t + residual[n];
  return t;
}

void linear_int8(const Rows& rows, int64_t M, const Linear& w, int64_t nb0, int64_t nb1, const float* residual,
                 float* y) {
  const int64_t n1 = std::min(nb1 * COLS, w.N);
  for (int64_t m = 0; m < M; ++m) {
    const int8_t* q = rows.q + m * rows.Kp;
    for (int64_t n = nb0 * COLS; n < n1; ++n) {
      int32_t dot = 0;
      for (int64_t k = 0; k < rows.Kp; ++k) dot += int32_t(q[k]) * (int32_t(int8_at(w, n, k)) - 128);
      y[m * w.N + n] = epilogue(float(dot) * w.col_scale[n], rows.scale[m], w.bias,
                                residual ? residual + m * w.N : nullptr, n);
    }
  }
}

void linear_int4(const Rows& rows, int64_t M, const Linear& w, int64_t nb0, int64_t nb1, const float* residual,
                 float* y) {
  const int64_t n1 = std::min(nb1 * COLS, w.N), groups = w.Kp / w.group;
  for (int64_t m = 0; m < M; ++m) {
    const int8_t* q = rows.q + m * rows.Kp;
    for (int64_t n = nb0 * COLS; n < n1; ++n) {
      float total = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t dot = 0;
        for (int64_t k = g * w.group; k < (g + 1) * w.group; ++k) dot += int32_t(q[k]) * (int4_at(w, n, k) - 8);
        const float scale = half_to_float(w.group_scale[((n / COLS) * groups + g) * COLS + n % COLS]);
        total = std::fma(float(dot), scale, total);
      }
      y[m * w.N + n] = epilogue(total, rows.scale[m], w.bias, residual ? residual + m * w.N : nullptr, n);
    }
  }
}

void rms_norm(const float* x, const float* weight, float eps, int64_t m0, int64_t m1, int64_t K, float* y) {
  for (int64_t m = m0; m < m1; ++m) {
    const float* row = x + m * K;
    float lane[16] = {};
    for (int64_t k = 0; k < K; ++k) lane[k % 16] = std::fma(row[k], row[k], lane[k % 16]);
    const float inv = 1.0f / std::sqrt(sum16(lane) / float(K) + eps);
    for (int64_t k = 0; k < K; ++k) y[m * K + k] = weight[k] * (row[k] * inv);
  }
}

void silu_mul(const float* gate_up, int64_t m0, int64_t m1, int64_t I, float* y) {
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t i = 0; i < I; ++i) {
      const float gate = gate_up[m * 2 * I + i], up = gate_up[m * 2 * I + I + i];
      y[m * I + i] = (gate / (1.0f + exp_ref(0.0f - gate))) * up;
    }
}

void attention(const Attention& a, int64_t t0, int64_t t1) {
  const int64_t groups = a.heads / a.kv_heads, D = a.D;
  std::vector<float> scores;
  for_each_row_head(a, t0, t1, [&](int64_t m, int64_t h) {
    const int64_t kvh = h / groups, length = a.start + m + 1;
    const float* q = a.rq + (m * a.heads + h) * D;
    scores.resize(length);
    for (int64_t j = 0; j < length; ++j) {
      const float* k = a.keys + (j * a.kv_heads + kvh) * D;
      float lane[16] = {};
      for (int64_t i = 0; i < D; ++i) lane[i % 16] = std::fma(q[i], k[i], lane[i % 16]);
      scores[j] = sum16(lane) * a.scaling;
    }
    float top = -INFINITY;
    for (int64_t j = 0; j < length; ++j) top = std::max(top, scores[j]);
    float lane[16] = {};
    for (int64_t j = 0; j < length; ++j) {
      scores[j] = exp_ref(scores[j] - top);
      lane[j % 16] = lane[j % 16] + scores[j];
    }
    const float norm = 1.0f / sum16(lane);
    float* out = a.out + (m * a.heads + h) * D;
    for (int64_t i = 0; i < D; ++i) {
      float acc = 0.0f;
      for (int64_t j = 0; j < length; ++j) acc = std::fma(scores[j], a.values[(j * a.kv_heads + kvh) * D + i], acc);
      out[i] = acc * norm;
    }
  });
}

int64_t stream_read(const char* base, int64_t l0, int64_t l1, int64_t streams) {
  uint64_t acc[8] = {};
  const int64_t per = (l1 - l0) / streams;
  auto read = [&](int64_t line) {
    uint64_t v[8];
    std::memcpy(v, base + line * 64, 64);
    for (int i = 0; i < 8; ++i) acc[i] ^= v[i];
  };
  for (int64_t i = 0; i < per; ++i)
    for (int64_t s = 0; s < streams; ++s) read(l0 + s * per + i);
  for (int64_t l = l0 + streams * per; l < l1; ++l) read(l);
  uint64_t total = 0;
  for (uint64_t v : acc) total += v;
  return int64_t(total);
}

}  // namespace reference
}  // namespace specbench
