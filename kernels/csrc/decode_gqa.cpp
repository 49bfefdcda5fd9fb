// The q_len = 1 decode-attention fast path: one work item per (sequence, KV head) over the G query heads of that
// KV head's GQA group, as a torch op in the ``omniduplex_cpu`` namespace (built with cpu_ops.cpp by
// kernels/cpu_ops.py; kernels/attention.py decides when it applies and falls back elsewhere).
//
// What it does differently from the generic ``paged_decode_attention`` of cpu_ops.cpp (the same contract:
// caches [num_blocks, 16, Hkv, D], block_tables int32 [S, max_blocks], seq_lens int32 [S]):
//
// - one pass over the cached blocks with an online softmax (Milakov & Gimelshein 2018; the decode form of
//   FlashAttention, Dao et al. 2022): a block's 16 K rows and then its 16 V rows are read back to back, no
//   per-sequence score buffer, no second walk over the block table;
// - the 16 dot products of a block and query head are reduced together (a transposed horizontal add: 16 lane
//   vectors -> one vector of 16 scores), where the generic kernel reduces every score on its own: the
//   reduction was most of the arithmetic of a head-dim-128 row;
// - the softmax of a block is one vector exp per query head (exp_u20, as the generic kernel uses);
// - G and D are template parameters (G in {1, 2, 4, 8}; D / vector width in {1, 2, 4, 8, 16}), so the group's
//   query vectors and accumulators are fixed-size arrays the compiler keeps in registers or L1.
//
// fp32 accumulation whatever the dtype of q and the caches (fp32, bf16, fp16), as the generic kernel.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kBlock = 16;  // rows per KV block: the engine's BLOCK_SIZE (models/forward_batch.py)

template <typename scalar_t>
inline Vec load_f32(const scalar_t* p) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    return Vec::loadu(p);
  } else {
    Vec out;
    at::vec::load_to_float<scalar_t>(p, out);
    return out;
  }
}

// out[r] = sum of the lanes of part[r], for r < kBlock (part: kBlock lane vectors of one query head)
inline void reduce_rows(const Vec* part, float* out) {
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
  // 8 ymm vectors -> one ymm of their 8 sums: two rounds of hadd, then the 128-bit halves added
  auto reduce8 = [](const __m256* v) {
    const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
  };
#endif
#if defined(CPU_CAPABILITY_AVX512)
  static_assert(Vec::size() == 16, "AVX-512 vectors hold 16 floats");
  __m256 halves[kBlock];
  for (int64_t r = 0; r < kBlock; ++r) {
    const __m512 z = part[r];
    halves[r] = _mm256_add_ps(_mm512_castps512_ps256(z),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(z), 1)));
  }
  _mm256_storeu_ps(out, reduce8(halves));
  _mm256_storeu_ps(out + 8, reduce8(halves + 8));
#elif defined(CPU_CAPABILITY_AVX2)
  static_assert(Vec::size() == 8, "AVX2 vectors hold 8 floats");
  __m256 v[kBlock];
  for (int64_t r = 0; r < kBlock; ++r) v[r] = part[r];
  _mm256_storeu_ps(out, reduce8(v));
  _mm256_storeu_ps(out + 8, reduce8(v + 8));
#else
  for (int64_t r = 0; r < kBlock; ++r) {
    out[r] = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, part[r]);
  }
#endif
}

// The rows of one KV head in one cache block as fp32: fp32 caches are read in place, bf16 / fp16 rows are
// converted once into `scratch` (then every query head of the group reads them from L1).
template <typename scalar_t, int64_t kNV>
inline const float* block_rows(const scalar_t* base, int64_t rows, int64_t stride, float* scratch,
                               int64_t& out_stride) {
  constexpr int64_t W = Vec::size(), D = kNV * W;
  if constexpr (std::is_same_v<scalar_t, float>) {
    out_stride = stride;
    return base;
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < kNV; ++j) load_f32(base + r * stride + j * W).store(scratch + r * D + j * W);
    }
    out_stride = D;
    return scratch;
  }
}

