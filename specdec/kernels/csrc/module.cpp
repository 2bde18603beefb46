// One instruction-set path bound to torch: argument checks, buffers, the thread split (at::parallel_for over column
// blocks, rows or (row, head) tasks: nothing a path computes depends on it) and the Python module. Built once per
// path and machine class by specdec/kernels/__init__.py with the path's compiler flags; SPECBENCH_IMPL names the
// namespace (reference or path) whose functions it binds.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <tuple>
#include <utility>
#include <vector>

#include "kernels.h"

namespace impl = specbench::SPECBENCH_IMPL;
using specbench::COLS;

namespace {

struct Quantized {  // owns what specbench::Rows points into
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> sums;
  specbench::Rows rows;
};

void quantize(const torch::Tensor& x, int64_t Kp, int64_t group, Quantized& out) {
  const int64_t M = x.size(0), K = x.size(1);
  out.q.assign(M * Kp, 0);
  out.scale.assign(M, 0.0f);
  out.sums.assign(M * (Kp / group), 0);
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    impl::quantize_rows(xp, m0, m1, K, Kp, group, out.q.data(), out.scale.data(), out.sums.data());
  });
  out.rows = specbench::Rows{out.q.data(), out.scale.data(), out.sums.data(), Kp, Kp / group};
}

void check_rows(const torch::Tensor& x, int64_t K) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
              "activations must be a contiguous float32 [M, K] tensor");
  TORCH_CHECK(x.size(1) == K, "activations have ", x.size(1), " columns, the weight takes ", K);
}

const float* optional_ptr(const c10::optional<torch::Tensor>& t, int64_t numel) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->is_contiguous() && t->scalar_type() == torch::kFloat32 && t->numel() == numel,
              "bias and residual must be contiguous float32 of the output's size");
  return t->data_ptr<float>();
}

// The output [M, N]: a new tensor, or `out` when the caller passes one (a workspace it reuses). A fresh tensor over
// glibc's largest mmap threshold (32 MB) is new pages every call: the 1.5B's gate_up output for an 800-token prefill
// is 57 MB, 28 of them a prefill, ~390,000 page faults (measured 2026-11-30: the prefill 12 % faster without them).
torch::Tensor output(const torch::Tensor& x, int64_t N, const c10::optional<torch::Tensor>& out,
                     const c10::optional<torch::Tensor>& residual) {
  if (!out.has_value()) return torch::empty({x.size(0), N}, x.options());
  TORCH_CHECK(out->dim() == 2 && out->size(0) == x.size(0) && out->size(1) == N && out->is_contiguous() &&
                  out->scalar_type() == torch::kFloat32,
              "out must be a contiguous float32 [M, N] tensor");
  TORCH_CHECK(!out->is_same(x) && out->data_ptr() != x.data_ptr() &&
                  !(residual.has_value() && out->data_ptr() == residual->data_ptr()),
              "out must not be the activations or the residual");
  return *out;
}

// Column blocks in pairs (a path may pass over two blocks' weights at once), split over the threads.
template <typename Run>
void over_blocks(int64_t blocks, Run run) {
  at::parallel_for(0, (blocks + 1) / 2, 1, [&](int64_t p0, int64_t p1) { run(2 * p0, std::min(2 * p1, blocks)); });
}

}  // namespace

// y [M, N] = x [M, K] W^T (+ bias) (+ residual): int8 weights packed by pack.int8.
torch::Tensor linear_int8(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& col_scale,
                          const c10::optional<torch::Tensor>& bias, const c10::optional<torch::Tensor>& residual,
                          int64_t N, int64_t K, const c10::optional<torch::Tensor>& out_) {
  check_rows(x, K);
  const int64_t Kp = (K + 3) / 4 * 4, blocks = (N + COLS - 1) / COLS, M = x.size(0);
  TORCH_CHECK(packed.numel() == blocks * COLS * Kp, "packed int8 weight has the wrong size");
  TORCH_CHECK(col_scale.numel() == N && col_scale.scalar_type() == torch::kFloat32, "int8 scales have the wrong size");
  Quantized q;
  quantize(x, Kp, Kp, q);
  auto y = output(x, N, out_, residual);
  const specbench::Linear w{packed.data_ptr<uint8_t>(), col_scale.data_ptr<float>(), nullptr, optional_ptr(bias, N),
                            N, Kp, Kp};
  const float* res = optional_ptr(residual, M * N);
  float* out = y.data_ptr<float>();
  over_blocks(blocks, [&](int64_t nb0, int64_t nb1) { impl::linear_int8(q.rows, M, w, nb0, nb1, res, out); });
  return y;
}

