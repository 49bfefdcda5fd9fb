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
// Scheme (ours; the same idea as llama.cpp's CPU path): activation rows are quantised on the fly to int8
// per 32 values (scale amax/127, round to nearest even; ggml's block_q8_1 layout kept as planar arrays), once
// per call for all N weight rows. A 32-value dot is then an integer dot (AVX2 maddubs/madd, VNNI dpbusd where
// the CPU has AVX512-VNNI) times the weight scale times the activation scale, plus the weight offset m times
// (activation scale × sum of activation codes) for Q4_1 / Q4_K.
//
// Paths by the build's -march=native: __AVX2__+__FMA__: fused kernels that unpack each weight block in
// registers and dot it with 1..4 activation rows at once (tiles of weight rows x activation rows; a batch of
// more than 4 rows unpacks each tile once into a buffer that all rows pass over): see "fused AVX2 dot
// products" below; AVX-512 CPUs run the same 256-bit code (with VNNI's dpbusd when present). Otherwise
// portable scalar code that decodes a row to int8 codes and per-4 lane scales, then dots it. Compiled with
// -ffp-contract=off so that the dequantiser's mul-then-add is rounded as the reference rounds it.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
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

// x [K] fp32 → codes [K] int8, per-32 scale xd and xs = xd * sum(codes). The activation format is
// ggml's block_q8_1 (ggml-common.h: d, s = d * sum(qs), 32 int8) kept as three planar arrays; the rounding
// is round-half-to-even of v * 127 / amax (llama.cpp's quantize_row_q8_1 rounds the same way on AVX2).
void quantize_row(const float* x, int64_t K, int8_t* codes, float* xd, float* xs) {
  for (int64_t c = 0; c < K / 32; ++c) {
    const float* v = x + 32 * c;
#ifdef OD_AVX2
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 vv[4];
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      vv[i] = _mm256_loadu_ps(v + 8 * i);
      mx = _mm256_max_ps(mx, _mm256_and_ps(vv[i], absmask));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
    const __m256 idv = _mm256_set1_ps(id);
    __m256i iq[4];
    __m256i sum = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i) {
      const __m256 r = _mm256_round_ps(_mm256_mul_ps(vv[i], idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      iq[i] = _mm256_cvtps_epi32(r);
      sum = _mm256_add_epi32(sum, iq[i]);
    }
    // packs work within 128-bit lanes: the permute restores value order
    const __m256i p16a = _mm256_packs_epi32(iq[0], iq[1]), p16b = _mm256_packs_epi32(iq[2], iq[3]);
    const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                   _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 32 * c), p8);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    xd[c] = d;
    xs[c] = d * static_cast<float>(_mm_cvtsi128_si32(s4));
#else
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
#endif
  }
}

// The quantised activation rows of one call: T rows of K int8 codes, per-32 scales and scaled sums.
struct QX {
  const int8_t* q;
  const float* d;
  const float* s;
  int64_t K, nc;       // nc = K / 32
  const int32_t* h16;  // Q5_0 only: [T, nc, 8] 16 * (sum of the codes of values 0..15) x 4, then of 16..31 x 4
};

#ifdef OD_AVX2
// ---------------------------------------------------------------- fused AVX2 dot products
//
// The weight blocks are unpacked in registers (nothing is written back) into 32-value chunks of int8
// codes, each with float scales (and an offset m for Q4_1 / Q4_K). The integer products are llama.cpp's
// AVX2 technique (ggml-cpu's mul_sum_i8_pairs / mul_sum_us8_pairs): maddubs (unsigned × signed bytes →
// int16 sums of 2 products); signed weights are made unsigned with sign_epi8 (|w| and x·sign(w)).
//
// What every output is (the same fp32 operations whatever the batch, so row t of a batch equals the
// [1, K] result bit for bit, and greedy decoding at c = 8 equals c = 1): per (weight row n, activation
// row t) and chunk c, two exact integer dots P_lo (values 0..15) and P_hi (16..31), scales
// s = fp32(dw * xd) (dw: the weight's chunk scale, Q6_K: its 16-value sub-block's d*sc; xd: the
// activation chunk's scale), and, chunk after chunk,
//     lo = fma(float(P_lo), s_lo, lo);  hi = fma(float(P_hi), s_hi, hi);  off = fma(m_c, xs_c, off)
//     y = (lo + hi) + off
// Four (n, t) pairs share one register: 4 weight rows x 1 activation row, lanes [r0..r3 lo | r0..r3 hi].
// The 4 pairs' int16 pair sums are reduced with unpacks and adds (free ports on AMD Zen, whose only vector
// integer multiplier the maddubs keep busy) to int16 sums of 8, then one madd makes the 4 x 2 int32 dots:
// one madd, one convert and one fma per 4 pairs where one per pair is the plain way (VNNI's dpbusd gives
// int32 sums of 4, reduced in int32). A tile is 4 weight rows (unpacked once) x 1..4 activation rows: a
// decode step (T = 1) runs 8 rows x 1, a batch (c = 8 decode, prefill) 4 rows x 4 activation rows at a
// time. Q8_0, whose pair sums do not fit int16 sums of 8, keeps one 8-lane accumulator per pair (tile_q8).

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define OD_VNNI 1
#endif