template <typename scalar_t, int64_t kNV, int64_t kG>
void gqa_decode_kernel(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                       const at::Tensor& block_tables, const at::Tensor& seq_lens, at::Tensor& out,
                       double scale) {
  constexpr int64_t W = Vec::size(), D = kNV * W;
  constexpr int64_t kScoreVecs = kBlock / W > 0 ? kBlock / W : 1;  // vectors holding one block's scores
  static_assert(kBlock % W == 0 || W % kBlock == 0, "block rows and vector width must nest");
  const int64_t S = q.size(0), Hq = q.size(1), Hkv = k_cache.size(2), num_blocks = k_cache.size(0);
  const int64_t MB = block_tables.size(1), row_stride = Hkv * D;
  const scalar_t* qp = q.data_ptr<scalar_t>();
  const scalar_t* kc = k_cache.data_ptr<scalar_t>();
  const scalar_t* vc = v_cache.data_ptr<scalar_t>();
  const int32_t* bt = block_tables.data_ptr<int32_t>();
  const int32_t* sl = seq_lens.data_ptr<int32_t>();
  scalar_t* op = out.data_ptr<scalar_t>();
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // Work item = (sequence, HP consecutive KV heads). With a sequence per thread or more, an item takes all of
  // a sequence's KV heads and walks its blocks once, every head of a block in turn: the block (16 rows x Hkv x D,
  // one contiguous run) is streamed from memory once. With fewer sequences, one KV head per item, so that every
  // thread has work. The arithmetic of a (sequence, KV head) is the same either way.
  const int64_t HP = S >= 2 * at::get_num_threads() ? Hkv : 1, items_per_seq = Hkv / HP;
  at::parallel_for(0, S * items_per_seq, 1, [&](int64_t begin, int64_t end) {
    // per item: the group's scaled queries and running (max, sum, weighted V) of each of its HP KV heads
    std::vector<float> qbuf(HP * kG * D), abuf(HP * kG * D), mbuf(HP * kG), lbuf(HP * kG);
    alignas(64) float kscratch[kBlock * D], vscratch[kBlock * D];
    alignas(64) float scores[kG][kScoreVecs * W];
    Vec part[kBlock];
    const Vec vscale(static_cast<float>(scale));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t s = item / items_per_seq, h0 = (item % items_per_seq) * HP, len = sl[s];
      for (int64_t i = 0; i < HP * kG; ++i) {  // query heads h0*G .. (h0+HP)*G - 1 are contiguous in q
        const scalar_t* qs = qp + (s * Hq + h0 * kG + i) * D;
        for (int64_t j = 0; j < kNV; ++j) {
          (load_f32(qs + j * W) * vscale).store(qbuf.data() + i * D + j * W);
          Vec(0.f).store(abuf.data() + i * D + j * W);
        }
        mbuf[i] = neg_inf;
        lbuf[i] = 0.f;
      }
      for (int64_t b0 = 0; b0 < len; b0 += kBlock) {
        const int64_t blk = bt[s * MB + b0 / kBlock], n = std::min(kBlock, len - b0);
        TORCH_CHECK(blk >= 0 && blk < num_blocks, "block_tables[", s, "] holds block ", blk, " of ", num_blocks);
        for (int64_t hh = 0; hh < HP; ++hh) {
          float* m = mbuf.data() + hh * kG;
          float* l = lbuf.data() + hh * kG;
          int64_t ks = 0, vs = 0;
          const float* kr =
              block_rows<scalar_t, kNV>(kc + blk * kBlock * row_stride + (h0 + hh) * D, n, row_stride, kscratch, ks);
          // scores: per query head, its query in registers against the block's rows (in L1), 16 lane vectors
          // reduced together
          for (int64_t g = 0; g < kG; ++g) {
            const float* qg = qbuf.data() + (hh * kG + g) * D;
            Vec qv[kNV];
            for (int64_t j = 0; j < kNV; ++j) qv[j] = Vec::loadu(qg + j * W);
            for (int64_t r = 0; r < n; ++r) {
              const float* k = kr + r * ks;
              Vec a0 = qv[0] * Vec::loadu(k), a1(0.f);
              for (int64_t j = 1; j < kNV; ++j) {
                if (j % 2) {
                  a1 = at::vec::fmadd(qv[j], Vec::loadu(k + j * W), a1);
                } else {
                  a0 = at::vec::fmadd(qv[j], Vec::loadu(k + j * W), a0);
                }
              }
              part[r] = a0 + a1;
            }
            for (int64_t r = n; r < kBlock; ++r) part[r] = Vec(0.f);
            reduce_rows(part, scores[g]);
            for (int64_t r = n; r < kScoreVecs * W; ++r) scores[g][r] = neg_inf;  // rows past the sequence
          }
          const float* vr =
              block_rows<scalar_t, kNV>(vc + blk * kBlock * row_stride + (h0 + hh) * D, n, row_stride, vscratch, vs);
          for (int64_t g = 0; g < kG; ++g) {
            // online softmax: the new running max, the rescale of what was accumulated, this block's weights
            Vec bmax = Vec::loadu(scores[g]);
            for (int64_t i = 1; i < kScoreVecs; ++i) bmax = at::vec::maximum(bmax, Vec::loadu(scores[g] + i * W));
            const float mnew = std::max(
                m[g], at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return at::vec::maximum(x, y); }, bmax));
            const float alpha = std::exp(m[g] - mnew);  // 0 on the first block (m = -inf)
            Vec sum(0.f);
            const Vec vm(mnew);
            for (int64_t i = 0; i < kScoreVecs; ++i) {
              const Vec e = (Vec::loadu(scores[g] + i * W) - vm).exp_u20();
              e.store(scores[g] + i * W);
              sum = sum + e;
            }
            l[g] = l[g] * alpha + at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, sum);
            m[g] = mnew;
            // the weighted V rows, accumulated in registers over the block
            float* ag = abuf.data() + (hh * kG + g) * D;
            Vec acc[kNV];
            const Vec va(alpha);
            for (int64_t j = 0; j < kNV; ++j) acc[j] = Vec::loadu(ag + j * W) * va;
            for (int64_t r = 0; r < n; ++r) {
              const Vec w(scores[g][r]);
              const float* v = vr + r * vs;
              for (int64_t j = 0; j < kNV; ++j) acc[j] = at::vec::fmadd(w, Vec::loadu(v + j * W), acc[j]);
            }
            for (int64_t j = 0; j < kNV; ++j) acc[j].store(ag + j * W);
          }
        }
      }
      alignas(64) float row[D];
      for (int64_t i = 0; i < HP * kG; ++i) {
        const Vec inv(1.f / lbuf[i]);
        for (int64_t j = 0; j < kNV; ++j) (Vec::loadu(abuf.data() + i * D + j * W) * inv).store(row + j * W);
        scalar_t* os = op + (s * Hq + h0 * kG + i) * D;
        for (int64_t d = 0; d < D; ++d) os[d] = static_cast<scalar_t>(row[d]);
      }
    }
  });
}