// y [M, N] = x [M, K] W^T (+ bias) (+ residual): int4 weights in groups of `group` packed by pack.int4.
torch::Tensor linear_int4(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& group_scale,
                          const c10::optional<torch::Tensor>& bias, const c10::optional<torch::Tensor>& residual,
                          int64_t N, int64_t K, int64_t group, const c10::optional<torch::Tensor>& out_) {
  check_rows(x, K);
  TORCH_CHECK(group % 8 == 0 && group > 0, "an int4 group holds a multiple of 8 columns of K");
  const int64_t Kp = (K + group - 1) / group * group, blocks = (N + COLS - 1) / COLS, M = x.size(0);
  TORCH_CHECK(packed.numel() == blocks * COLS * Kp / 2, "packed int4 weight has the wrong size");
  TORCH_CHECK(group_scale.numel() == blocks * COLS * (Kp / group) && group_scale.scalar_type() == torch::kHalf,
              "int4 scales have the wrong size");
  Quantized q;
  quantize(x, Kp, group, q);
  auto y = output(x, N, out_, residual);
  const specbench::Linear w{packed.data_ptr<uint8_t>(), nullptr,
                            reinterpret_cast<const uint16_t*>(group_scale.data_ptr<at::Half>()), optional_ptr(bias, N),
                            N, Kp, group};
  const float* res = optional_ptr(residual, M * N);
  float* out = y.data_ptr<float>();
  over_blocks(blocks, [&](int64_t nb0, int64_t nb1) { impl::linear_int4(q.rows, M, w, nb0, nb1, res, out); });
  return y;
}

// RMSNorm per row: y = w * (x * 1/sqrt(mean(x^2) + eps)), as Llama and Qwen2 compute it.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == torch::kFloat32, "rms_norm takes [M, K] float32");
  TORCH_CHECK(weight.numel() == x.size(1), "rms_norm's weight has ", weight.numel(), " values for ", x.size(1));
  const int64_t M = x.size(0), K = x.size(1);
  auto y = torch::empty_like(x);
  const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) { impl::rms_norm(xp, wp, float(eps), m0, m1, K, yp); });
  return y;
}

// gate_up [M, 2I] -> silu(gate) * up [M, I], silu(g) = g / (1 + exp(-g)).
torch::Tensor silu_mul(const torch::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.size(1) % 2 == 0, "silu_mul takes [M, 2I]");
  const int64_t M = gate_up.size(0), I = gate_up.size(1) / 2;
  auto y = torch::empty({M, I}, gate_up.options());
  const float* g = gate_up.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, M, 1, [&](int64_t m0, int64_t m1) { impl::silu_mul(g, m0, m1, I, yp); });
  return y;
}

// Causal attention of a block at positions start .. start+M-1 over a layer's cache, each (row, head) computed alone.
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
  TORCH_CHECK(heads % kv_heads == 0, "query heads must be a multiple of key-value heads");
  const float *src = qkv.data_ptr<float>(), *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float *kc = cache_k.data_ptr<float>(), *vc = cache_v.data_ptr<float>();
  auto rotated_q = torch::empty({M, heads * D}, qkv.options());
  float* rq = rotated_q.data_ptr<float>();
  at::parallel_for(0, M, 1, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const int64_t p = start + m;
      const float* row = src + m * width;
      for (int64_t h = 0; h < heads; ++h)
        specbench::rope(row + h * D, cp + p * D, sp + p * D, rq + (m * heads + h) * D, D);
      for (int64_t h = 0; h < kv_heads; ++h) {
        specbench::rope(row + (heads + h) * D, cp + p * D, sp + p * D, kc + (p * kv_heads + h) * D, D);
        std::copy_n(row + (heads + kv_heads + h) * D, D, vc + (p * kv_heads + h) * D);
      }
    }
  });
  auto out = torch::empty({M, heads * D}, qkv.options());
  const specbench::Attention a{rq, kc, vc, out.data_ptr<float>(), M, start, heads, kv_heads, D, float(scaling)};
  // Tasks dealt round-robin: a prefill's later rows attend to more keys, so contiguous ranges would leave the thread
  // with the first rows idle for most of the call. Task t is row tile t / kv_heads, key-value head t % kv_heads.
  const int64_t tasks = specbench::attention_tasks(a), threads = std::min<int64_t>(at::get_num_threads(), tasks);
  at::parallel_for(0, threads, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t t = i; t < tasks; t += threads) impl::attention(a, t, t + 1);
  });
  return out;
}

