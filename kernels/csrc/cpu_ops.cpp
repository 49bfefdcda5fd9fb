// CPU kernels of a decode step, as torch ops in the ``omniduplex_cpu`` namespace (built by kernels/cpu_ops.py).
//
// What they replace: the Python glue between GEMMs of a decode step (paged-attention gather + SDPA, the
// paged KV write, the MoE dispatch and the packed-linear wrapper) cost more than the GEMMs on a CPU (tens of
// small ATen calls per layer, each a few microseconds). vLLM's CPU backend has C++ kernels for the same
// work (csrc/cpu/attention.cpp, the sgl-kernel derived fused MoE); these are ours.
//
// Layouts are the contract of kernels/paged_attention_ref.py: caches [num_blocks, block_size, Hkv, D],
// block_tables int32 [S, max_blocks], seq_lens int32 [S] (including this step's token), GQA head h reads
// KV head h / (Hq / Hkv).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

// ---------------------------------------------------------------- paged decode attention

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kMaxVecs = 16;  // head_dim up to 16 vectors (256 with AVX-512)

// Vec::size() consecutive elements as fp32
template <typename scalar_t>
inline Vec load_float(const scalar_t* p) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    return Vec::loadu(p);
  } else {
    Vec out;
    at::vec::load_to_float<scalar_t>(p, out);
    return out;
  }
}

template <typename scalar_t>
inline void store_from_float(scalar_t* p, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<scalar_t>(src[i]);
}

