// A path against the reference without torch: every kernel on small shapes (K and N off the packing's multiples,
// int4 rows whose K mod 32 is 1..15, outlying and all-zero rows, exp's clamps, grouped heads, blocks of 1-9 rows),
// compared bit for bit. Built by specdec/kernels/cross.py with the path's compiler (a cross compiler for ARM) and run
// natively or under qemu-user; prints one line per failure and "N passed, M failed"; exits 1 on any failure.
#include "kernels.h"

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace specbench;

namespace {

std::mt19937 rng(1234);
int passed = 0, failed = 0;

std::vector<float> normal(int64_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

void check(const std::string& what, const void* a, const void* b, size_t bytes) {
  if (std::memcmp(a, b, bytes) == 0) {
    ++passed;
    return;
  }
  ++failed;
  const float *fa = static_cast<const float*>(a), *fb = static_cast<const float*>(b);
  for (size_t i = 0; i < bytes / 4; ++i)
    if (std::memcmp(fa + i, fb + i, 4) != 0) {
      std::printf("FAIL %s: element %zu reference %.9g path %.9g\n", what.c_str(), i, fa[i], fb[i]);
      return;
    }
  std::printf("FAIL %s\n", what.c_str());
}

struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> sums;
};

template <typename Quantize>
Quantized quantize(Quantize fn, const std::vector<float>& x, int64_t M, int64_t K, int64_t Kp, int64_t group) {
  Quantized out{std::vector<int8_t>(M * Kp, 0), std::vector<float>(M), std::vector<int32_t>(M * (Kp / group))};
  fn(x.data(), 0, M, K, Kp, group, out.q.data(), out.scale.data(), out.sums.data());
  return out;
}

void linear_case(bool int4, int64_t M, int64_t N, int64_t K) {
  const int64_t group = int4 ? 32 : 0, Kp = int4 ? (K + 31) / 32 * 32 : (K + 3) / 4 * 4, Np = (N + 15) / 16 * 16;
  std::vector<float> x = normal(M * K);
  if (M > 3) for (int64_t k = 0; k < K; ++k) x[3 * K + k] *= 50.0f;  // an outlying row
  if (M > 2) for (int64_t k = 0; k < K; ++k) x[2 * K + k] = 0.0f;  // an all-zero row
  const std::string what = std::string(int4 ? "int4" : "int8") + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                           " K=" + std::to_string(K);
  Quantized qr = quantize(reference::quantize_rows, x, M, K, Kp, int4 ? group : Kp);
  Quantized qp = quantize(path::quantize_rows, x, M, K, Kp, int4 ? group : Kp);
  check(what + " quantize", qr.q.data(), qp.q.data(), qr.q.size());
  check(what + " row scales", qr.scale.data(), qp.scale.data(), 4 * M);
  std::vector<uint8_t> weight(int4 ? Np * Kp / 2 : Np * Kp);
  std::uniform_int_distribution<int> byte(int4 ? 0 : 1, 255);  // pack.int8 stores w + 128 in 1..255
  for (auto& b : weight) b = uint8_t(byte(rng));
  std::vector<float> col_scale = normal(N, 0.01f), bias = normal(N), residual = normal(M * N);
  std::vector<uint16_t> group_scale(Np * (Kp / 32));
  std::uniform_int_distribution<int> exponent(5, 20), mantissa(0, 1023), sign(0, 1);
  for (auto& s : group_scale) s = uint16_t((sign(rng) << 15) | (exponent(rng) << 10) | mantissa(rng));
  const Linear w{weight.data(), col_scale.data(), group_scale.data(), bias.data(), N, Kp, int4 ? group : Kp};
  const Rows rows{qr.q.data(), qr.scale.data(), qr.sums.data(), Kp, int4 ? Kp / group : 1};
  std::vector<float> yr(M * N), yp(M * N);
  const int64_t blocks = Np / 16;
  for (const float* res : {static_cast<const float*>(nullptr), static_cast<const float*>(residual.data())}) {
    if (int4) {
      reference::linear_int4(rows, M, w, 0, blocks, res, yr.data());
      path::linear_int4(rows, M, w, 0, 1, res, yp.data());  // column blocks split as threads would split them
      path::linear_int4(rows, M, w, 1, blocks, res, yp.data());
    } else {
      reference::linear_int8(rows, M, w, 0, blocks, res, yr.data());
      path::linear_int8(rows, M, w, 0, 1, res, yp.data());
      path::linear_int8(rows, M, w, 1, blocks, res, yp.data());
    }
    check(what + (res ? " residual" : ""), yr.data(), yp.data(), 4 * M * N);
  }
}

void elementwise_case(int64_t M, int64_t K) {
  std::vector<float> x = normal(M * K, 3.0f), weight = normal(K), gate_up = normal(M * 2 * K, 8.0f);
  if (M > 1) {  // exp's clamps and the far tails: -g beyond 88.4 and below -103
    gate_up[0] = -95.0f, gate_up[1] = 120.0f, gate_up[2] = -87.5f, gate_up[3] = 104.0f, gate_up[4] = 0.0f;
    for (int64_t k = 0; k < K; ++k) x[K + k] = 0.0f;
  }
  std::vector<float> yr(M * K), yp(M * K);
  reference::rms_norm(x.data(), weight.data(), 1e-6f, 0, M, K, yr.data());
  path::rms_norm(x.data(), weight.data(), 1e-6f, 0, M, K, yp.data());
  check("rms_norm M=" + std::to_string(M) + " K=" + std::to_string(K), yr.data(), yp.data(), 4 * M * K);
  reference::silu_mul(gate_up.data(), 0, M, K, yr.data());
  path::silu_mul(gate_up.data(), 0, M, K, yp.data());
  check("silu_mul M=" + std::to_string(M) + " I=" + std::to_string(K), yr.data(), yp.data(), 4 * M * K);
}

void attention_case(int64_t M, int64_t start, int64_t heads, int64_t kv_heads, int64_t D) {
  const int64_t positions = start + M;
  std::vector<float> rq = normal(M * heads * D, 2.0f), keys = normal(positions * kv_heads * D, 2.0f),
                     values = normal(positions * kv_heads * D), yr(M * heads * D), yp(M * heads * D);
  const Attention ar{rq.data(), keys.data(), values.data(), yr.data(), M, start, heads, kv_heads, D, 0.125f};
  Attention ap = ar;
  ap.out = yp.data();
  const int64_t tasks = attention_tasks(ar);
  reference::attention(ar, 0, tasks);
  for (int64_t t = tasks - 1; t >= 0; --t) path::attention(ap, t, t + 1);  // any split, any order
  check("attention M=" + std::to_string(M) + " start=" + std::to_string(start) + " heads=" + std::to_string(heads) +
            "/" + std::to_string(kv_heads) + " D=" + std::to_string(D),
        yr.data(), yp.data(), 4 * M * heads * D);
}

}  // namespace