namespace {

// One packed Linear as pack.py's PackedLinear holds it: group 0 is int8 with a scale per output column, else int4 in
// groups of `group` with fp16 scales.
struct Weights {
  torch::Tensor weight, scale;
  c10::optional<torch::Tensor> bias;
  int64_t N, K, group;
};
using WeightsArgs = std::tuple<torch::Tensor, torch::Tensor, c10::optional<torch::Tensor>, int64_t, int64_t, int64_t>;

// The decoder's layers in one call (specdec/backends/packed.py's docstring gives the forward): the same functions as
// the Python loop over the layers called one by one, in the same order on the same rows, so the same bits, without a
// Python call, its argument conversions and its tensors between each (28 layers x 8 calls a forward: 0.5-1.8 ms a
// forward of the 1.5B and the 0.5B, 1-2 %, measured against the Python loop 2026-11-30, docs/runtimes.md). It holds
// references to the packed weights, nothing it changes, so several threads may run it at once; it runs without the GIL.
class Decoder {
 public:
  Decoder(torch::Tensor cos, torch::Tensor sin, int64_t heads, int64_t kv_heads, double scaling, double eps)
      : cos_(std::move(cos)), sin_(std::move(sin)), heads_(heads), kv_heads_(kv_heads), scaling_(scaling), eps_(eps) {}

  void add_layer(torch::Tensor input_norm, torch::Tensor post_norm, const WeightsArgs& qkv, const WeightsArgs& o,
                 const WeightsArgs& gate_up, const WeightsArgs& down) {
    layers_.push_back(Layer{std::move(input_norm), std::move(post_norm), unpack(qkv), unpack(o), unpack(gate_up),
                            unpack(down)});
  }

  // x [R, hidden]: the blocks of several sequences, one after the other (`sizes` rows each), each at positions
  // lengths[s].. of its cache caches[s] [layers, 2, capacity, kv_heads, head_dim], where their keys and values are
  // written. Returns the final layer's output of the rows `rows` (int64 indices into x, increasing) only: past the
  // last layer's attention a row's o, norm and MLP are its own. No rows: every cache is written, [0, hidden] back.
  // The MLP runs `slab` rows a pass, gate_up written into `workspace` [>= min(R, slab), 2 intermediate].
  torch::Tensor forward(torch::Tensor x, const std::vector<torch::Tensor>& caches, const std::vector<int64_t>& lengths,
                        const std::vector<int64_t>& sizes, const torch::Tensor& rows, int64_t slab,
                        const torch::Tensor& workspace) const {
    TORCH_CHECK(caches.size() == lengths.size() && caches.size() == sizes.size() && !caches.empty(),
                "one cache, length and size a sequence");
    int64_t total = 0;
    for (int64_t n : sizes) total += n;
    TORCH_CHECK(x.dim() == 2 && x.size(0) == total, "x holds ", x.size(0), " rows, the blocks ", total);
    TORCH_CHECK(rows.scalar_type() == torch::kLong && rows.dim() == 1, "rows must be int64 indices");
    TORCH_CHECK(slab >= 1, "the MLP takes at least one row a pass");
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& layer = layers_[i];
      const auto qkv = linear(layer.qkv, rms_norm(x, layer.input_norm, eps_));
      std::vector<torch::Tensor> parts;
      int64_t start = 0;
      for (size_t s = 0; s < caches.size(); ++s) {
        const auto kv = caches[s].select(0, int64_t(i));
        parts.push_back(attention(qkv.narrow(0, start, sizes[s]), kv.select(0, 0), kv.select(0, 1), lengths[s], cos_,
                                  sin_, heads_, kv_heads_, scaling_));
        start += sizes[s];
      }
      auto attended = parts.size() == 1 ? parts[0] : torch::cat(parts);
      if (i + 1 == layers_.size() && rows.numel() < x.size(0)) {
        if (rows.numel() == 0) return x.narrow(0, 0, 0);  // every cache written; no row asked for
        attended = attended.index_select(0, rows).contiguous();
        x = x.index_select(0, rows).contiguous();
      }
      x = linear(layer.o, attended, x);
      x = mlp(x, layer, slab, workspace);
    }
    return x;
  }

 private:
  struct Layer {
    torch::Tensor input_norm, post_norm;
    Weights qkv, o, gate_up, down;
  };

  static Weights unpack(const WeightsArgs& a) {
    return Weights{std::get<0>(a), std::get<1>(a), std::get<2>(a), std::get<3>(a), std::get<4>(a), std::get<5>(a)};
  }

  static torch::Tensor linear(const Weights& w, const torch::Tensor& x,
                              const c10::optional<torch::Tensor>& residual = c10::nullopt,
                              const c10::optional<torch::Tensor>& out = c10::nullopt) {
    return w.group ? linear_int4(x, w.weight, w.scale, w.bias, residual, w.N, w.K, w.group, out)
                   : linear_int8(x, w.weight, w.scale, w.bias, residual, w.N, w.K, out);
  }

