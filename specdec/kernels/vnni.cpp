// Exact, flat int8 kernels for a decoder's verify blocks on AVX-512 VNNI (specdec/kernels/__init__.py builds this
// file once per machine; specdec/backends/vnni.py runs a model on it).
//
// Why a kernel of our own: a verify block streams the same weights as a one-token step, and its extra arithmetic is
// small on the int8 dot-product units, so a block can cost about one step. torch's dynamic int8 Linear (fbgemm) is
// near the bandwidth at one row but quantizes a whole call's activations with one scale, so a row's logits move with
// the rows beside it; the exact kernels were 1.7-2.3x slower a row (docs/runtimes.md). Here:
//
//   * every activation row is quantized with its own scale: q = round(x * 127 / max|x|), and the product
//     sum_k q[m,k] w[n,k] is exact in int32, so a row's result cannot depend on the rows beside it;
//   * every float operation after that (the scales, the bias, the residual) is per element, and every reduction
//     (a norm's sum of squares, an attention row's dot products and softmax) runs over one row with one code path
//     whose order depends on that row's length alone, never on how many rows share the call or on the thread split.
//
// So a (k+1)-token block computes, bit for bit, the logits of k+1 one-token steps, and rows of other sessions batched
// beside it change nothing (tests/test_vnni.py). Weights are packed once at load (specdec/kernels/pack.py):
//
//   int8  [N/16][K/4][16][4] bytes, w + 128 (0..255); one float scale per output column.
//         vpdpbusd(acc, w_u8, x_s8): acc = sum (w + 128) x  ->  sum w x = acc - 128 * sum x.
//   int4  [N/16][K/8][16][4] bytes, low nibble k = 8c + t, high nibble k = 8c + 4 + t, each w + 8 (0..15);
//         one fp16 scale per 16 columns x G k (groups of G, [N/16][K/G][16]); per group: sum w x = acc - 8 sum_g x,
//         then y += scale * float(that), groups in order.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int COLS = 16;  // output columns per packed block: one zmm of int32 accumulators
constexpr int MAX_TILE = 8;  // activation rows per pass over a block's weights

// exp(x) for a whole vector, Cephes' polynomial: every element of every row takes this one path (tails are masked,
// never scalar), so a value's exp is the same wherever it sits.
inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)), _mm512_set1_ps(-103.0f));
  __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                   _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 z = _mm512_mul_ps(x, x);
  __m512 y = _mm512_set1_ps(1.9875691500E-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
  y = _mm512_add_ps(_mm512_fmadd_ps(y, z, x), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, fx);  // y * 2^fx
}

inline __mmask16 tail_mask(int64_t remaining) {
  return remaining >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << remaining) - 1u);
}

// One row of activations, quantized: q [Kp] int8 (padding zero), its scale, its sums per group of G (int4) or whole.
void quantize_row(const float* x, int64_t K, int64_t Kp, int64_t group, int8_t* q, float* scale, int32_t* sums) {
  __m512 peak = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    __m512 v = _mm512_maskz_loadu_ps(tail_mask(K - k), x + k);
    peak = _mm512_max_ps(peak, _mm512_abs_ps(v));
  }
  const float amax = _mm512_reduce_max_ps(peak);  // max is exact in any order
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  *scale = amax / 127.0f;
  const __m512 vinv = _mm512_set1_ps(inv);
  for (int64_t k = 0; k < Kp; k += 16) {
    __m512 v = _mm512_maskz_loadu_ps(tail_mask(K - k), x + k);  // zeros past K
    __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(v, vinv));  // nearest, ties to even; |r| <= 127
    _mm512_mask_cvtsepi32_storeu_epi8(q + k, tail_mask(Kp - k), r);
  }
  const int64_t groups = Kp / group;
  for (int64_t g = 0; g < groups; ++g) {
    int32_t s = 0;
    for (int64_t k = g * group; k < (g + 1) * group; ++k) s += q[k];
    sums[g] = s;
  }
}

struct Rows {  // a call's activations, quantized once for every column block
  std::vector<int8_t> q;  // [M, Kp]
  std::vector<float> scale;  // [M]
  std::vector<int32_t> sums;  // [M, groups]
  int64_t M, Kp, groups;
};