int main() {
  for (bool int4 : {false, true})
    for (int64_t M = 1; M <= 9; ++M) linear_case(int4, M, 37, 200);
  for (bool int4 : {false, true})
    for (int64_t K : {1, 7, 15, 31, 33, 47, 64, 100, 1000, 2500})  // K mod 32 in 1..15 too; 2500: k in spans (avx2)
      linear_case(int4, 11, 48, K);
  for (bool int4 : {false, true}) linear_case(int4, 5, 300, 96);
  for (int64_t M : {1, 2, 5}) for (int64_t K : {8, 16, 37, 64, 200}) elementwise_case(M, K);
  for (int64_t M : {1, 3, 9, 17})
    for (int64_t start : {0, 5, 17, 40}) {
      attention_case(M, start, 4, 2, 16);
      attention_case(M, start, 2, 1, 64);
      attention_case(M, start, 12, 2, 128);  // the 1.5B's heads
    }
  attention_case(2, 3, 2, 2, 256);
  std::vector<uint64_t> buffer(8 * 53);
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = i * 2654435761u;
  for (int64_t streams : {1, 3, 8}) {
    const int64_t r = reference::stream_read(reinterpret_cast<const char*>(buffer.data()), 0, 53, streams);
    const int64_t p = path::stream_read(reinterpret_cast<const char*>(buffer.data()), 0, 53, streams);
    check("stream_read streams=" + std::to_string(streams), &r, &p, 8);
  }
  std::printf("%s: %d passed, %d failed\n", path::NAME, passed, failed);
  return failed ? 1 : 0;
}