// One query token per sequence. The G query heads of a KV head's group share each K/V row, loaded as fp32 vectors once (at::vec::Vectorized: AVX-512 / AVX2 as the build's CPU has). Two
// passes over the sequence (scores, then the weighted sum of V), fp32 accumulation (as at::opmath_type
// does for bf16/fp16 in ATen's SDPA). For the usual head sizes NV = D / Vec::size() is a template
// parameter, so a row stays in registers.
template <typename scalar_t, int64_t kNV>
void decode_attention_kernel(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const at::Tensor& block_tables, const at::Tensor& seq_lens, at::Tensor& out,
                             double scale, int64_t max_len) {
  constexpr int64_t W = Vec::size();
  const int64_t NV = kNV > 0 ? kNV : q.size(2) / W, D = NV * W;  // kNV = 0: any width, decided at run time
  const int64_t S = q.size(0), Hq = q.size(1);
  const int64_t num_blocks = k_cache.size(0), BS = k_cache.size(1), Hkv = k_cache.size(2);
  const int64_t G = Hq / Hkv, MB = block_tables.size(1);
  const scalar_t* qp = q.data_ptr<scalar_t>();
  const scalar_t* kc = k_cache.data_ptr<scalar_t>();
  const scalar_t* vc = v_cache.data_ptr<scalar_t>();
  const int32_t* bt = block_tables.data_ptr<int32_t>();
  const int32_t* sl = seq_lens.data_ptr<int32_t>();
  scalar_t* op = out.data_ptr<scalar_t>();
  const Vec vscale(static_cast<float>(scale));
  // Work item = (sequence, HP KV heads). With enough sequences for every thread an item takes all of a
  // sequence's heads: each cached row is then read whole and in order (a block of 16 rows is one contiguous
  // run of memory, which the hardware prefetcher streams); with few sequences, one head per item so that
  // every thread has work.
  const int64_t HP = S >= 2 * at::get_num_threads() ? Hkv : 1, QH = HP * G;
  // fn(position, head offset in [0, HP), the row as fp32 vectors) for every cached row of sequence s, heads
  // h0 .. h0 + HP - 1, in position order
  auto for_each_row = [&](const scalar_t* cache, int64_t s, int64_t len, int64_t h0, auto&& fn) {
    for (int64_t b0 = 0; b0 < len; b0 += BS) {
      const int64_t blk = bt[s * MB + b0 / BS];
      TORCH_CHECK(blk >= 0 && blk < num_blocks, "block_tables[", s, "] holds block ", blk, " of ", num_blocks);
      for (int64_t r = 0; r < std::min(BS, len - b0); ++r) {
        const scalar_t* row = cache + ((blk * BS + r) * Hkv + h0) * D;
        for (int64_t hh = 0; hh < HP; ++hh) {
          Vec v[kNV > 0 ? kNV : kMaxVecs];
          for (int64_t j = 0; j < NV; ++j) v[j] = load_float(row + hh * D + j * W);
          fn(b0 + r, hh, v);
        }
      }
    }
  };
  at::parallel_for(0, S * (Hkv / HP), 1, [&](int64_t begin, int64_t end) {
    std::vector<Vec> qv(QH * NV), acc(QH * NV);
    std::vector<float> scores(QH * max_len + W), outf(D), denom(QH);
    for (int64_t w = begin; w < end; ++w) {
      const int64_t s = w / (Hkv / HP), h0 = (w % (Hkv / HP)) * HP, len = sl[s];
      const scalar_t* qs = qp + (s * Hq + h0 * G) * D;  // query heads h0*G .. (h0+HP)*G - 1
      for (int64_t i = 0; i < QH * NV; ++i) qv[i] = load_float(qs + i * W) * vscale;
      for_each_row(kc, s, len, h0, [&](int64_t p, int64_t hh, const Vec* kr) {
        for (int64_t g = hh * G; g < (hh + 1) * G; ++g) {
          Vec a = qv[g * NV] * kr[0];
          for (int64_t j = 1; j < NV; ++j) a = at::vec::fmadd(qv[g * NV + j], kr[j], a);
          scores[g * len + p] = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, a);
        }
      });
      for (int64_t g = 0; g < QH; ++g) {
        float* sg = scores.data() + g * len;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t p = 0; p < len; ++p) m = std::max(m, sg[p]);
        const Vec vm(m);
        Vec vsum(0.f);
        int64_t p = 0;
        for (; p + W <= len; p += W) {
          const Vec e = (Vec::loadu(sg + p) - vm).exp_u20();
          e.store(sg + p);
          vsum = vsum + e;
        }
        float sum = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, vsum);
        for (; p < len; ++p) {
          sg[p] = std::exp(sg[p] - m);
          sum += sg[p];
        }
        denom[g] = sum;
      }
      for (auto& a : acc) a = Vec(0.f);
      for_each_row(vc, s, len, h0, [&](int64_t p, int64_t hh, const Vec* vr) {
        for (int64_t g = hh * G; g < (hh + 1) * G; ++g) {
          const Vec wgt(scores[g * len + p]);
          for (int64_t j = 0; j < NV; ++j) acc[g * NV + j] = at::vec::fmadd(wgt, vr[j], acc[g * NV + j]);
        }
      });
      scalar_t* os = op + (s * Hq + h0 * G) * D;
      for (int64_t g = 0; g < QH; ++g) {
        const Vec inv(1.f / denom[g]);
        for (int64_t j = 0; j < NV; ++j) (acc[g * NV + j] * inv).store(outf.data() + j * W);
        store_from_float(os + g * D, outf.data(), D);
      }
    }
  });
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale) {
  TORCH_CHECK(q.device().is_cpu() && q.dim() == 3, "q must be a CPU tensor [S, Hq, D]");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(), "caches must be [NB, BS, Hkv, D] alike");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(k_cache.scalar_type() == q.scalar_type() && v_cache.scalar_type() == q.scalar_type(),
              "q and caches must share a dtype");
  TORCH_CHECK(q.size(2) == k_cache.size(3) && q.size(1) % k_cache.size(2) == 0, "head shapes do not match");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt,
              "block_tables and seq_lens must be int32");
  TORCH_CHECK(block_tables.size(0) == q.size(0) && seq_lens.size(0) == q.size(0), "one query per sequence");
  at::Tensor qc = q.contiguous(), bt = block_tables.contiguous(), sl = seq_lens.contiguous();
  at::Tensor out = at::empty_like(qc);
  const int32_t* lens = sl.data_ptr<int32_t>();
  const int64_t capacity = bt.size(1) * k_cache.size(1);
  int64_t max_len = 0;
  for (int64_t s = 0; s < sl.size(0); ++s) {
    TORCH_CHECK(lens[s] >= 1 && lens[s] <= capacity, "seq_lens[", s, "] = ", lens[s], " outside [1, ", capacity, "]");
    max_len = std::max<int64_t>(max_len, lens[s]);
  }
  const int64_t W = Vec::size(), D = q.size(2);
  TORCH_CHECK(D % W == 0 && D / W <= kMaxVecs, "head_dim ", D, " must be a multiple of ", W, ", at most ",
              kMaxVecs * W);
  auto by_width = [&](auto zero) {
    using scalar_t = decltype(zero);
    auto run = [&](auto nv) {
      decode_attention_kernel<scalar_t, decltype(nv)::value>(qc, k_cache, v_cache, bt, sl, out, scale, max_len);
    };
    switch (D / W) {
      case 1: run(std::integral_constant<int64_t, 1>{}); break;
      case 2: run(std::integral_constant<int64_t, 2>{}); break;
      case 4: run(std::integral_constant<int64_t, 4>{}); break;
      case 8: run(std::integral_constant<int64_t, 8>{}); break;
      default: run(std::integral_constant<int64_t, 0>{});
    }
  };
  switch (q.scalar_type()) {
    case at::kFloat: by_width(float{}); break;
    case at::kBFloat16: by_width(c10::BFloat16{}); break;
    case at::kHalf: by_width(c10::Half{}); break;
    default: TORCH_CHECK(false, "paged_decode_attention: dtype ", q.scalar_type(), " not supported");
  }
  return out;
}