  // x + down(silu(gate) * up)(rms_norm(x)), `slab` rows a pass (every row is its own: the slabs change no bit).
  torch::Tensor mlp(const torch::Tensor& x, const Layer& layer, int64_t slab, const torch::Tensor& workspace) const {
    const auto normed = rms_norm(x, layer.post_norm, eps_);
    const int64_t R = x.size(0);
    TORCH_CHECK(workspace.dim() == 2 && workspace.size(0) >= std::min(R, slab) && workspace.size(1) == layer.gate_up.N,
                "the gate_up workspace must hold [", std::min(R, slab), ", ", layer.gate_up.N, "]");
    std::vector<torch::Tensor> parts;
    for (int64_t r0 = 0; r0 < R; r0 += slab) {
      const int64_t n = std::min(R, r0 + slab) - r0;
      const auto gate_up = linear(layer.gate_up, normed.narrow(0, r0, n), c10::nullopt, workspace.narrow(0, 0, n));
      parts.push_back(linear(layer.down, silu_mul(gate_up), x.narrow(0, r0, n)));
    }
    return parts.size() == 1 ? parts[0] : torch::cat(parts);
  }

  torch::Tensor cos_, sin_;
  int64_t heads_, kv_heads_;
  double scaling_, eps_;
  std::vector<Layer> layers_;
};

}  // namespace

// Reads `buffer` once with every thread of the pool, 64 bytes a load, and returns an XOR of what it read so the loads
// cannot be dropped: the calibration's memory read bandwidth. Each thread reads its share as `streams` interleaved
// streams, as a weight pass reads many rows at once: one stream a thread left memory idle (25.7 GB/s on the Xeon of
// 2026-11-28, below the 27.2 GB/s the int8 step streamed); 8 streams read 30.5-32 GB/s there, 64 only 23.7. Which
// count is fastest depends on the processor's prefetchers, so the calibration tries several.
int64_t stream_read(const torch::Tensor& buffer, int64_t streams) {
  TORCH_CHECK(buffer.is_contiguous() && buffer.nbytes() % 64 == 0, "stream_read takes a contiguous multiple of 64 bytes");
  TORCH_CHECK(streams >= 1, "stream_read reads at least one stream a thread");
  const char* base = static_cast<const char*>(buffer.data_ptr());
  const int64_t lines = buffer.nbytes() / 64, threads = at::get_num_threads();
  std::vector<int64_t> partial(threads, 0);
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      partial[t] ^= impl::stream_read(base, lines * t / threads, lines * (t + 1) / threads, streams);
  });
  int64_t out = 0;
  for (int64_t v : partial) out ^= v;
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("path") = impl::NAME;
  m.def("stream_read", &stream_read, "read a buffer with every thread, in `streams` streams each (memory bandwidth)",
        py::arg("buffer"), py::arg("streams"));
  m.def("linear_int8", &linear_int8, "x W^T with int8 weights and per-row int8 activations (exact int32 products)",
        py::arg("x"), py::arg("packed"), py::arg("col_scale"), py::arg("bias"), py::arg("residual"), py::arg("N"),
        py::arg("K"), py::arg("out") = py::none());
  m.def("linear_int4", &linear_int4, "x W^T with int4 weights in groups and per-row int8 activations",
        py::arg("x"), py::arg("packed"), py::arg("group_scale"), py::arg("bias"), py::arg("residual"), py::arg("N"),
        py::arg("K"), py::arg("group"), py::arg("out") = py::none());
  m.def("rms_norm", &rms_norm, "RMSNorm per row");
  m.def("silu_mul", &silu_mul, "silu(gate) * up");
  m.def("attention", &attention, "causal attention of a block over a layer's cache, each (row, head) computed alone");
  // module_local: each path's module is loaded beside the others in one process (the tests compare them), and pybind's
  // registry of types is otherwise shared by every module.
  py::class_<Decoder>(m, "Decoder", py::module_local(),
                      "the decoder's layers in one call, as the Python loop over them computes them")
      .def(py::init<torch::Tensor, torch::Tensor, int64_t, int64_t, double, double>(), py::arg("cos"), py::arg("sin"),
           py::arg("heads"), py::arg("kv_heads"), py::arg("scaling"), py::arg("eps"))
      .def("add_layer", &Decoder::add_layer, "a layer's norms and its packed Linears, each (weight, scale, bias, N, K, "
           "group; 0 for int8)", py::arg("input_norm"), py::arg("post_norm"), py::arg("qkv"), py::arg("o"),
           py::arg("gate_up"), py::arg("down"))
      .def("forward", &Decoder::forward, "the rows through every layer, their keys and values cached", py::arg("x"),
           py::arg("caches"), py::arg("lengths"), py::arg("sizes"), py::arg("rows"), py::arg("slab"),
           py::arg("workspace"), py::call_guard<py::gil_scoped_release>());
}