// One block unpacked: CPB chunks of 32 codes (signed types: with |w| precomputed), scales, offsets.
template <int64_t kType>
struct Blk {
  static constexpr int CPB = static_cast<int>(format_of_known(kType).block_values / 32);
  static constexpr bool kSigned = kType == kQ8_0 || kType == kQ6_K;
  static constexpr bool kMin = kType == kQ4_1 || kType == kQ4_K;
  // Q5_0: unsigned codes q = w + 16 (0..31) and the exact integer correction -16 * (sum of the activation
  // codes of each half), which saves the sign_epi8 per (row, token) of the signed types
  static constexpr bool kBias = kType == kQ5_0;
  __m256i w[CPB], aw[CPB];
  float dw[CPB], dh[CPB], m[CPB];  // chunk scale (Q6_K: first 16 values' scale, dh: the last 16's), offset
};

template <int64_t kType>
inline void unpack(const uint8_t* b, Blk<kType>& o) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  if constexpr (kType == kQ8_0) {  // block_q8_0: d, qs[32]
    o.w[0] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    o.dw[0] = f16(b);
  } else if constexpr (kType == kQ5_0) {  // block_q5_0: d, qh (5th bits), qs[16] nibbles; w = d*(q-16)
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    o.w[0] = _mm256_or_si256(nibbles32(b + 6), _mm256_and_si256(bits32(qh), _mm256_set1_epi8(0x10)));
    o.dw[0] = f16(b);
  } else if constexpr (kType == kQ4_1) {  // block_q4_1: d, m, qs[16]; w = d*q + m
    o.w[0] = nibbles32(b + 4);
    uint32_t dm;  // both fp16 fields in one conversion
    std::memcpy(&dm, b, 4);
    const __m128 v = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dm)));
    o.dw[0] = _mm_cvtss_f32(v);
    o.m[0] = _mm_cvtss_f32(_mm_movehdup_ps(v));
  } else if constexpr (kType == kQ4_K) {  // block_q4_K: d, dmin, scales[12] (6-bit pairs), qs[128]
    const float d = f16(b), dmin = f16(b + 2);
    const uint8_t* s = b + 4;
    for (int g = 0; g < 4; ++g) {  // 32 bytes of qs: chunk 2g in the low nibbles, 2g+1 in the high ones
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * g));
      o.w[2 * g] = _mm256_and_si256(q, m4);
      o.w[2 * g + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    }
    for (int j = 0; j < 8; ++j) {  // get_scale_min_k4 (ggml-quants.c)
      const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
      const int mn = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
      o.dw[j] = d * static_cast<float>(sc);
      o.m[j] = -(dmin * static_cast<float>(mn));
    }
  } else {  // block_q6_K: ql[128] low nibbles, qh[64] high 2-bit pairs, scales[16] int8, d; w = d*sc*(q-32)
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = f16(b + 208);
    const __m256i m2 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
    for (int n = 0; n < 2; ++n) {  // two halves of 128 values: 64 B of ql, 32 B of qh each
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * n));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * n + 32));
      const __m256i hh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * n));
      __m256i* w = o.w + 4 * n;
      w[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hh, 4), m2));
      w[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hh, 2), m2));
      w[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hh, m2));
      w[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(hh, 2), m2));
      for (int i = 0; i < 4; ++i) w[i] = _mm256_sub_epi8(w[i], k32);
    }
    for (int j = 0; j < 8; ++j) {  // chunk j: sub-block scales sc[2j] (first 16 values), sc[2j+1]
      o.dw[j] = d * static_cast<float>(sc[2 * j]);  // exact: 11-bit × 8-bit significands
      o.dh[j] = d * static_cast<float>(sc[2 * j + 1]);
    }
  }
  if constexpr (Blk<kType>::kSigned)
    for (int j = 0; j < Blk<kType>::CPB; ++j) o.aw[j] = _mm256_sign_epi8(o.w[j], o.w[j]);
}