// ---------------------------------------------------------------- paged KV write

void write_kv_cache(at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& slot_mapping) {
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(), "caches must be [NB, BS, Hkv, D] alike");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  const int64_t T = slot_mapping.size(0), row = k_cache.size(2) * k_cache.size(3);
  const int64_t slots = k_cache.size(0) * k_cache.size(1);
  TORCH_CHECK(k.dim() == 3 && k.size(0) == T && k.size(1) * k.size(2) == row && k.sizes() == v.sizes(),
              "k/v must be [T, Hkv, D] matching the cache");
  at::Tensor kc = k.to(k_cache.scalar_type()).contiguous(), vc = v.to(v_cache.scalar_type()).contiguous();
  at::Tensor sm = slot_mapping.to(at::kLong).contiguous();
  const int64_t* sp = sm.data_ptr<int64_t>();
  const int64_t bytes = row * k_cache.element_size();
  char* kd = static_cast<char*>(k_cache.data_ptr());
  char* vd = static_cast<char*>(v_cache.data_ptr());
  const char* ks = static_cast<const char*>(kc.data_ptr());
  const char* vs = static_cast<const char*>(vc.data_ptr());
  for (int64_t t = 0; t < T; ++t) {  // all checked before any write: a bad batch leaves the cache as it was
    TORCH_CHECK(sp[t] >= -1 && sp[t] < slots, "slot_mapping[", t, "] = ", sp[t], " outside [0, ", slots,
                ") and not -1 (skip)");
  }
  for (int64_t t = 0; t < T; ++t) {
    if (sp[t] < 0) continue;  // -1: a padding row of a bucketed batch writes nothing (vLLM's PAD_SLOT_ID)
    std::memcpy(kd + sp[t] * bytes, ks + t * bytes, bytes);
    std::memcpy(vd + sp[t] * bytes, vs + t * bytes, bytes);
  }
}

// ---------------------------------------------------------------- packed (oneDNN) linear

// Weights reordered once for oneDNN (mkldnn::_reorder_linear_weight); compiled graphs refer to them by key.
std::mutex registry_mutex;
std::vector<at::Tensor> packed_registry;

int64_t register_packed(const at::Tensor& packed) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  packed_registry.push_back(packed);
  return static_cast<int64_t>(packed_registry.size()) - 1;
}

const at::Tensor& packed_at(int64_t key) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  TORCH_CHECK(key >= 0 && key < static_cast<int64_t>(packed_registry.size()), "no packed weight ", key);
  return packed_registry[key];
}

// Rows a GEMM of m rows is padded to (kernels/cpu_linear.py bucket_rows): oneDNN JIT-builds a kernel per row
// count, so counts are bucketed to keep the kernels built bounded.
int64_t bucket_rows(int64_t m) {
  if (m <= 8) return m;
  const int64_t step = m <= 64 ? 8 : m <= 1024 ? 64 : 256;
  return (m + step - 1) / step * step;
}