Rows quantize(const torch::Tensor& x, int64_t Kp, int64_t group) {
  const int64_t M = x.size(0), K = x.size(1);
  Rows rows{std::vector<int8_t>(M * Kp), std::vector<float>(M), std::vector<int32_t>(M * (Kp / group)), M, Kp,
            Kp / group};
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      quantize_row(xp + m * K, K, Kp, group, rows.q.data() + m * Kp, rows.scale.data() + m,
                   rows.sums.data() + m * rows.groups);
  });
  return rows;
}

// The epilogue shared by both weight types: y = (t * x_scale + bias) + residual, per element.
inline void store(__m512 t, float x_scale, const float* bias, const float* residual, float* y, __mmask16 mask) {
  t = _mm512_mul_ps(t, _mm512_set1_ps(x_scale));
  if (bias) t = _mm512_add_ps(t, _mm512_maskz_loadu_ps(mask, bias));
  if (residual) t = _mm512_add_ps(t, _mm512_maskz_loadu_ps(mask, residual));
  _mm512_mask_storeu_ps(y, mask, t);
}

constexpr int64_t PREFETCH = 4096;  // bytes ahead of each weight stream: more lines in flight than the prefetchers keep

// T activation rows x B column blocks (B <= 2): one pass over the blocks' weights, T * B independent accumulators.
template <int T, int B>
void tile_int8(const Rows& rows, int64_t m0, const uint8_t* const* block, const float* col_scale, const float* bias,
               const float* residual, float* y, int64_t N, const int64_t* n0) {
  __m512i acc[T][B];
  const int32_t* x[T];
  for (int r = 0; r < T; ++r) {
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_si512();
    x[r] = reinterpret_cast<const int32_t*>(rows.q.data() + (m0 + r) * rows.Kp);
  }
  const int64_t chunks = rows.Kp / 4;
  for (int64_t c = 0; c < chunks; ++c) {
    __m512i w[B];
    for (int b = 0; b < B; ++b) {
      _mm_prefetch(reinterpret_cast<const char*>(block[b] + c * 64 + PREFETCH), _MM_HINT_T0);
      w[b] = _mm512_loadu_si512(block[b] + c * 64);
    }
    for (int r = 0; r < T; ++r) {
      const __m512i xr = _mm512_set1_epi32(x[r][c]);
      for (int b = 0; b < B; ++b) acc[r][b] = _mm512_dpbusd_epi32(acc[r][b], w[b], xr);
    }
  }
  for (int b = 0; b < B; ++b) {
    const __mmask16 mask = tail_mask(N - n0[b]);
    const __m512 scale = _mm512_maskz_loadu_ps(mask, col_scale + n0[b]);
    for (int r = 0; r < T; ++r) {
      const int64_t m = m0 + r;
      __m512i exact = _mm512_sub_epi32(acc[r][b], _mm512_set1_epi32(128 * rows.sums[m]));
      __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(exact), scale);
      store(t, rows.scale[m], bias ? bias + n0[b] : nullptr, residual ? residual + m * N + n0[b] : nullptr,
            y + m * N + n0[b], mask);
    }
  }
}

template <int T, int B>
void tile_int4(const Rows& rows, int64_t m0, const uint8_t* const* block, const at::Half* const* group_scale,
               int64_t group, const float* bias, const float* residual, float* y, int64_t N, const int64_t* n0) {
  __m512 total[T][B];
  const int32_t* x[T];
  for (int r = 0; r < T; ++r) {
    for (int b = 0; b < B; ++b) total[r][b] = _mm512_setzero_ps();
    x[r] = reinterpret_cast<const int32_t*>(rows.q.data() + (m0 + r) * rows.Kp);
  }
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int64_t per_group = group / 8;  // 64-byte chunks (8 k each) in a group
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
      const __m512 scale = _mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group_scale[b] + g * COLS)));
      for (int r = 0; r < T; ++r) {
        __m512i exact = _mm512_sub_epi32(acc[r][b], _mm512_set1_epi32(8 * rows.sums[(m0 + r) * rows.groups + g]));
        total[r][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), scale, total[r][b]);
      }
    }
  }
  for (int b = 0; b < B; ++b) {
    const __mmask16 mask = tail_mask(N - n0[b]);
    for (int r = 0; r < T; ++r) {
      const int64_t m = m0 + r;
      store(total[r][b], rows.scale[m], bias ? bias + n0[b] : nullptr, residual ? residual + m * N + n0[b] : nullptr,
            y + m * N + n0[b], mask);
    }
  }
}

