// Weight-only quantized matmuls on GGUF blocks, as torch ops in the ``omniduplex_quant`` namespace
// (built by kernels/quant.py).
//
// Block formats (GGML, the byte layouts of ggml's ``ggml-common.h``; the value formulas are those of the
// ``gguf`` Python package's ``gguf.quants`` dequantisers, which our tests compare against bit for bit):
//   Q4_1  32 values in 20 B: fp16 d, fp16 m, 16 B nibbles (value i<16: low nibble of byte i, else high
//         nibble of byte i-16); w = d*q + m.
//   Q5_0  32 values in 22 B: fp16 d, uint32 qh (bit i = 5th bit of value i), 16 B nibbles; w = d*(q - 16).
//   Q8_0  32 values in 34 B: fp16 d, 32 int8; w = d*q.
//   Q4_K  256 values in 144 B: fp16 d, fp16 dmin, 12 B of 6-bit (scale, min) pairs for 8 sub-blocks of 32,
//         128 B nibbles (32-byte group g: values 64g..64g+31 low nibbles, 64g+32.. high nibbles);
//         w = (d*sc)*q - dmin*m.
//   Q6_K  256 values in 210 B: 128 B low nibbles, 64 B high 2-bit pairs, 16 int8 scales (one per 16
//         values), fp16 d; w = (d*sc)*(q - 32).
//
// Scheme (ours; the same idea as llama.cpp's CPU path): every weight row is decoded, 32 values at a time,
// into int8 codes q, eight fp32 lane scales (one per 4 values: the sub-block scale; Q6_K's two 16-value
// sub-blocks give two) and one fp32 offset m per 32 (Q4_1's m, Q4_K's -dmin*min). Activation rows are
// quantised on the fly to int8 per 32 values (scale amax/127, round to nearest). A 32-value dot is then
// an integer dot (AVX2 maddubs/madd, AVX-512 VNNI dpbusd) scaled by the weight lane scales times the
// activation scale, plus m * (activation scale * sum of activation codes). Each weight row is decoded once
// per call and used for every activation row: a batch of T rows reads the weights once.
//
// Paths by the build's -march=native: __AVX512F__+BW+DQ+VL (512-bit, two 32-value chunks per vector, VNNI
// when __AVX512VNNI__), __AVX2__+__FMA__ (256-bit), else portable scalar code. Compiled with
// -ffp-contract=off so that the dequantiser's mul-then-add is rounded as the reference rounds it.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define OD_AVX2 1
#endif
#if defined(OD_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__)
#define OD_AVX512 1
#endif

namespace {

// GGML type ids (ggml.h ``enum ggml_type``)
constexpr int64_t kQ4_1 = 3, kQ5_0 = 6, kQ8_0 = 8, kQ4_K = 12, kQ6_K = 14;

struct Format {
  int64_t block_values, block_bytes;
};

constexpr Format format_of_known(int64_t type) {
  return type == kQ4_1 ? Format{32, 20} : type == kQ5_0 ? Format{32, 22} : type == kQ8_0 ? Format{32, 34}
       : type == kQ4_K ? Format{256, 144} : Format{256, 210};
}

Format format_of(int64_t type) {
  switch (type) {
    case kQ4_1: return {32, 20};
    case kQ5_0: return {32, 22};
    case kQ8_0: return {32, 34};
    case kQ4_K: return {256, 144};
    case kQ6_K: return {256, 210};
    default: TORCH_CHECK(false, "unsupported GGML quant type id ", type, " (supported: Q4_1=3, Q5_0=6, Q8_0=8, Q4_K=12, Q6_K=14)");
  }
}

inline float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#ifdef __F16C__
  return _cvtsh_ss(h);
#else
  return c10::detail::fp16_ieee_to_fp32_value(h);
#endif
}

// One decoded row: K int8 codes, K/4 lane scales, K/32 offsets.
struct Decoded {
  std::vector<int8_t> q;
  std::vector<float> dv, m;
  void resize(int64_t K) {
    q.resize(K);
    dv.resize(K / 4);
    m.resize(K / 32);
  }
};