at::Tensor linear_pointwise(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  std::vector<c10::IValue> stack;
  stack.reserve(6);
  stack.emplace_back(x);
  stack.emplace_back(w);
  stack.emplace_back(bias.has_value() ? c10::IValue(*bias) : c10::IValue());
  stack.emplace_back(std::string("none"));
  stack.emplace_back(c10::List<c10::optional<at::Scalar>>());
  stack.emplace_back(c10::IValue());
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

// x [m, in] bf16 @ packed weight -> [m, out]; rows padded to bucket_rows inside.
at::Tensor packed_mm(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias) {
  const int64_t m = x.size(0), b = bucket_rows(m);
  if (b == m) return linear_pointwise(x.contiguous(), packed, bias);
  at::Tensor padded = at::zeros({b, x.size(1)}, x.options());
  padded.narrow(0, 0, m).copy_(x);
  return linear_pointwise(padded, packed, bias).narrow(0, 0, m).contiguous();
}

at::Tensor packed_linear(const at::Tensor& x, int64_t key, const c10::optional<at::Tensor>& bias,
                         int64_t out_features) {
  at::Tensor y = packed_mm(x, packed_at(key), bias);
  TORCH_CHECK(y.size(1) == out_features, "packed weight ", key, " gives ", y.size(1), " features, not ", out_features);
  return y;
}

// ---------------------------------------------------------------- MoE experts

// acc[token[r]] += w[r] * y[r] over the rows r of one expert
template <typename scalar_t>
void scatter_weighted(const at::Tensor& y, const int64_t* tokens, const float* w, float* acc, int64_t H) {
  const scalar_t* yp = y.data_ptr<scalar_t>();
  for (int64_t r = 0; r < y.size(0); ++r) {
    float* dst = acc + tokens[r] * H;
    const float wr = w[r];
    const scalar_t* src = yp + r * H;
#pragma omp simd
    for (int64_t d = 0; d < H; ++d) dst[d] += wr * static_cast<float>(src[d]);
  }
}

// Weighted sum of each token's top-k SwiGLU experts (Qwen3-MoE): the (token, expert) pairs are grouped by
// expert (a counting sort on the host, free on a CPU), each expert runs two GEMMs on its rows only, and the
// outputs are summed per token in fp32. packed_key >= 0: the experts' oneDNN-packed weights are registry
// entries [key, key + E) (gate_up) and [key + E, key + 2E) (down).
at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& gate_up_proj, const at::Tensor& down_proj,
                       const at::Tensor& weights, const at::Tensor& ids, int64_t packed_key) {
  TORCH_CHECK(x.dim() == 2 && ids.dim() == 2 && weights.sizes() == ids.sizes() && ids.size(0) == x.size(0),
              "x [T, H], weights and ids [T, k] expected");
  const int64_t T = x.size(0), K = ids.size(1), H = x.size(1), E = gate_up_proj.size(0);
  const int64_t I = down_proj.size(2);
  TORCH_CHECK(gate_up_proj.size(1) == 2 * I && gate_up_proj.size(2) == H && down_proj.size(1) == H,
              "expert weight shapes do not match x");
  at::Tensor idc = ids.to(at::kLong).contiguous(), xc = x.contiguous();
  const int64_t* ip = idc.data_ptr<int64_t>();
  std::vector<int64_t> counts(E + 1, 0);
  for (int64_t j = 0; j < T * K; ++j) {
    TORCH_CHECK(ip[j] >= 0 && ip[j] < E, "expert id ", ip[j], " outside [0, ", E, ")");
    ++counts[ip[j] + 1];
  }
  for (int64_t e = 0; e < E; ++e) counts[e + 1] += counts[e];  // exclusive prefix: group starts
  // pair j = (token j / K, its (j % K)-th expert) goes to row fill[expert]++ of its expert's group
  at::Tensor tokens = at::empty({T * K}, idc.options());
  std::vector<float> pair_w(T * K);
  {
    at::Tensor wf = weights.to(at::kFloat).contiguous();
    const float* wsrc = wf.data_ptr<float>();
    std::vector<int64_t> fill(counts.begin(), counts.end() - 1);
    int64_t* tp = tokens.data_ptr<int64_t>();
    for (int64_t j = 0; j < T * K; ++j) {
      const int64_t row = fill[ip[j]]++;
      tp[row] = j / K;
      pair_w[row] = wsrc[j];
    }
  }
  at::Tensor xs = xc.index_select(0, tokens);  // [T*K, H] rows grouped by expert
  at::Tensor acc = at::zeros({T, H}, x.options().dtype(at::kFloat));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t start = counts[e], n = counts[e + 1] - start;
    if (n == 0) continue;
    at::Tensor rows = xs.narrow(0, start, n);
    at::Tensor gu = packed_key >= 0 ? packed_mm(rows, packed_at(packed_key + e), c10::nullopt)
                                    : at::linear(rows, gate_up_proj[e]);
    // silu(gate) * up with ATen's vectorised kernels (a scalar exp per element cost more than the GEMMs)
    at::Tensor h = at::silu(gu.narrow(1, 0, I)).mul_(gu.narrow(1, I, I));
    at::Tensor y = packed_key >= 0 ? packed_mm(h, packed_at(packed_key + E + e), c10::nullopt) : at::linear(h, down_proj[e]);
    y = y.contiguous();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "moe_scatter", [&] {
      scatter_weighted<scalar_t>(y, tokens.data_ptr<int64_t>() + start, pair_w.data() + start,
                                 acc.data_ptr<float>(), H);
    });
  }
  return acc.to(x.scalar_type());
}