template <typename Tile>
void over_rows(int64_t M, Tile tile) {
  for (int64_t m0 = 0; m0 < M; m0 += MAX_TILE) {
    switch (std::min<int64_t>(MAX_TILE, M - m0)) {
      case 1: tile(std::integral_constant<int, 1>{}, m0); break;
      case 2: tile(std::integral_constant<int, 2>{}, m0); break;
      case 3: tile(std::integral_constant<int, 3>{}, m0); break;
      case 4: tile(std::integral_constant<int, 4>{}, m0); break;
      case 5: tile(std::integral_constant<int, 5>{}, m0); break;
      case 6: tile(std::integral_constant<int, 6>{}, m0); break;
      case 7: tile(std::integral_constant<int, 7>{}, m0); break;
      default: tile(std::integral_constant<int, 8>{}, m0); break;
    }
  }
}

void check_rows(const torch::Tensor& x, int64_t K) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
              "activations must be a contiguous float32 [M, K] tensor");
  TORCH_CHECK(x.size(1) == K, "activations have ", x.size(1), " columns, the weight takes ", K);
}

const float* optional_ptr(const c10::optional<torch::Tensor>& t) {
  return t.has_value() ? t->data_ptr<float>() : nullptr;
}

}  // namespace

// y [M, N] = x [M, K] W^T (+ bias) (+ residual): int8 weights packed by pack.int8.
torch::Tensor linear_int8(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& col_scale,
                          const c10::optional<torch::Tensor>& bias, const c10::optional<torch::Tensor>& residual,
                          int64_t N, int64_t K) {
  check_rows(x, K);
  const int64_t Kp = (K + 3) / 4 * 4, blocks = (N + COLS - 1) / COLS, M = x.size(0);
  TORCH_CHECK(packed.numel() == blocks * COLS * Kp, "packed int8 weight has the wrong size");
  Rows rows = quantize(x, Kp, Kp);
  auto y = torch::empty({M, N}, x.options());
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const float *s = col_scale.data_ptr<float>(), *b = optional_ptr(bias), *res = optional_ptr(residual);
  float* out = y.data_ptr<float>();
  at::parallel_for(0, (blocks + 1) / 2, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t pair = p0; pair < p1; ++pair) {
      const int64_t nb = 2 * pair;
      const uint8_t* block[2] = {w + nb * COLS * Kp, w + (nb + 1) * COLS * Kp};
      const int64_t n0[2] = {nb * COLS, (nb + 1) * COLS};
      if (nb + 1 < blocks)
        over_rows(M, [&](auto tile, int64_t m0) {
          tile_int8<decltype(tile)::value, 2>(rows, m0, block, s, b, res, out, N, n0);
        });
      else
        over_rows(M, [&](auto tile, int64_t m0) {
          tile_int8<decltype(tile)::value, 1>(rows, m0, block, s, b, res, out, N, n0);
        });
    }
  });
  return y;
}

// y [M, N] = x [M, K] W^T (+ bias) (+ residual): int4 weights in groups of `group` packed by pack.int4.
torch::Tensor linear_int4(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& group_scale,
                          const c10::optional<torch::Tensor>& bias, const c10::optional<torch::Tensor>& residual,
                          int64_t N, int64_t K, int64_t group) {
  check_rows(x, K);
  TORCH_CHECK(group % 8 == 0, "an int4 group holds a multiple of 8 columns of K");
  const int64_t Kp = (K + group - 1) / group * group, blocks = (N + COLS - 1) / COLS, M = x.size(0);
  TORCH_CHECK(packed.numel() == blocks * COLS * Kp / 2, "packed int4 weight has the wrong size");
  TORCH_CHECK(group_scale.numel() == blocks * COLS * (Kp / group), "int4 scales have the wrong size");
  Rows rows = quantize(x, Kp, group);
  auto y = torch::empty({M, N}, x.options());
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const at::Half* s = group_scale.data_ptr<at::Half>();
  const float *b = optional_ptr(bias), *res = optional_ptr(residual);
  float* out = y.data_ptr<float>();
  at::parallel_for(0, (blocks + 1) / 2, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t pair = p0; pair < p1; ++pair) {
      const int64_t nb = 2 * pair;
      const uint8_t* block[2] = {w + nb * COLS * Kp / 2, w + (nb + 1) * COLS * Kp / 2};
      const at::Half* scales[2] = {s + nb * COLS * (Kp / group), s + (nb + 1) * COLS * (Kp / group)};
      const int64_t n0[2] = {nb * COLS, (nb + 1) * COLS};
      if (nb + 1 < blocks)
        over_rows(M, [&](auto tile, int64_t m0) {
          tile_int4<decltype(tile)::value, 2>(rows, m0, block, scales, group, b, res, out, N, n0);
        });
      else
        over_rows(M, [&](auto tile, int64_t m0) {
          tile_int4<decltype(tile)::value, 1>(rows, m0, block, scales, group, b, res, out, N, n0);
        });
    }
  });
  return y;
}