inline __m256i load32(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256i load32h(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// four vectors of int32 (per 128-bit half: 4 partial sums of one pair each) → [A B C D | A B C D], the
// sums of each half
inline __m256i reduce4_i32(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
  const __m256i cd = _mm256_add_epi32(_mm256_unpacklo_epi32(c, d), _mm256_unpackhi_epi32(c, d));
  return _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
}

// the same from int16 pair sums (8 per half per pair), whose sums of 8 must fit int16
inline __m256i reduce4_i16(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_add_epi16(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
  const __m256i cd = _mm256_add_epi16(_mm256_unpacklo_epi32(c, d), _mm256_unpackhi_epi32(c, d));
  return _mm256_madd_epi16(_mm256_add_epi16(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd)),
                           _mm256_set1_epi16(1));
}

// integer dots of chunk j of 4 weight rows o[0..3] with 32 activation codes xv:
// [P_lo(r0..r3) | P_hi(r0..r3)] int32
template <int64_t kType>
inline __m256i dot4(const Blk<kType>* o, int j, __m256i xv) {
  __m256i p[4];
#ifdef OD_VNNI
  for (int r = 0; r < 4; ++r)
    p[r] = Blk<kType>::kSigned ? _mm256_dpbusd_epi32(_mm256_setzero_si256(), o[r].aw[j], _mm256_sign_epi8(xv, o[r].w[j]))
                               : _mm256_dpbusd_epi32(_mm256_setzero_si256(), o[r].w[j], xv);
  return reduce4_i32(p[0], p[1], p[2], p[3]);
#else
  // int16 pair sums: |w| ≤ 15 (Q4), 31 (Q5_0's q), 32 (Q6_K) and |x| ≤ 127 keep sums of 8 within int16
  // (Q8_0's |w| ≤ 128 would not: it has its own tile)
  static_assert(kType != kQ8_0, "Q8_0 runs tile_q8");
  for (int r = 0; r < 4; ++r)
    p[r] = Blk<kType>::kSigned ? _mm256_maddubs_epi16(o[r].aw[j], _mm256_sign_epi8(xv, o[r].w[j]))
                               : _mm256_maddubs_epi16(o[r].w[j], xv);
  return reduce4_i16(p[0], p[1], p[2], p[3]);
#endif
}

// A tile: weight rows rows[0 .. 4*RG) (unpacked once per block) x activation rows t0 .. t0+TT. y[t, n + i]
// for i < nvalid (padding rows repeat a valid row; their results are dropped). ``next``: the rows after
// these, prefetched as far ahead as this block is into these.
template <int64_t kType, int RG, int TT>
inline void tile(const uint8_t* const* rows, const QX& x, int64_t t0, float* y, int64_t N, int64_t n,
                 int64_t nvalid, const uint8_t* next, int64_t row_bytes) {
  constexpr Format f = format_of_known(kType);
  constexpr int CPB = Blk<kType>::CPB;
  const int64_t nc = x.nc;
  Blk<kType> o[4 * RG];
  __m256 acc[RG][TT];
  __m128 off[RG][TT];
  for (int g = 0; g < RG; ++g)
    for (int t = 0; t < TT; ++t) {
      acc[g][t] = _mm256_setzero_ps();
      off[g][t] = _mm_setzero_ps();
    }
  const int8_t* xq = x.q + t0 * x.K;
  const float* xd = x.d + t0 * nc;
  const float* xs = x.s + t0 * nc;
  for (int64_t blk = 0, c = 0; blk < nc / CPB; ++blk) {
    if (next)
      for (int64_t p = 0; p < 4 * RG * f.block_bytes; p += 64) {
        const int64_t at = blk * 4 * RG * f.block_bytes + p;
        if (at < 4 * RG * row_bytes) _mm_prefetch(reinterpret_cast<const char*>(next + at), _MM_HINT_T0);
      }
    for (int r = 0; r < 4 * RG; ++r) unpack<kType>(rows[r] + blk * f.block_bytes, o[r]);
    for (int j = 0; j < CPB; ++j, ++c) {
      __m256 dv[RG];
      __m128 mv[RG];
      for (int g = 0; g < RG; ++g) {
        const Blk<kType>* q = o + 4 * g;
        const __m128 lo = _mm_setr_ps(q[0].dw[j], q[1].dw[j], q[2].dw[j], q[3].dw[j]);
        if constexpr (kType == kQ6_K)
          dv[g] = _mm256_set_m128(_mm_setr_ps(q[0].dh[j], q[1].dh[j], q[2].dh[j], q[3].dh[j]), lo);
        else
          dv[g] = _mm256_set_m128(lo, lo);
        if constexpr (Blk<kType>::kMin) mv[g] = _mm_setr_ps(q[0].m[j], q[1].m[j], q[2].m[j], q[3].m[j]);
      }
      for (int t = 0; t < TT; ++t) {
        const __m256i xv = load32(xq + t * x.K + 32 * c);
        const __m256 d = _mm256_broadcast_ss(xd + t * nc + c);
        for (int g = 0; g < RG; ++g) {
          __m256i pi = dot4<kType>(o + 4 * g, j, xv);
          if constexpr (Blk<kType>::kBias) pi = _mm256_sub_epi32(pi, load32h(x.h16 + ((t0 + t) * nc + c) * 8));
          const __m256 p = _mm256_cvtepi32_ps(pi);
          acc[g][t] = _mm256_fmadd_ps(p, _mm256_mul_ps(dv[g], d), acc[g][t]);
          if constexpr (Blk<kType>::kMin) off[g][t] = _mm_fmadd_ps(mv[g], _mm_broadcast_ss(xs + t * nc + c), off[g][t]);
        }
      }
    }
  }
  for (int g = 0; g < RG; ++g)
    for (int t = 0; t < TT; ++t) {
      __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc[g][t]), _mm256_extractf128_ps(acc[g][t], 1));
      if constexpr (Blk<kType>::kMin) v = _mm_add_ps(v, off[g][t]);
      float* out = y + (t0 + t) * N + n + 4 * g;
      const int64_t valid = std::min<int64_t>(4, nvalid - 4 * g);
      if (valid >= 4) {
        _mm_storeu_ps(out, v);
      } else {
        alignas(16) float tmp[4];
        _mm_store_ps(tmp, v);
        for (int64_t i = 0; i < valid; ++i) out[i] = tmp[i];
      }
    }
}