// ---------------------------------------------------------------- decoder-layer glue: RMSNorm, RoPE, SwiGLU
//
// Between the GEMMs of a decode step the layers ran ~100 small ATen calls each (RMSNorm as pow/mean/rsqrt/
// mul/casts, rotate-half RoPE as slices/neg/cat/mul/add, SiLU·up): at a few microseconds per call, ~1 ms a
// layer, more than the quantized GEMMs of a small model. vLLM's CPU backend has the same fused kernels
// (rms_norm, fused_add_rms_norm, rotary_embedding, silu_and_mul in csrc/cpu/); these are ours. The math is
// fp32; the roundings to the activation dtype are where the torch paths of models/layers.py make them.

// out[r] = w * to_dtype(x[r] / sqrt(mean(x[r]^2) + eps)) for each row r of x [R, H] (rows contiguous)
template <typename scalar_t>
void rms_norm_rows(const scalar_t* x, const scalar_t* w, scalar_t* out, int64_t R, int64_t H, float eps) {
  constexpr int64_t W = Vec::size();
  for (int64_t r = 0; r < R; ++r) {
    const scalar_t* xr = x + r * H;
    scalar_t* orow = out + r * H;
    float ss = 0.f;
    int64_t i = 0;
    if constexpr (!std::is_same_v<scalar_t, double>) {
      Vec acc0(0.f), acc1(0.f);
      for (; i + 2 * W <= H; i += 2 * W) {
        Vec a = load_float(xr + i), b = load_float(xr + i + W);
        acc0 = at::vec::fmadd(a, a, acc0);
        acc1 = at::vec::fmadd(b, b, acc1);
      }
      ss = at::vec::vec_reduce_all<float>([](Vec& u, Vec& v) { return u + v; }, acc0 + acc1);
    }
    for (; i < H; ++i) ss += static_cast<float>(xr[i]) * static_cast<float>(xr[i]);
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(H) + eps);
    for (int64_t j = 0; j < H; ++j) {
      const scalar_t normed = static_cast<scalar_t>(static_cast<float>(xr[j]) * inv);
      orow[j] = static_cast<scalar_t>(static_cast<float>(w[j]) * static_cast<float>(normed));
    }
  }
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const int64_t H = x.size(-1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == H, "rms_norm: weight ", weight.sizes(), " for rows of ", H);
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "rms_norm: weight dtype ", weight.scalar_type(),
              " != x dtype ", x.scalar_type());
  at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor out = at::empty_like(xc);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    rms_norm_rows<scalar_t>(xc.data_ptr<scalar_t>(), wc.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                            xc.numel() / std::max<int64_t>(H, 1), H, static_cast<float>(eps));
  });
  return out;
}

// (x + delta, rms_norm(x + delta)): a layer's residual add and the next norm in one pass
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.sizes() == delta.sizes() && x.scalar_type() == delta.scalar_type(), "add_rms_norm: x ",
              x.sizes(), " ", x.scalar_type(), " and delta ", delta.sizes(), " ", delta.scalar_type(), " differ");
  at::Tensor sum = at::add(x, delta);
  return {sum, rms_norm(sum, weight, eps)};
}