inline void fill8(float* dst, float a, float b) {
#ifdef OD_AVX2
  _mm256_storeu_ps(dst, _mm256_set_m128(_mm_set1_ps(b), _mm_set1_ps(a)));
#else
  for (int i = 0; i < 4; ++i) dst[i] = a;
  for (int i = 4; i < 8; ++i) dst[i] = b;
#endif
}

// ---------------------------------------------------------------- decoding (one block → chunks of 32)

#ifdef OD_AVX2
inline __m256i nibbles32(const uint8_t* p) {  // 16 bytes → 32 bytes: low nibbles, then high nibbles
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

inline __m256i bits32(uint32_t bits) {  // bit i of ``bits`` → byte i = 0xFF or 0x00
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0LL));
  const __m256i select = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
}
#endif

inline void decode_q4_1(const uint8_t* b, int8_t* q, float* dv, float* m) {
  const float d = f16(b), mm = f16(b + 2);
  const uint8_t* qs = b + 4;
#ifdef OD_AVX2
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), nibbles32(qs));
#else
  for (int i = 0; i < 16; ++i) {
    q[i] = qs[i] & 0x0F;
    q[i + 16] = qs[i] >> 4;
  }
#endif
  fill8(dv, d, d);
  *m = mm;
}

inline void decode_q5_0(const uint8_t* b, int8_t* q, float* dv, float* m) {
  const float d = f16(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
#ifdef OD_AVX2
  const __m256i hi = _mm256_and_si256(bits32(qh), _mm256_set1_epi8(0x10));
  const __m256i v = _mm256_sub_epi8(_mm256_or_si256(nibbles32(qs), hi), _mm256_set1_epi8(16));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), v);
#else
  for (int i = 0; i < 16; ++i) {
    q[i] = static_cast<int8_t>(((qs[i] & 0x0F) | (((qh >> i) & 1) << 4)) - 16);
    q[i + 16] = static_cast<int8_t>(((qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4)) - 16);
  }
#endif
  fill8(dv, d, d);
  *m = 0.f;
}

inline void decode_q8_0(const uint8_t* b, int8_t* q, float* dv, float* m) {
  const float d = f16(b);
  std::memcpy(q, b + 2, 32);
  fill8(dv, d, d);
  *m = 0.f;
}

// 8 chunks of 32 from one 256-value block
inline void decode_q4_k(const uint8_t* b, int8_t* q, float* dv, float* m) {
  const float d = f16(b), dmin = f16(b + 2);
  const uint8_t* s = b + 4;
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    int sc, mn;
    if (j < 4) {
      sc = s[j] & 63;
      mn = s[j + 4] & 63;
    } else {
      sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
      mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    const float ds = d * static_cast<float>(sc);
    fill8(dv + 8 * j, ds, ds);
    m[j] = -(dmin * static_cast<float>(mn));
  }
  for (int g = 0; g < 4; ++g) {
    const uint8_t* p = qs + 32 * g;
    int8_t* lo = q + 64 * g;
    int8_t* hi = lo + 32;
#ifdef OD_AVX2
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i mask = _mm256_set1_epi8(0x0F);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo), _mm256_and_si256(x, mask));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi), _mm256_and_si256(_mm256_srli_epi16(x, 4), mask));
#else
    for (int i = 0; i < 32; ++i) {
      lo[i] = p[i] & 0x0F;
      hi[i] = p[i] >> 4;
    }
#endif
  }
}

inline void decode_q6_k(const uint8_t* b, int8_t* q, float* dv, float* m) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16(b + 208);
  for (int j = 0; j < 8; ++j) {
    fill8(dv + 8 * j, d * static_cast<float>(sc[2 * j]), d * static_cast<float>(sc[2 * j + 1]));
    m[j] = 0.f;
  }
  for (int n = 0; n < 2; ++n) {  // two halves of 128 values: 64 B of ql, 32 B of qh each
    const uint8_t* l = ql + 64 * n;
    const uint8_t* h = qh + 32 * n;
    int8_t* out = q + 128 * n;
#ifdef OD_AVX2
    const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(l));
    const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(l + 32));
    const __m256i hh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h));
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
    const __m256i v0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hh, 4), m2));
    const __m256i v1 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hh, 2), m2));
    const __m256i v2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hh, m2));
    const __m256i v3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(hh, 2), m2));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_sub_epi8(v0, k32));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32), _mm256_sub_epi8(v1, k32));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64), _mm256_sub_epi8(v2, k32));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 96), _mm256_sub_epi8(v3, k32));