// 4 weight rows' chunk c unpacked once for a whole batch (kept in L1/L2 while every activation row passes)
template <int64_t kType>
struct Packed4 {
  __m256i w[4];                            // maddubs' unsigned operand (|w| for the signed types)
  __m256i s[Blk<kType>::kSigned ? 4 : 1];  // signed types: the signed codes (sign_epi8's source)
  __m256 dv;                               // [dw r0..r3 | dh r0..r3]
  __m128 mv;                               // offsets m r0..r3
};

template <int64_t kType>
void pack4(const uint8_t* const* rows, int64_t nc, Packed4<kType>* out) {
  constexpr Format f = format_of_known(kType);
  constexpr int CPB = Blk<kType>::CPB;
  Blk<kType> o[4];
  for (int64_t blk = 0, c = 0; blk < nc / CPB; ++blk) {
    for (int r = 0; r < 4; ++r) unpack<kType>(rows[r] + blk * f.block_bytes, o[r]);
    for (int j = 0; j < CPB; ++j, ++c) {
      Packed4<kType>& p = out[c];
      for (int r = 0; r < 4; ++r) {
        if constexpr (Blk<kType>::kSigned) {
          p.w[r] = o[r].aw[j];
          p.s[r] = o[r].w[j];
        } else {
          p.w[r] = o[r].w[j];
        }
      }
      const __m128 lo = _mm_setr_ps(o[0].dw[j], o[1].dw[j], o[2].dw[j], o[3].dw[j]);
      if constexpr (kType == kQ6_K)
        p.dv = _mm256_set_m128(_mm_setr_ps(o[0].dh[j], o[1].dh[j], o[2].dh[j], o[3].dh[j]), lo);
      else
        p.dv = _mm256_set_m128(lo, lo);
      if constexpr (Blk<kType>::kMin) p.mv = _mm_setr_ps(o[0].m[j], o[1].m[j], o[2].m[j], o[3].m[j]);
    }
  }
}