// rotate-half RoPE in place on x [T, H, D] (last dim contiguous): x * cos + rotate_half(x) * sin, each product
// and the sum rounded to x's dtype as the torch path does; cos / sin fp32 [T, D]
template <typename scalar_t>
__attribute__((optimize("fp-contract=off")))  // no FMA: the torch path rounds each product before the sum
void rotary_rows(at::Tensor& x, const float* cos, const float* sin) {
  const int64_t T = x.size(0), H = x.size(1), D = x.size(2), half = D / 2;
  const int64_t s0 = x.stride(0), s1 = x.stride(1);
  scalar_t* base = x.data_ptr<scalar_t>();
  for (int64_t t = 0; t < T; ++t) {
    const float* c = cos + t * D;
    const float* s = sin + t * D;
    for (int64_t h = 0; h < H; ++h) {
      scalar_t* p = base + t * s0 + h * s1;
      for (int64_t i = 0; i < half; ++i) {
        const scalar_t x1 = p[i], x2 = p[i + half];
        const scalar_t c1 = static_cast<scalar_t>(c[i]), c2 = static_cast<scalar_t>(c[i + half]);
        const scalar_t n1 = static_cast<scalar_t>(s[i]), n2 = static_cast<scalar_t>(s[i + half]);
        const scalar_t a1 = x1 * c1, b1 = static_cast<scalar_t>(-x2) * n1;
        const scalar_t a2 = x2 * c2, b2 = x1 * n2;
        p[i] = a1 + b1;
        p[i + half] = a2 + b2;
      }
    }
  }
}

void rotary_(at::Tensor q, at::Tensor k, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat, "rotary_: cos/sin must be fp32");
  at::Tensor cc = cos.contiguous(), sc = sin.contiguous();
  for (at::Tensor* x : {&q, &k}) {
    TORCH_CHECK(x->dim() == 3 && x->stride(2) == 1 && x->size(2) % 2 == 0, "rotary_: x ", x->sizes(),
                " must be [T, H, D] with D even and contiguous");
    TORCH_CHECK(cc.size(0) == x->size(0) && cc.size(1) == x->size(2) && sc.sizes() == cc.sizes(),
                "rotary_: cos/sin ", cc.sizes(), " for x ", x->sizes());
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x->scalar_type(), "rotary_", [&] {
      rotary_rows<scalar_t>(*x, cc.data_ptr<float>(), sc.data_ptr<float>());
    });
  }
}