// RMSNorm per row: y = w * (x * 1/sqrt(mean(x^2) + eps)), as Llama and Qwen2 compute it.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == torch::kFloat32, "rms_norm takes [M, K] float32");
  const int64_t M = x.size(0), K = x.size(1);
  auto y = torch::empty_like(x);
  const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const float* row = xp + m * K;
      __m512 acc = _mm512_setzero_ps();
      for (int64_t k = 0; k < K; k += 16) {
        __m512 v = _mm512_maskz_loadu_ps(tail_mask(K - k), row + k);
        acc = _mm512_fmadd_ps(v, v, acc);
      }
      const float inv = 1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / float(K) + float(eps));
      for (int64_t k = 0; k < K; k += 16) {
        const __mmask16 mask = tail_mask(K - k);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, row + k), _mm512_set1_ps(inv));
        _mm512_mask_storeu_ps(yp + m * K + k, mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, wp + k), v));
      }
    }
  });
  return y;
}

// gate_up [M, 2I] -> silu(gate) * up [M, I], silu(g) = g / (1 + exp(-g)).
torch::Tensor silu_mul(const torch::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.size(1) % 2 == 0, "silu_mul takes [M, 2I]");
  const int64_t M = gate_up.size(0), I = gate_up.size(1) / 2;
  auto y = torch::empty({M, I}, gate_up.options());
  const float* g = gate_up.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, M, 1, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t i = 0; i < I; i += 16) {
        const __mmask16 mask = tail_mask(I - i);
        __m512 gate = _mm512_maskz_loadu_ps(mask, g + m * 2 * I + i);
        __m512 up = _mm512_maskz_loadu_ps(mask, g + m * 2 * I + I + i);
        __m512 silu = _mm512_div_ps(gate, _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), gate))));
        _mm512_mask_storeu_ps(yp + m * I + i, mask, _mm512_mul_ps(silu, up));
      }
  });
  return y;
}

// Rotary embedding (rotate-half form) of one head vector of D: out = v * cos + rotate_half(v) * sin.
static void rope(const float* v, const float* cos, const float* sin, float* out, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < half; ++i) {
    out[i] = v[i] * cos[i] - v[i + half] * sin[i];
    out[i + half] = v[i + half] * cos[i + half] + v[i] * sin[i + half];
  }
}