// Whether (head_dim, group size, block size) is a shape the fast path was built for.
bool fits(int64_t head_dim, int64_t group, int64_t block) {
  const int64_t W = Vec::size();
  const int64_t nv = head_dim / W;
  return block == kBlock && head_dim % W == 0 && (nv == 1 || nv == 2 || nv == 4 || nv == 8 || nv == 16) &&
         (group == 1 || group == 2 || group == 4 || group == 8);
}

bool gqa_decode_fits(int64_t head_dim, int64_t num_q_heads, int64_t num_kv_heads, int64_t block) {
  return num_kv_heads > 0 && num_q_heads % num_kv_heads == 0 && fits(head_dim, num_q_heads / num_kv_heads, block);
}

at::Tensor paged_decode_gqa(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale) {
  TORCH_CHECK(q.device().is_cpu() && q.dim() == 3, "q must be a CPU tensor [S, Hq, D]");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(), "caches must be [NB, BS, Hkv, D] alike");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(k_cache.scalar_type() == q.scalar_type() && v_cache.scalar_type() == q.scalar_type(),
              "q and caches must share a dtype");
  TORCH_CHECK(q.size(2) == k_cache.size(3), "head sizes of q and the caches differ");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt,
              "block_tables and seq_lens must be int32");
  TORCH_CHECK(block_tables.size(0) == q.size(0) && seq_lens.size(0) == q.size(0), "one query per sequence");
  const int64_t D = q.size(2), Hq = q.size(1), Hkv = k_cache.size(2);
  TORCH_CHECK(gqa_decode_fits(D, Hq, Hkv, k_cache.size(1)), "paged_decode_gqa: head_dim ", D, ", ", Hq, "/", Hkv,
              " heads, block ", k_cache.size(1), " is outside the fast path (see gqa_decode_fits)");
  at::Tensor qc = q.contiguous(), bt = block_tables.contiguous(), sl = seq_lens.contiguous();
  const int32_t* lens = sl.data_ptr<int32_t>();
  const int64_t capacity = bt.size(1) * kBlock;
  for (int64_t s = 0; s < sl.size(0); ++s) {
    TORCH_CHECK(lens[s] >= 1 && lens[s] <= capacity, "seq_lens[", s, "] = ", lens[s], " outside [1, ", capacity, "]");
  }
  at::Tensor out = at::empty_like(qc);
  auto by_group = [&](auto zero, auto nv) {
    using scalar_t = decltype(zero);
    constexpr int64_t NV = decltype(nv)::value;
    switch (Hq / Hkv) {
      case 1: gqa_decode_kernel<scalar_t, NV, 1>(qc, k_cache, v_cache, bt, sl, out, scale); break;
      case 2: gqa_decode_kernel<scalar_t, NV, 2>(qc, k_cache, v_cache, bt, sl, out, scale); break;
      case 4: gqa_decode_kernel<scalar_t, NV, 4>(qc, k_cache, v_cache, bt, sl, out, scale); break;
      default: gqa_decode_kernel<scalar_t, NV, 8>(qc, k_cache, v_cache, bt, sl, out, scale); break;
    }
  };
  auto by_width = [&](auto zero) {
    switch (D / Vec::size()) {
      case 1: by_group(zero, std::integral_constant<int64_t, 1>{}); break;
      case 2: by_group(zero, std::integral_constant<int64_t, 2>{}); break;
      case 4: by_group(zero, std::integral_constant<int64_t, 4>{}); break;
      case 8: by_group(zero, std::integral_constant<int64_t, 8>{}); break;
      default: by_group(zero, std::integral_constant<int64_t, 16>{}); break;
    }
  };
  switch (q.scalar_type()) {
    case at::kFloat: by_width(float{}); break;
    case at::kBFloat16: by_width(c10::BFloat16{}); break;
    case at::kHalf: by_width(c10::Half{}); break;
    default: TORCH_CHECK(false, "paged_decode_gqa: dtype ", q.scalar_type(), " not supported");
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(omniduplex_cpu, m) {
  m.def("paged_decode_gqa(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor seq_lens, "
        "float scale) -> Tensor");
  m.def("gqa_decode_fits(int head_dim, int num_q_heads, int num_kv_heads, int block) -> bool");
}

TORCH_LIBRARY_IMPL(omniduplex_cpu, CPU, m) { m.impl("paged_decode_gqa", &paged_decode_gqa); }

TORCH_LIBRARY_IMPL(omniduplex_cpu, CompositeExplicitAutograd, m) { m.impl("gqa_decode_fits", &gqa_decode_fits); }