// x [T, 2I] -> silu(x[:, :I]) * x[:, I:]; fp32 rows as ATen's vectorised SiLU computes them (x / (1 + exp(-x))
// on whole vectors, the scalar formula on the tail), other dtypes through ATen
at::Tensor silu_and_mul(const at::Tensor& x) {
  const int64_t I = x.size(-1) / 2;
  TORCH_CHECK(x.size(-1) == 2 * I, "silu_and_mul: odd last dim ", x.size(-1));
  if (x.scalar_type() != at::kFloat) return at::silu(x.narrow(-1, 0, I)).mul_(x.narrow(-1, I, I));
  at::Tensor xc = x.contiguous();
  std::vector<int64_t> shape(xc.sizes().begin(), xc.sizes().end());
  shape.back() = I;
  at::Tensor out = at::empty(shape, xc.options());
  const int64_t R = I ? xc.numel() / (2 * I) : 0, W = Vec::size();
  const float* src = xc.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const Vec one(1.f);
  for (int64_t r = 0; r < R; ++r) {
    const float* g = src + r * 2 * I;
    const float* u = g + I;
    float* o = dst + r * I;
    int64_t i = 0;
    for (; i + W <= I; i += W) {
      const Vec gv = Vec::loadu(g + i);
      const Vec act = gv / (one + gv.neg().exp());
      (act * Vec::loadu(u + i)).store(o + i);
    }
    for (; i < I; ++i) o[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
  }
  return out;
}

// ---------------------------------------------------------------- one decode step of a quantized layer
//
// A decode step of a small quantized model (SmolLM2-135M: 30 layers of ~20 ms of GGUF-block GEMMs in all) ran
// ~30 ms of Python and ATen calls around its GEMMs. A layer registered here (its norms, GGUF blocks, biases
// and head shapes, once, from models/cascade/gguf_quantized.py) runs its whole decode step in one call:
// RMSNorm → qkv (omniduplex_quant::qmatmul, found through the dispatcher) → RoPE → KV write → paged decode
// attention → o_proj → residual + RMSNorm → gate_up → SiLU·up → down → residual. The same kernels as the
// per-op path of models/layers.py, in the same order, so the result is the same.

struct QuantProj {
  std::vector<at::Tensor> blocks;  // uint8 [rows, row_bytes] per group, in output-row order
  std::vector<int64_t> types;      // GGML type id per group
  c10::optional<at::Tensor> bias;  // fp32 [out] or none
  int64_t in_features = 0;
};

struct QuantLayer {
  at::Tensor ln1, ln2;
  double eps = 1e-6, scale = 1.0;
  QuantProj qkv, o, gate_up, down;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
};

std::mutex layer_mutex;
std::vector<std::shared_ptr<const QuantLayer>> layer_registry;

QuantProj make_proj(at::TensorList blocks, at::IntArrayRef types, const c10::optional<at::Tensor>& bias,
                    int64_t in_features, const char* name) {
  TORCH_CHECK(!blocks.empty() && blocks.size() == types.size(), name, ": ", blocks.size(), " block groups for ",
              types.size(), " types");
  QuantProj p;
  for (const at::Tensor& b : blocks) {
    TORCH_CHECK(b.scalar_type() == at::kByte && b.dim() == 2 && b.is_contiguous(), name,
                ": blocks must be contiguous uint8 [rows, row_bytes]");
    p.blocks.push_back(b);
  }
  p.types.assign(types.begin(), types.end());
  if (bias.has_value()) p.bias = bias->to(at::kFloat).contiguous();
  p.in_features = in_features;
  return p;
}

at::Tensor qmatmul_call(const at::Tensor& x, const at::Tensor& w, int64_t type, int64_t in_features) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("omniduplex_quant::qmatmul", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, int64_t)>();
  return op.call(x, w, type, in_features);
}

// x [T, in] -> [T, out] in x's dtype: as QuantLinear.forward (groups side by side, then the bias in fp32)
at::Tensor quant_proj(const QuantProj& p, const at::Tensor& x) {
  at::Tensor y;
  if (p.blocks.size() == 1) {
    y = qmatmul_call(x, p.blocks[0], p.types[0], p.in_features);
  } else {
    std::vector<at::Tensor> ys;
    for (size_t i = 0; i < p.blocks.size(); ++i) ys.push_back(qmatmul_call(x, p.blocks[i], p.types[i], p.in_features));
    y = at::cat(ys, -1);
  }
  if (p.bias.has_value()) y.add_(*p.bias);
  return y.scalar_type() == x.scalar_type() ? y : y.to(x.scalar_type());
}

int64_t register_quant_layer(const at::Tensor& ln1, const at::Tensor& ln2, double eps, at::TensorList qkv,
                             at::IntArrayRef qkv_types, const c10::optional<at::Tensor>& qkv_bias, at::TensorList o,
                             at::IntArrayRef o_types, const c10::optional<at::Tensor>& o_bias, at::TensorList gate_up,
                             at::IntArrayRef gate_up_types, at::TensorList down, at::IntArrayRef down_types,
                             int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double scale) {
  TORCH_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0 && head_dim > 0,
              "register_quant_layer: heads ", num_heads, "/", num_kv_heads, " of ", head_dim);
  const int64_t hidden = ln1.size(0), q_size = num_heads * head_dim;
  auto layer = std::make_shared<QuantLayer>();
  layer->ln1 = ln1.contiguous();
  layer->ln2 = ln2.contiguous();
  layer->eps = eps;
  layer->scale = scale;
  layer->qkv = make_proj(qkv, qkv_types, qkv_bias, hidden, "qkv");
  layer->o = make_proj(o, o_types, o_bias, q_size, "o_proj");
  layer->gate_up = make_proj(gate_up, gate_up_types, c10::nullopt, hidden, "gate_up");
  int64_t gu_rows = 0;
  for (const at::Tensor& b : layer->gate_up.blocks) gu_rows += b.size(0);
  layer->down = make_proj(down, down_types, c10::nullopt, gu_rows / 2, "down");
  layer->num_heads = num_heads;
  layer->num_kv_heads = num_kv_heads;
  layer->head_dim = head_dim;
  std::lock_guard<std::mutex> lock(layer_mutex);
  layer_registry.push_back(std::move(layer));
  return static_cast<int64_t>(layer_registry.size()) - 1;
}