template <int64_t kType>
inline __m256i dot4p(const Packed4<kType>& p, __m256i xv) {
  __m256i q[4];
#ifdef OD_VNNI
  for (int r = 0; r < 4; ++r)
    q[r] = Blk<kType>::kSigned ? _mm256_dpbusd_epi32(_mm256_setzero_si256(), p.w[r], _mm256_sign_epi8(xv, p.s[r]))
                               : _mm256_dpbusd_epi32(_mm256_setzero_si256(), p.w[r], xv);
  return reduce4_i32(q[0], q[1], q[2], q[3]);
#else
  static_assert(kType != kQ8_0, "Q8_0 runs tile_q8");
  for (int r = 0; r < 4; ++r)
    q[r] = Blk<kType>::kSigned ? _mm256_maddubs_epi16(p.w[r], _mm256_sign_epi8(xv, p.s[r]))
                               : _mm256_maddubs_epi16(p.w[r], xv);
  return reduce4_i16(q[0], q[1], q[2], q[3]);
#endif
}

// activation rows t0 .. t0+TT against packed rows P (the same operations as ``tile``)
template <int64_t kType, int TT>
inline void tile_packed(const Packed4<kType>* P, const QX& x, int64_t t0, float* y, int64_t N, int64_t n,
                        int64_t nvalid) {
  const int64_t nc = x.nc;
  __m256 acc[TT];
  __m128 off[TT];
  for (int t = 0; t < TT; ++t) {
    acc[t] = _mm256_setzero_ps();
    off[t] = _mm_setzero_ps();
  }
  const int8_t* xq = x.q + t0 * x.K;
  const float* xd = x.d + t0 * nc;
  const float* xs = x.s + t0 * nc;
  for (int64_t c = 0; c < nc; ++c) {
    const Packed4<kType>& p = P[c];
    for (int t = 0; t < TT; ++t) {
      __m256i qi = dot4p<kType>(p, load32(xq + t * x.K + 32 * c));
      if constexpr (Blk<kType>::kBias) qi = _mm256_sub_epi32(qi, load32h(x.h16 + ((t0 + t) * nc + c) * 8));
      const __m256 q = _mm256_cvtepi32_ps(qi);
      acc[t] = _mm256_fmadd_ps(q, _mm256_mul_ps(p.dv, _mm256_broadcast_ss(xd + t * nc + c)), acc[t]);
      if constexpr (Blk<kType>::kMin) off[t] = _mm_fmadd_ps(p.mv, _mm_broadcast_ss(xs + t * nc + c), off[t]);
    }
  }
  for (int t = 0; t < TT; ++t) {
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc[t]), _mm256_extractf128_ps(acc[t], 1));
    if constexpr (Blk<kType>::kMin) v = _mm_add_ps(v, off[t]);
    float* out = y + (t0 + t) * N + n;
    if (nvalid >= 4) {
      _mm_storeu_ps(out, v);
    } else {
      alignas(16) float tmp[4];
      _mm_store_ps(tmp, v);
      for (int64_t i = 0; i < nvalid; ++i) out[i] = tmp[i];
    }
  }
}

// Q8_0 keeps one 8-lane accumulator per (row, activation row): its pair sums must be widened by a madd
// each before any reduction, so the 4-pair reduction would add shuffles and save no multiply. Per chunk:
//     acc = fma(float(madd(maddubs(|w|, x·sign(w)), 1)), fp32(dw * xd), acc);   y = hsum8(acc)
// for R weight rows x TT activation rows at once, each weight chunk loaded once for the TT rows.
inline float hsum8(__m256 v) {  // the sum of the 8 lanes, in one fixed order
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

template <int R, int TT>
inline void tile_q8(const uint8_t* const* rows, const QX& x, int64_t t0, float* y, int64_t N, int64_t n,
                    int64_t nvalid, const uint8_t* next) {
  constexpr int64_t B = 34;  // block_q8_0: fp16 d, 32 int8
  const int64_t nc = x.nc;
  [[maybe_unused]] const __m256i one = _mm256_set1_epi16(1);
  __m256 acc[R][TT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TT; ++t) acc[r][t] = _mm256_setzero_ps();
  const int8_t* xq = x.q + t0 * x.K;
  const float* xd = x.d + t0 * nc;
  for (int64_t c = 0; c < nc; ++c) {
    if (next)
      for (int64_t p = 0; p < R * B; p += 64) _mm_prefetch(reinterpret_cast<const char*>(next + c * R * B + p), _MM_HINT_T0);
    __m256i w[R], aw[R];
    float dw[R];
    for (int r = 0; r < R; ++r) {
      w[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[r] + c * B + 2));
      aw[r] = _mm256_sign_epi8(w[r], w[r]);
      dw[r] = f16(rows[r] + c * B);
    }
    for (int t = 0; t < TT; ++t) {
      const __m256i xv = load32(xq + t * x.K + 32 * c);
      const float d = xd[t * nc + c];
      for (int r = 0; r < R; ++r) {
#ifdef OD_VNNI
        const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw[r], _mm256_sign_epi8(xv, w[r]));
#else
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[r], _mm256_sign_epi8(xv, w[r])), one);
#endif
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw[r] * d), acc[r][t]);
      }
    }
  }
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R && r < nvalid; ++r) y[(t0 + t) * N + n + r] = hsum8(acc[r][t]);
}