#else
    for (int i = 0; i < 32; ++i) {
      out[i] = static_cast<int8_t>(((l[i] & 0x0F) | (((h[i] >> 0) & 3) << 4)) - 32);
      out[i + 32] = static_cast<int8_t>(((l[i + 32] & 0x0F) | (((h[i] >> 2) & 3) << 4)) - 32);
      out[i + 64] = static_cast<int8_t>(((l[i] >> 4) | (((h[i] >> 4) & 3) << 4)) - 32);
      out[i + 96] = static_cast<int8_t>(((l[i + 32] >> 4) | (((h[i] >> 6) & 3) << 4)) - 32);
    }
#endif
  }
}

// Decode one row of ``K`` values (``K / block_values`` blocks at ``row``) into ``out``; the block decoder is
// a template argument so that it is inlined into the row loop.
template <int64_t kType>
void decode_row_t(const uint8_t* row, int64_t K, Decoded& out) {
  constexpr Format f = format_of_known(kType);
  constexpr int64_t chunks_per_block = f.block_values / 32;
  int8_t* q = out.q.data();
  float* dv = out.dv.data();
  float* m = out.m.data();
  for (int64_t blk = 0; blk < K / f.block_values; ++blk) {
    const int64_t c = blk * chunks_per_block;
    const uint8_t* b = row + blk * f.block_bytes;
    if constexpr (kType == kQ4_1) decode_q4_1(b, q + 32 * c, dv + 8 * c, m + c);
    if constexpr (kType == kQ5_0) decode_q5_0(b, q + 32 * c, dv + 8 * c, m + c);
    if constexpr (kType == kQ8_0) decode_q8_0(b, q + 32 * c, dv + 8 * c, m + c);
    if constexpr (kType == kQ4_K) decode_q4_k(b, q + 32 * c, dv + 8 * c, m + c);
    if constexpr (kType == kQ6_K) decode_q6_k(b, q + 32 * c, dv + 8 * c, m + c);
  }
}

void decode_row(const uint8_t* row, int64_t K, int64_t type, Decoded& out) {
  switch (type) {
    case kQ4_1: decode_row_t<kQ4_1>(row, K, out); break;
    case kQ5_0: decode_row_t<kQ5_0>(row, K, out); break;
    case kQ8_0: decode_row_t<kQ8_0>(row, K, out); break;
    case kQ4_K: decode_row_t<kQ4_K>(row, K, out); break;
    case kQ6_K: decode_row_t<kQ6_K>(row, K, out); break;
    default: format_of(type);  // raises
  }
}

// ---------------------------------------------------------------- activation quantisation

// x [K] fp32 → codes [K] int8, per-32 scale xd and xs = xd * sum(codes)
void quantize_row(const float* x, int64_t K, int8_t* codes, float* xd, float* xs) {
  for (int64_t c = 0; c < K / 32; ++c) {
    const float* v = x + 32 * c;
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float d = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int qi = static_cast<int>(std::nearbyint(v[i] * id));
      codes[32 * c + i] = static_cast<int8_t>(qi);
      sum += qi;
    }
    xd[c] = d;
    xs[c] = d * static_cast<float>(sum);
  }
}

// ---------------------------------------------------------------- dot products of one decoded row

#ifdef OD_AVX2
inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256i idot256(__m256i aw, __m256i sx) {  // aw unsigned bytes, sx signed → 8 int32 of 4-byte sums
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sx);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1));
#endif
}
#endif