// x [S, H]: one new token of each of S sequences (a decode-only batch) -> the layer's output [S, H]; writes the
// tokens' K/V at slot_mapping. cos / sin fp32 [S, D]; block_tables / seq_lens as paged_decode_attention.
at::Tensor quant_decode_layer(const at::Tensor& x, int64_t key, const at::Tensor& cos, const at::Tensor& sin,
                              at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& slot_mapping,
                              const at::Tensor& block_tables, const at::Tensor& seq_lens) {
  std::shared_ptr<const QuantLayer> layer;
  {
    std::lock_guard<std::mutex> lock(layer_mutex);
    TORCH_CHECK(key >= 0 && key < static_cast<int64_t>(layer_registry.size()), "no quantized layer ", key);
    layer = layer_registry[key];
  }
  const QuantLayer& L = *layer;
  TORCH_CHECK(x.dim() == 2 && x.size(1) == L.ln1.size(0), "quant_decode_layer: x ", x.sizes(), " for width ",
              L.ln1.size(0));
  const int64_t S = x.size(0), D = L.head_dim, q_size = L.num_heads * D, kv_size = L.num_kv_heads * D;
  at::Tensor qkv = quant_proj(L.qkv, rms_norm(x, L.ln1, L.eps));
  TORCH_CHECK(qkv.size(1) == q_size + 2 * kv_size, "qkv gives ", qkv.size(1), " features, not ", q_size + 2 * kv_size);
  at::Tensor q = qkv.narrow(1, 0, q_size).view({S, L.num_heads, D});
  at::Tensor k = qkv.narrow(1, q_size, kv_size).view({S, L.num_kv_heads, D});
  at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({S, L.num_kv_heads, D});
  rotary_(q, k, cos, sin);
  write_kv_cache(k_cache, v_cache, k, v, slot_mapping);
  at::Tensor attn = paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, L.scale);
  auto [h, normed] = add_rms_norm(x, quant_proj(L.o, attn.view({S, q_size})), L.ln2, L.eps);
  at::Tensor mlp = quant_proj(L.down, silu_and_mul(quant_proj(L.gate_up, normed)));
  return h.add_(mlp);
}

}  // namespace

TORCH_LIBRARY(omniduplex_cpu, m) {
  m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor seq_lens, float scale) -> Tensor");
  m.def("write_kv_cache(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, Tensor slot_mapping) -> ()");
  m.def("register_packed(Tensor packed) -> int");
  m.def("packed_linear(Tensor x, int key, Tensor? bias, int out_features) -> Tensor");
  m.def("moe_experts(Tensor x, Tensor gate_up_proj, Tensor down_proj, Tensor weights, Tensor ids, "
        "int packed_key) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor delta, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rotary_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin) -> ()");
  m.def("silu_and_mul(Tensor x) -> Tensor");
  m.def("register_quant_layer(Tensor ln1, Tensor ln2, float eps, Tensor[] qkv, int[] qkv_types, Tensor? qkv_bias, "
        "Tensor[] o, int[] o_types, Tensor? o_bias, Tensor[] gate_up, int[] gate_up_types, Tensor[] down, "
        "int[] down_types, int num_heads, int num_kv_heads, int head_dim, float scale) -> int");
  m.def("quant_decode_layer(Tensor x, int key, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "Tensor slot_mapping, Tensor block_tables, Tensor seq_lens) -> Tensor");
}

TORCH_LIBRARY_IMPL(omniduplex_cpu, CPU, m) {
  m.impl("paged_decode_attention", &paged_decode_attention);
  m.impl("write_kv_cache", &write_kv_cache);
  m.impl("packed_linear", &packed_linear);
  m.impl("moe_experts", &moe_experts);
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("rotary_", &rotary_);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("quant_decode_layer", &quant_decode_layer);
}

TORCH_LIBRARY_IMPL(omniduplex_cpu, CompositeExplicitAutograd, m) {
  m.impl("register_packed", &register_packed);
  m.impl("register_quant_layer", &register_quant_layer);
}