// Causal attention of a block at positions start .. start+M-1 over a layer's cache, one query row at a time.
// qkv [M, (H + 2 Hkv) D]: each row's q, k, v (biases added). The block's keys (rotated) and values are written into
// cache_k / cache_v [capacity, Hkv, D] at rows start..start+M-1; row m then attends to cache rows 0..start+m.
// cos / sin [positions, D]. Returns [M, H D].
torch::Tensor attention(const torch::Tensor& qkv, torch::Tensor cache_k, torch::Tensor cache_v, int64_t start,
                        const torch::Tensor& cos, const torch::Tensor& sin, int64_t heads, int64_t kv_heads,
                        double scaling) {
  const int64_t M = qkv.size(0), D = cache_k.size(2), width = (heads + 2 * kv_heads) * D;
  TORCH_CHECK(qkv.size(1) == width && qkv.is_contiguous(), "qkv rows must hold q, k and v");
  TORCH_CHECK(start + M <= cache_k.size(0), "the cache holds ", cache_k.size(0), " positions, the block needs ",
              start + M);
  TORCH_CHECK(start + M <= cos.size(0), "the rotary table holds ", cos.size(0), " positions");
  TORCH_CHECK(D % 16 == 0 && D <= 256, "head size must be a multiple of 16, at most 256");
  const float *src = qkv.data_ptr<float>(), *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float *kc = cache_k.data_ptr<float>(), *vc = cache_v.data_ptr<float>();
  auto rotated_q = torch::empty({M, heads * D}, qkv.options());
  float* rq = rotated_q.data_ptr<float>();
  at::parallel_for(0, M, 1, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const int64_t p = start + m;
      const float* row = src + m * width;
      for (int64_t h = 0; h < heads; ++h) rope(row + h * D, cp + p * D, sp + p * D, rq + (m * heads + h) * D, D);
      for (int64_t h = 0; h < kv_heads; ++h) {
        rope(row + (heads + h) * D, cp + p * D, sp + p * D, kc + (p * kv_heads + h) * D, D);
        std::copy_n(row + (heads + kv_heads + h) * D, D, vc + (p * kv_heads + h) * D);
      }
    }
  });
  auto out = torch::empty({M, heads * D}, qkv.options());
  float* op = out.data_ptr<float>();
  const int64_t groups = heads / kv_heads, vecs = D / 16;
  const float scale = float(scaling);
  at::parallel_for(0, M * heads, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m = t / heads, h = t % heads, kvh = h / groups, length = start + m + 1;
      const float* q = rq + (m * heads + h) * D;
      scores.resize((length + 15) / 16 * 16);
      for (int64_t j = 0; j < length; ++j) {
        const float* k = kc + (j * kv_heads + kvh) * D;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < vecs; ++i) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * i), _mm512_loadu_ps(k + 16 * i), acc);
        scores[j] = _mm512_reduce_add_ps(acc) * scale;
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
      const float norm = 1.0f / _mm512_reduce_add_ps(sum);
      __m512 acc[16];  // D <= 256, checked above
      for (int64_t i = 0; i < vecs; ++i) acc[i] = _mm512_setzero_ps();
      for (int64_t j = 0; j < length; ++j) {
        const __m512 weight = _mm512_set1_ps(scores[j]);
        const float* v = vc + (j * kv_heads + kvh) * D;
        for (int64_t i = 0; i < vecs; ++i) acc[i] = _mm512_fmadd_ps(weight, _mm512_loadu_ps(v + 16 * i), acc[i]);
      }
      for (int64_t i = 0; i < vecs; ++i)
        _mm512_storeu_ps(op + (m * heads + h) * D + 16 * i, _mm512_mul_ps(acc[i], _mm512_set1_ps(norm)));
    }
  });
  return out;
}

// Reads `buffer` once with every thread of the pool, 64 bytes a load, and returns an XOR of what it read so the loads
// cannot be dropped: the calibration's memory read bandwidth. Each thread reads its share as `streams` interleaved
// streams, as a weight pass reads many rows at once: one stream a thread left memory idle (25.7 GB/s on the Xeon of
// 2026-11-28, below the 27.2 GB/s the int8 step streamed); 8 streams read 30.5-32 GB/s there, 64 only 23.7. Which
// count is fastest depends on the processor's prefetchers, so the calibration tries several.
int64_t stream_read(const torch::Tensor& buffer, int64_t streams) {
  TORCH_CHECK(buffer.is_contiguous() && buffer.nbytes() % 64 == 0, "stream_read takes a contiguous multiple of 64 bytes");
  TORCH_CHECK(streams >= 1, "stream_read reads at least one stream a thread");
  const char* base = static_cast<const char*>(buffer.data_ptr());
  const int64_t lines = buffer.nbytes() / 64;
  const int64_t threads = at::get_num_threads();
  std::vector<int64_t> partial(threads, 0);
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t l0 = lines * t / threads, l1 = lines * (t + 1) / threads, per = (l1 - l0) / streams;
      __m512i acc = _mm512_setzero_si512();
      for (int64_t i = 0; i < per; ++i)
        for (int64_t s = 0; s < streams; ++s) {
          const char* line = base + (l0 + s * per + i) * 64;
          _mm_prefetch(line + PREFETCH, _MM_HINT_T0);
          acc = _mm512_xor_si512(acc, _mm512_loadu_si512(line));
        }
      for (int64_t l = l0 + streams * per; l < l1; ++l) acc = _mm512_xor_si512(acc, _mm512_loadu_si512(base + l * 64));
      partial[t] ^= _mm512_reduce_add_epi64(acc);
    }
  });
  int64_t out = 0;
  for (int64_t v : partial) out ^= v;
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("stream_read", &stream_read, "read a buffer with every thread, in `streams` streams each (memory bandwidth)",
        py::arg("buffer"), py::arg("streams"));
  m.def("linear_int8", &linear_int8, "x W^T with int8 weights and per-row int8 activations (exact int32 products)");
  m.def("linear_int4", &linear_int4, "x W^T with int4 weights in groups and per-row int8 activations");
  m.def("rms_norm", &rms_norm, "RMSNorm per row");
  m.def("silu_mul", &silu_mul, "silu(gate) * up");
  m.def("attention", &attention, "causal attention of a block over a layer's cache, one query row at a time");
}