// out[t] = dot(decoded row, activation row t) for TB activation rows starting at xq (stride K)
template <int TB>
inline void dot_rows(const Decoded& w, int64_t K, const int8_t* xq, const float* xd, const float* xs,
                     float* out, int64_t out_stride, bool has_min) {
  const int64_t nc = K / 32;
  float offs[TB];
  for (int t = 0; t < TB; ++t) {
    float o = 0.f;
    if (has_min)
      for (int64_t c = 0; c < nc; ++c) o += w.m[c] * xs[t * nc + c];
    offs[t] = o;
  }
#if defined(OD_AVX512)
  __m512 acc[TB];
  for (int t = 0; t < TB; ++t) acc[t] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 2 <= nc; c += 2) {
    const __m512i wv = _mm512_loadu_si512(w.q.data() + 32 * c);
    const __m512i aw = _mm512_abs_epi8(wv);
    const __mmask64 neg = _mm512_movepi8_mask(wv);
    const __m512 dv = _mm512_loadu_ps(w.dv.data() + 8 * c);
    for (int t = 0; t < TB; ++t) {
      const __m512i xv = _mm512_loadu_si512(xq + t * K + 32 * c);
      const __m512i sx = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);  // x * sign(w)
#ifdef __AVX512VNNI__
      const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), aw, sx);
#else
      const __m512i p = _mm512_madd_epi16(_mm512_maddubs_epi16(aw, sx), _mm512_set1_epi16(1));
#endif
      const __m512 sc = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(xd[t * nc + c])),
                                           _mm256_set1_ps(xd[t * nc + c + 1]), 1);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dv, sc), acc[t]);
    }
  }
  for (int t = 0; t < TB; ++t) {
    float r = _mm512_reduce_add_ps(acc[t]);
    for (int64_t cc = c; cc < nc; ++cc) {  // an odd last chunk
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.q.data() + 32 * cc));
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + t * K + 32 * cc));
      const __m256i p = idot256(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
      r += hsum256(_mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_loadu_ps(w.dv.data() + 8 * cc)),
                                 _mm256_set1_ps(xd[t * nc + cc])));
    }
    out[t * out_stride] = r + offs[t];
  }
#elif defined(OD_AVX2)
  __m256 acc[TB];
  for (int t = 0; t < TB; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t c = 0; c < nc; ++c) {
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.q.data() + 32 * c));
    const __m256i aw = _mm256_sign_epi8(wv, wv);
    const __m256 dv = _mm256_loadu_ps(w.dv.data() + 8 * c);
    for (int t = 0; t < TB; ++t) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + t * K + 32 * c));
      const __m256i p = idot256(aw, _mm256_sign_epi8(xv, wv));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dv, _mm256_set1_ps(xd[t * nc + c])), acc[t]);
    }
  }
  for (int t = 0; t < TB; ++t) out[t * out_stride] = hsum256(acc[t]) + offs[t];
#else
  for (int t = 0; t < TB; ++t) {
    float r = 0.f;
    const int8_t* x = xq + t * K;
    for (int64_t c = 0; c < nc; ++c) {
      float rc = 0.f;
      for (int g = 0; g < 8; ++g) {
        int32_t s = 0;
        for (int i = 0; i < 4; ++i) s += int32_t(w.q[32 * c + 4 * g + i]) * int32_t(x[32 * c + 4 * g + i]);
        rc += static_cast<float>(s) * w.dv[8 * c + g];
      }
      r += rc * xd[t * nc + c];
    }
    out[t * out_stride] = r + offs[t];
  }
#endif
}

void check_weight(const at::Tensor& w, int64_t type, int64_t K) {
  const Format f = format_of(type);
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kByte && w.dim() == 2 && w.is_contiguous(),
              "quantized weight must be a contiguous CPU uint8 tensor [N, row_bytes]");
  TORCH_CHECK(K > 0 && K % f.block_values == 0, "in_features ", K, " is not a multiple of the block size ",
              f.block_values, " of quant type ", type);
  TORCH_CHECK(w.size(1) == K / f.block_values * f.block_bytes, "weight rows hold ", w.size(1),
              " bytes; ", K, " values of quant type ", type, " take ", K / f.block_values * f.block_bytes);
}

// ---------------------------------------------------------------- ops