template <int R>
void rows_pass_q8(const uint8_t* wp, int64_t row_bytes, const QX& x, int64_t T, int64_t N, int64_t n0, int64_t n1,
                  float* yp) {
  for (int64_t n = n0; n < n1; n += R) {
    const int64_t valid = std::min<int64_t>(R, n1 - n);
    const uint8_t* rows[R];
    for (int64_t r = 0; r < R; ++r) rows[r] = wp + (n + std::min<int64_t>(r, valid - 1)) * row_bytes;
    const uint8_t* next = n + R < n1 ? wp + (n + R) * row_bytes : nullptr;
    int64_t t = 0;
    for (; T - t >= 8; t += 8) tile_q8<R, 8>(rows, x, t, yp, N, n, valid, t == 0 ? next : nullptr);
    for (; T - t >= 4; t += 4) tile_q8<R, 4>(rows, x, t, yp, N, n, valid, t == 0 ? next : nullptr);
    switch (T - t) {
      case 3: tile_q8<R, 3>(rows, x, t, yp, N, n, valid, t == 0 ? next : nullptr); break;
      case 2: tile_q8<R, 2>(rows, x, t, yp, N, n, valid, t == 0 ? next : nullptr); break;
      case 1: tile_q8<R, 1>(rows, x, t, yp, N, n, valid, t == 0 ? next : nullptr); break;
      default: break;
    }
  }
}

// Rows [n0, n1) of y [T, N]: a decode step (T = 1) in tiles of 8 weight rows; a small batch (T ≤ 4) in
// tiles of 4 weight rows x T activation rows; a larger batch unpacks 4 weight rows once into a buffer
// that every activation row then passes over, KT at a time.
template <int64_t kType, int RG>
void rows_pass(const uint8_t* wp, int64_t row_bytes, const QX& x, int64_t T, int64_t N, int64_t n0, int64_t n1,
               float* yp) {
  constexpr int64_t R = 4 * RG;
  constexpr int KT = 8;
  std::vector<Packed4<kType>> packed(T > 4 ? x.nc : 0);
  for (int64_t n = n0; n < n1; n += R) {
    const int64_t valid = std::min<int64_t>(R, n1 - n);
    const uint8_t* rows[R];
    for (int64_t r = 0; r < R; ++r) rows[r] = wp + (n + std::min<int64_t>(r, valid - 1)) * row_bytes;
    const uint8_t* next = n + R < n1 ? wp + (n + R) * row_bytes : nullptr;  // the next tile's rows
    if constexpr (RG == 1) {
      if (T > 4) {
        pack4<kType>(rows, x.nc, packed.data());
        int64_t t = 0;
        for (; T - t >= KT; t += KT) tile_packed<kType, KT>(packed.data(), x, t, yp, N, n, valid);
        for (; t < T; ++t) tile_packed<kType, 1>(packed.data(), x, t, yp, N, n, valid);
        continue;
      }
      switch (T) {
        case 4: tile<kType, 1, 4>(rows, x, 0, yp, N, n, valid, next, row_bytes); break;
        case 3: tile<kType, 1, 3>(rows, x, 0, yp, N, n, valid, next, row_bytes); break;
        case 2: tile<kType, 1, 2>(rows, x, 0, yp, N, n, valid, next, row_bytes); break;
        default: tile<kType, 1, 1>(rows, x, 0, yp, N, n, valid, next, row_bytes); break;
      }
    } else {
      for (int64_t t = 0; t < T; ++t) tile<kType, RG, 1>(rows, x, t, yp, N, n, valid, t == 0 ? next : nullptr, row_bytes);
    }
  }
}