// x [T, K] (any float dtype) × w [N, row_bytes] (GGML ``type`` blocks) → y [T, N] fp32
at::Tensor qmatmul(const at::Tensor& x, const at::Tensor& w, int64_t type, int64_t K) {
  check_weight(w, type, K);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be [T, ", K, "], got ", x.sizes());
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const int64_t T = xf.size(0), N = w.size(0), nc = K / 32, row_bytes = w.size(1);
  at::Tensor y = at::empty({T, N}, xf.options());
  if (T == 0 || N == 0) return y;
  std::vector<int8_t> xq(T * K);
  std::vector<float> xd(T * nc), xs(T * nc);
  const float* xp = xf.data_ptr<float>();
  at::parallel_for(0, T, 16, [&](int64_t a, int64_t b) {
    for (int64_t t = a; t < b; ++t) quantize_row(xp + t * K, K, xq.data() + t * K, xd.data() + t * nc, xs.data() + t * nc);
  });
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const bool has_min = type == kQ4_1 || type == kQ4_K;
  at::parallel_for(0, N, 8, [&](int64_t a, int64_t b) {
    Decoded dec;
    dec.resize(K);
    for (int64_t n = a; n < b; ++n) {
      decode_row(wp + n * row_bytes, K, type, dec);
      int64_t t = 0;
      for (; t + 8 <= T; t += 8)
        dot_rows<8>(dec, K, xq.data() + t * K, xd.data() + t * nc, xs.data() + t * nc, yp + t * N + n, N, has_min);
      for (; t + 4 <= T; t += 4)
        dot_rows<4>(dec, K, xq.data() + t * K, xd.data() + t * nc, xs.data() + t * nc, yp + t * N + n, N, has_min);
      switch (T - t) {
        case 3: dot_rows<3>(dec, K, xq.data() + t * K, xd.data() + t * nc, xs.data() + t * nc, yp + t * N + n, N, has_min); break;
        case 2: dot_rows<2>(dec, K, xq.data() + t * K, xd.data() + t * nc, xs.data() + t * nc, yp + t * N + n, N, has_min); break;
        case 1: dot_rows<1>(dec, K, xq.data() + t * K, xd.data() + t * nc, xs.data() + t * nc, yp + t * N + n, N, has_min); break;
        default: break;
      }
    }
  });
  return y;
}

// rows ``ids`` [R] int64 of w [N, row_bytes] dequantised → [R, K] fp32 (embedding lookup, tests)
at::Tensor dequantize_rows(const at::Tensor& w, int64_t type, int64_t K, const at::Tensor& ids) {
  check_weight(w, type, K);
  const at::Tensor idc = ids.to(at::kLong).contiguous();
  const int64_t R = idc.numel(), N = w.size(0), row_bytes = w.size(1);
  const int64_t* ip = idc.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r) TORCH_CHECK(ip[r] >= 0 && ip[r] < N, "row id ", ip[r], " outside [0, ", N, ")");
  at::Tensor y = at::empty({R, K}, at::TensorOptions().dtype(at::kFloat));
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, R, 16, [&](int64_t a, int64_t b) {
    Decoded dec;
    dec.resize(K);
    for (int64_t r = a; r < b; ++r) {
      decode_row(wp + ip[r] * row_bytes, K, type, dec);
      float* out = yp + r * K;
      for (int64_t i = 0; i < K; ++i) {
        const float v = static_cast<float>(dec.q[i]) * dec.dv[i / 4];  // rounded, then the offset added
        out[i] = v + dec.m[i / 32];
      }
    }
  });
  return y;
}

std::string isa() {
#if defined(OD_AVX512) && defined(__AVX512VNNI__)
  return "avx512-vnni";
#elif defined(OD_AVX512)
  return "avx512";
#elif defined(OD_AVX2)
  return "avx2";
#else
  return "scalar";
#endif
}

at::Tensor isa_op(const at::Tensor& dummy) {  // the ISA path as a 1-D uint8 tensor of its name's bytes
  const std::string s = isa();
  at::Tensor out = at::empty({static_cast<int64_t>(s.size())}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(out.data_ptr<uint8_t>(), s.data(), s.size());
  return out;
}

}  // namespace

TORCH_LIBRARY(omniduplex_quant, m) {
  m.def("qmatmul(Tensor x, Tensor w, int type, int in_features) -> Tensor");
  m.def("dequantize_rows(Tensor w, int type, int in_features, Tensor ids) -> Tensor");
  m.def("isa(Tensor dummy) -> Tensor");
}

TORCH_LIBRARY_IMPL(omniduplex_quant, CPU, m) {
  m.impl("qmatmul", &qmatmul);
  m.impl("dequantize_rows", &dequantize_rows);
  m.impl("isa", &isa_op);
}