template <int64_t kType>
void matmul_rows(const uint8_t* wp, int64_t row_bytes, const QX& x, int64_t T, int64_t N, int64_t n0, int64_t n1,
                 float* yp) {
  if constexpr (kType == kQ8_0) {
    if (T < 8)  // measured: 2 rows x T for small batches, 1 row x 8 activation rows for larger ones
      rows_pass_q8<2>(wp, row_bytes, x, T, N, n0, n1, yp);
    else
      rows_pass_q8<1>(wp, row_bytes, x, T, N, n0, n1, yp);
  } else if (T == 1) {
    rows_pass<kType, 2>(wp, row_bytes, x, T, N, n0, n1, yp);
  } else {
    rows_pass<kType, 1>(wp, row_bytes, x, T, N, n0, n1, yp);
  }
}

void matmul_range(int64_t type, const uint8_t* wp, int64_t row_bytes, const QX& x, int64_t T, int64_t N, int64_t n0,
                  int64_t n1, float* yp) {
  switch (type) {
    case kQ4_1: matmul_rows<kQ4_1>(wp, row_bytes, x, T, N, n0, n1, yp); break;
    case kQ5_0: matmul_rows<kQ5_0>(wp, row_bytes, x, T, N, n0, n1, yp); break;
    case kQ8_0: matmul_rows<kQ8_0>(wp, row_bytes, x, T, N, n0, n1, yp); break;
    case kQ4_K: matmul_rows<kQ4_K>(wp, row_bytes, x, T, N, n0, n1, yp); break;
    default: matmul_rows<kQ6_K>(wp, row_bytes, x, T, N, n0, n1, yp); break;
  }
}

#else
// ---------------------------------------------------------------- portable path: decode a row, then dot

void matmul_range(int64_t type, const uint8_t* wp, int64_t row_bytes, const QX& x, int64_t T, int64_t N, int64_t n0,
                  int64_t n1, float* yp) {
  const bool has_min = type == kQ4_1 || type == kQ4_K;
  Decoded w;
  w.resize(x.K);
  for (int64_t n = n0; n < n1; ++n) {
    decode_row(wp + n * row_bytes, x.K, type, w);
    for (int64_t t = 0; t < T; ++t) {
      const int8_t* xq = x.q + t * x.K;
      float r = 0.f, o = 0.f;
      for (int64_t c = 0; c < x.nc; ++c) {
        float rc = 0.f;
        for (int g = 0; g < 8; ++g) {
          int32_t s = 0;
          for (int i = 0; i < 4; ++i) s += int32_t(w.q[32 * c + 4 * g + i]) * int32_t(xq[32 * c + 4 * g + i]);
          rc += static_cast<float>(s) * w.dv[8 * c + g];
        }
        r += rc * x.d[t * x.nc + c];
        if (has_min) o += w.m[c] * x.s[t * x.nc + c];
      }
      yp[t * N + n] = r + o;
    }
  }
}
#endif

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
  std::vector<int32_t> h16(type == kQ5_0 ? T * nc * 8 : 0);
  for (int64_t i = 0; i < static_cast<int64_t>(h16.size()) / 8; ++i) {
    int32_t lo = 0, hi = 0;
    for (int k = 0; k < 16; ++k) {
      lo += xq[32 * i + k];
      hi += xq[32 * i + 16 + k];
    }
    for (int k = 0; k < 4; ++k) {
      h16[8 * i + k] = 16 * lo;
      h16[8 * i + 4 + k] = 16 * hi;
    }
  }
  const QX qx{xq.data(), xd.data(), xs.data(), K, nc, h16.data()};
  // one range of rows per thread (at::parallel_for splits [0, N) evenly); the grain keeps a small N on
  // one thread where a second would cost more to wake than it saves
  const int64_t grain = std::max<int64_t>(16, 2048 / std::max<int64_t>(1, nc * T));
  at::parallel_for(0, N, grain, [&](int64_t a, int64_t b) { matmul_range(type, wp, row_bytes, qx, T, N, a, b, yp);
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
#if defined(OD_AVX2) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return "avx2-vnni";
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
