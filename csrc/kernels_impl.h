// The kernels, written once and compiled once per instruction set: the including file defines
// SIMSEARCH_NS (scalar, avx2 or avx512) and the build gives it the matching -m flags, so the
// #if blocks below pick the code path. The numba kernels in simsearch.quant._kernels and
// simsearch.graph._kernels are the reference these must equal (tests/test_simd.py).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "kernels.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define SS_AVX512 1
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define SS_AVX2 1
#endif

namespace simsearch {
namespace SIMSEARCH_NS {
namespace {

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// A bounded min-heap of (score, id): the best ``cap`` pushed so far.
struct TopK {
  std::vector<float> s;
  std::vector<int64_t> id;
  int64_t cap, n = 0;
  explicit TopK(int64_t cap_) : s(cap_), id(cap_), cap(cap_) {}
  float threshold() const { return n < cap ? NEG_INF : s[0]; }
  void push(float v, int64_t i) {
    if (n < cap) {
      int64_t c = n++;
      while (c > 0) {
        int64_t p = (c - 1) >> 1;
        if (s[p] <= v) break;
        s[c] = s[p]; id[c] = id[p]; c = p;
      }
      s[c] = v; id[c] = i;
    } else if (v > s[0]) {
      sift_down(v, i, n);
    }
  }
  void sift_down(float v, int64_t i, int64_t size) {
    int64_t c = 0;
    for (;;) {
      int64_t l = 2 * c + 1;
      if (l >= size) break;
      int64_t r = l + 1, m = (r < size && s[r] < s[l]) ? r : l;
      if (s[m] >= v) break;
      s[c] = s[m]; id[c] = id[m]; c = m;
    }
    s[c] = v; id[c] = i;
  }
  // writes the kept entries (best first when ordered) and pads to k with (-1, -inf)
  void finish(int64_t* out_id, float* out_s, int64_t k, bool ordered) {
    int64_t m = n;
    if (ordered) {
      for (int64_t end = n - 1; end >= 0; --end) {  // pop the minimum into the last free slot
        float v = s[0]; int64_t i = id[0];
        float lv = s[end]; int64_t li = id[end];
        if (end > 0) sift_down(lv, li, end);
        out_s[end] = v; out_id[end] = i;
      }
    } else {
      for (int64_t t = 0; t < n; ++t) { out_s[t] = s[t]; out_id[t] = id[t]; }
    }
    for (int64_t t = m; t < k; ++t) { out_s[t] = NEG_INF; out_id[t] = -1; }
  }
};

// (score, id) pairs ordered as every exact path ranks them: the higher score, or the same score
// and the smaller id. As a heap's comparator its top is the worst kept, and sort_heap leaves
// the best first.
using Scored = std::pair<float, int64_t>;
inline bool better(const Scored& u, const Scored& v) {
  return u.first > v.first || (u.first == v.first && u.second < v.second);
}

// offers (score, id) to ``heap`` (at most k entries, ordered by ``better``)
inline void offer(std::vector<Scored>& heap, int64_t k, Scored e) {
  if (static_cast<int64_t>(heap.size()) < k) {
    heap.push_back(e);
    std::push_heap(heap.begin(), heap.end(), better);
  } else if (better(e, heap.front())) {
    std::pop_heap(heap.begin(), heap.end(), better);
    heap.back() = e;
    std::push_heap(heap.begin(), heap.end(), better);
  }
}

inline void push_masked(TopK& top, const float* sc, uint32_t mask, int64_t base) {
  while (mask) {
    int i = __builtin_ctz(mask);
    mask &= mask - 1;
    if (sc[i] > top.threshold()) top.push(sc[i], base + i);
  }
}

// ---- NEQ fast-scan ------------------------------------------------------------------------

#if defined(SS_AVX2) || defined(SS_AVX512)
// A register's bytes and uint16 lanes as GCC vector types, so that one accumulation serves both
// widths: the compiler emits the same vpand / vpaddw / vpsrlw the intrinsics would.
template <int Bytes> struct Lanes;
template <> struct Lanes<32> {
  typedef uint8_t u8 __attribute__((vector_size(32)));
  typedef uint16_t u16 __attribute__((vector_size(32)));
};
template <> struct Lanes<64> {
  typedef uint8_t u8 __attribute__((vector_size(64)));
  typedef uint16_t u16 __attribute__((vector_size(64)));
};

// one 32-item block per 256-bit register; two per 512-bit one (b0 low half, b1 high)
inline void load_codes(const uint8_t* b0, const uint8_t*, __m256i& c) {
  c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0));
}
inline __m256i lookup(__m256i table, __m256i idx) { return _mm256_shuffle_epi8(table, idx); }
#if defined(SS_AVX512)
inline void load_codes(const uint8_t* b0, const uint8_t* b1, __m512i& c) {
  c = _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1)), 1);
}
inline __m512i lookup(__m512i table, __m512i idx) { return _mm512_shuffle_epi8(table, idx); }
#endif

// 32 accumulators of one block (two in a 512-bit V): items 0..15 (``even``) and 16..31
// (``odd``) as uint16 lanes. Adding a byte vector as uint16 lanes sums item j in the low byte
// and item 16 + j in the high byte; the high bytes are also summed alone, and subtracted back
// out at the end (faiss's trick: no unpacking inside the loop).
template <class V>
inline void accumulate(const uint8_t* b0, const uint8_t* b1, int64_t n_pairs, const V* lut,
                       V& even, V& odd) {
  using U8 = typename Lanes<sizeof(V)>::u8;
  using U16 = typename Lanes<sizeof(V)>::u16;
  U16 lo_acc = {}, hi_acc = {};
  for (int64_t p = 0; p < n_pairs; ++p) {
    V c;
    load_codes(b0 + p * 32, b1 + p * 32, c);
    U16 v0 = (U16)lookup(lut[2 * p], (V)((U8)c & 0x0f));
    U16 v1 = (U16)lookup(lut[2 * p + 1], (V)((U8)((U16)c >> 4) & 0x0f));
    lo_acc += v0 + v1;
    hi_acc += (v0 >> 8) + (v1 >> 8);
  }
  even = (V)(lo_acc - (hi_acc << 8));
  odd = (V)hi_acc;
}
#endif

#if defined(SS_AVX512)
// the estimates of 16 items from their uint16 sums; finish16 pushes those above the heap's
// threshold
inline __m512 estimate16(__m256i sums, const uint8_t* norms, __m512 codebook, float scale,
                         float bias) {
  __m512 e = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(sums)),
                             _mm512_set1_ps(scale), _mm512_set1_ps(bias));
  __m512i nc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(norms)));
  return _mm512_mul_ps(_mm512_permutexvar_ps(nc, codebook), e);
}
// ... stored to out[0..15] (the quantized graph's expansion)
inline void est16(__m256i sums, const uint8_t* norms, __m512 codebook, float scale, float bias,
                  float* out) {
  _mm512_storeu_ps(out, estimate16(sums, norms, codebook, scale, bias));
}
inline void finish16(__m256i sums, const uint8_t* norms, __m512 codebook, float scale,
                     float bias, uint32_t valid, TopK& top, int64_t base) {
  __m512 s = estimate16(sums, norms, codebook, scale, bias);
  uint32_t m = _mm512_cmp_ps_mask(s, _mm512_set1_ps(top.threshold()), _CMP_GT_OQ) & valid;
  if (m) {
    alignas(64) float sc[16];
    _mm512_store_ps(sc, s);
    push_masked(top, sc, m, base);
  }
}
#elif defined(SS_AVX2)
// the estimates of items 8h..8h+7 of 16 from their uint16 sums
inline __m256 estimate8(__m256i sums, int h, const uint8_t* norms, const float* codebook,
                        float scale, float bias) {
  __m128i part = h ? _mm256_extracti128_si256(sums, 1) : _mm256_castsi256_si128(sums);
  __m256 e = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(part)),
                             _mm256_set1_ps(scale), _mm256_set1_ps(bias));
  __m256i nc = _mm256_cvtepu8_epi32(
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(norms + 8 * h)));
  return _mm256_mul_ps(_mm256_i32gather_ps(codebook, nc, 4), e);
}
inline void est16(__m256i sums, const uint8_t* norms, const float* codebook, float scale,
                  float bias, float* out) {
  for (int h = 0; h < 2; ++h)
    _mm256_storeu_ps(out + 8 * h, estimate8(sums, h, norms, codebook, scale, bias));
}
inline void finish16(__m256i sums, const uint8_t* norms, const float* codebook, float scale,
                     float bias, uint32_t valid, TopK& top, int64_t base) {
  for (int h = 0; h < 2; ++h) {
    __m256 s = estimate8(sums, h, norms, codebook, scale, bias);
    uint32_t m = static_cast<uint32_t>(_mm256_movemask_ps(
                     _mm256_cmp_ps(s, _mm256_set1_ps(top.threshold()), _CMP_GT_OQ))) &
                 (valid >> (8 * h)) & 0xffu;
    if (m) {
      alignas(32) float sc[8];
      _mm256_store_ps(sc, s);
      push_masked(top, sc, m, base + 8 * h);
    }
  }
}
#endif

inline uint32_t valid_mask(int cnt) { return cnt >= 32 ? 0xffffffffu : ((1u << cnt) - 1u); }

#if defined(SS_AVX2) || defined(SS_AVX512)
// blocks [b, b_end) one at a time in 256-bit registers; ``cb``: the norm codebook as finish16
// of this ISA takes it
template <class Codebook>
inline void scan_blocks256(const FastScanArgs& a, int64_t b, int64_t b_end, const __m256i* lut,
                           Codebook cb, float scale, float bias, TopK& top) {
  const int64_t stride = a.n_pairs * 32 + 32;
  for (; b < b_end; ++b) {
    const uint8_t* blk = a.blocks + b * stride;
    __m256i even, odd;
    accumulate(blk, blk, a.n_pairs, lut, even, odd);
    uint32_t valid = valid_mask(a.block_count[b]);
    const uint8_t* norms = blk + a.n_pairs * 32;
    finish16(even, norms, cb, scale, bias, valid & 0xffffu, top, a.block_base[b]);
    finish16(odd, norms + 16, cb, scale, bias, valid >> 16, top, a.block_base[b] + 16);
  }
}
#endif

void scan_list(const FastScanArgs& a, int64_t q, int64_t list, TopK& top, const void* lut_vecs) {
  const int64_t stride = a.n_pairs * 32 + 32;
  const int64_t b_end = a.list_blocks[list + 1];
  const float scale = a.lut_scale[q], bias = a.lut_bias[q];
  int64_t b = a.list_blocks[list];
#if defined(SS_AVX512)
  const __m512 cb = _mm512_loadu_ps(a.norm_codebook);
  const __m512i* lut512 = static_cast<const __m512i*>(lut_vecs);
  for (; b + 1 < b_end; b += 2) {  // two blocks per pass: 64 lookups per shuffle
    const uint8_t* b0 = a.blocks + b * stride;
    const uint8_t* b1 = b0 + stride;
    __m512i even, odd;
    accumulate(b0, b1, a.n_pairs, lut512, even, odd);
    for (int t = 0; t < 2; ++t) {
      const uint8_t* norms = (t ? b1 : b0) + a.n_pairs * 32;
      uint32_t valid = valid_mask(a.block_count[b + t]);
      int64_t base = a.block_base[b + t];
      finish16(t ? _mm512_extracti64x4_epi64(even, 1) : _mm512_castsi512_si256(even), norms,
               cb, scale, bias, valid & 0xffffu, top, base);
      finish16(t ? _mm512_extracti64x4_epi64(odd, 1) : _mm512_castsi512_si256(odd), norms + 16,
               cb, scale, bias, valid >> 16, top, base + 16);
    }
  }
  // a block left over: the 256-bit copies of the tables follow the 512-bit ones
  scan_blocks256(a, b, b_end, reinterpret_cast<const __m256i*>(lut512 + 2 * a.n_pairs), cb,
                 scale, bias, top);
#elif defined(SS_AVX2)
  scan_blocks256(a, b, b_end, static_cast<const __m256i*>(lut_vecs), a.norm_codebook, scale,
                 bias, top);
#else
  const uint8_t* lut = static_cast<const uint8_t*>(lut_vecs);
  for (; b < b_end; ++b) {
    const uint8_t* blk = a.blocks + b * stride;
    const int cnt = a.block_count[b];
    for (int i = 0; i < cnt; ++i) {
      const int j = i < 16 ? 2 * i : 2 * (i - 16) + 1;
      uint32_t acc = 0;
      for (int64_t p = 0; p < a.n_pairs; ++p) {
        const uint8_t c = blk[p * 32 + j];
        acc += lut[(2 * p) * 16 + (c & 15)] + lut[(2 * p + 1) * 16 + (c >> 4)];
      }
      const float e = static_cast<float>(acc) * scale + bias;
      const float s = a.norm_codebook[blk[a.n_pairs * 32 + i]] * e;
      if (s > top.threshold()) top.push(s, a.block_base[b] + i);
    }
  }
#endif
}

// The 8-bit tables of one query in the registers' layout the scans read: AVX-512 keeps
// 512-bit copies of every table, then 256-bit copies for a block scanned alone.
struct LutVecs {
  int64_t n_tables;
#if defined(SS_AVX512)
  std::vector<__m512i> vecs;
  __m256i* v256;
  explicit LutVecs(int64_t n_pairs)
      : n_tables(2 * n_pairs), vecs(n_tables + (n_tables + 1) / 2),
        v256(reinterpret_cast<__m256i*>(vecs.data() + n_tables)) {}
#elif defined(SS_AVX2)
  std::vector<__m256i> vecs;
  __m256i* v256;
  explicit LutVecs(int64_t n_pairs) : n_tables(2 * n_pairs), vecs(n_tables), v256(vecs.data()) {}
#else
  explicit LutVecs(int64_t n_pairs) : n_tables(2 * n_pairs) {}
#endif
  const void* load(const uint8_t* lq) {
#if defined(SS_AVX512) || defined(SS_AVX2)
    for (int64_t m = 0; m < n_tables; ++m) {
      __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lq + m * 16));
#if defined(SS_AVX512)
      vecs[m] = _mm512_broadcast_i32x4(t);
#endif
      v256[m] = _mm256_broadcastsi128_si256(t);
    }
    return vecs.data();
#else
    return lq;
#endif
  }
};

// The estimates of all 32 items of blocks [b, b_end) into out[32 * (b - b_start) + i]: the
// quantized graph's expansion (a node's neighbours in one or two blocks).
void block_estimates(const uint8_t* blocks, int64_t n_pairs, int64_t b, int64_t b_end,
                     const void* lut_vecs, const float* codebook, float scale, float bias,
                     float* out) {
  const int64_t stride = n_pairs * 32 + 32;
#if defined(SS_AVX512)
  const __m512 cb = _mm512_loadu_ps(codebook);
  const __m512i* lut512 = static_cast<const __m512i*>(lut_vecs);
  for (; b + 1 < b_end; b += 2, out += 64) {
    const uint8_t* b0 = blocks + b * stride;
    const uint8_t* b1 = b0 + stride;
    __m512i even, odd;
    accumulate(b0, b1, n_pairs, lut512, even, odd);
    est16(_mm512_castsi512_si256(even), b0 + n_pairs * 32, cb, scale, bias, out);
    est16(_mm512_castsi512_si256(odd), b0 + n_pairs * 32 + 16, cb, scale, bias, out + 16);
    est16(_mm512_extracti64x4_epi64(even, 1), b1 + n_pairs * 32, cb, scale, bias, out + 32);
    est16(_mm512_extracti64x4_epi64(odd, 1), b1 + n_pairs * 32 + 16, cb, scale, bias, out + 48);
  }
  if (b < b_end) {
    const uint8_t* blk = blocks + b * stride;
    __m256i even, odd;
    accumulate(blk, blk, n_pairs, reinterpret_cast<const __m256i*>(lut512 + 2 * n_pairs), even,
               odd);
    est16(even, blk + n_pairs * 32, cb, scale, bias, out);
    est16(odd, blk + n_pairs * 32 + 16, cb, scale, bias, out + 16);
  }
#elif defined(SS_AVX2)
  const __m256i* lut = static_cast<const __m256i*>(lut_vecs);
  for (; b < b_end; ++b, out += 32) {
    const uint8_t* blk = blocks + b * stride;
    __m256i even, odd;
    accumulate(blk, blk, n_pairs, lut, even, odd);
    est16(even, blk + n_pairs * 32, codebook, scale, bias, out);
    est16(odd, blk + n_pairs * 32 + 16, codebook, scale, bias, out + 16);
  }
#else
  const uint8_t* lut = static_cast<const uint8_t*>(lut_vecs);
  for (; b < b_end; ++b, out += 32) {
    const uint8_t* blk = blocks + b * stride;
    for (int i = 0; i < 32; ++i) {
      const int j = i < 16 ? 2 * i : 2 * (i - 16) + 1;
      uint32_t acc = 0;
      for (int64_t p = 0; p < n_pairs; ++p) {
        const uint8_t c = blk[p * 32 + j];
        acc += lut[(2 * p) * 16 + (c & 15)] + lut[(2 * p + 1) * 16 + (c >> 4)];
      }
      out[i] = codebook[blk[n_pairs * 32 + i]] * (static_cast<float>(acc) * scale + bias);
    }
  }
#endif
}

}  // namespace

void fastscan(const FastScanArgs& a, int64_t q_lo, int64_t q_hi) {
  const int64_t n_tables = 2 * a.n_pairs;
  TopK top(a.k);
  LutVecs lv(a.n_pairs);
  for (int64_t q = q_lo; q < q_hi; ++q) {
    const void* lut_vecs = lv.load(a.luts + q * n_tables * 16);
    top.n = 0;
    if (a.probes == nullptr) {
      for (int64_t l = 0; l < a.n_lists; ++l) scan_list(a, q, l, top, lut_vecs);
    } else {
      for (int64_t t = 0; t < a.n_probe; ++t) {
        int64_t l = a.probes[q * a.n_probe + t];
        if (l >= 0 && l < a.n_lists) scan_list(a, q, l, top, lut_vecs);
      }
    }
    top.finish(a.out_pos + q * a.k, a.out_scores + q * a.k, a.k, a.ordered);
  }
}

void quantize_luts(const float* lut, int64_t md, int64_t n_pairs, int64_t q_lo, int64_t q_hi,
                   uint8_t* q8, float* scale, float* bias) {
  std::vector<float> lo(md);
  for (int64_t q = q_lo; q < q_hi; ++q) {
    const float* t = lut + q * md * 16;
    float span_max = 0.f;
    double b = 0.0;
    for (int64_t m = 0; m < md; ++m) {
      float mn = t[m * 16], mx = t[m * 16];
      for (int c = 1; c < 16; ++c) {
        mn = std::min(mn, t[m * 16 + c]);
        mx = std::max(mx, t[m * 16 + c]);
      }
      lo[m] = mn;
      span_max = std::max(span_max, mx - mn);
      b += mn;
    }
    const float s = std::max(span_max, 1e-30f) / 255.0f;
    uint8_t* out = q8 + q * 2 * n_pairs * 16;
    for (int64_t m = 0; m < md; ++m)
      for (int c = 0; c < 16; ++c)
        out[m * 16 + c] = static_cast<uint8_t>(std::nearbyint((t[m * 16 + c] - lo[m]) / s));
    std::fill(out + md * 16, out + 2 * n_pairs * 16, uint8_t{0});
    scale[q] = s;
    bias[q] = static_cast<float>(b);
  }
}

// ---- inner products -----------------------------------------------------------------------

#if defined(SS_AVX2) || defined(SS_AVX512)
// float lanes of the widest register as a GCC vector type: ``a += x * y`` becomes one FMA
#if defined(SS_AVX512)
typedef float Floats __attribute__((vector_size(64)));
#else
typedef float Floats __attribute__((vector_size(32)));
#endif
inline Floats load_floats(const float* p) {
  Floats v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
#endif

float dot(const float* x, const float* y, int64_t d) {
#if defined(SS_AVX2) || defined(SS_AVX512)
  constexpr int64_t L = sizeof(Floats) / sizeof(float);
  Floats s0 = {}, s1 = {};  // two chains, to hide the FMA's latency
  int64_t t = 0;
  for (; t + 2 * L <= d; t += 2 * L) {
    s0 += load_floats(x + t) * load_floats(y + t);
    s1 += load_floats(x + t + L) * load_floats(y + t + L);
  }
#if defined(SS_AVX512)
  for (; t < d; t += 16) {
    __mmask16 m = d - t >= 16 ? 0xffff : static_cast<__mmask16>((1u << (d - t)) - 1u);
    s0 = (Floats)_mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + t), _mm512_maskz_loadu_ps(m, y + t),
                                 (__m512)s0);
  }
  return _mm512_reduce_add_ps((__m512)(s0 + s1));
#else
  if (t + 8 <= d) {
    s0 += load_floats(x + t) * load_floats(y + t);
    t += 8;
  }
  const __m256 v = (__m256)(s0 + s1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  float s = _mm_cvtss_f32(h);
  for (; t < d; ++t) s += x[t] * y[t];
  return s;
#endif
#else
  float s = 0.f;
  for (int64_t t = 0; t < d; ++t) s += x[t] * y[t];
  return s;
#endif
}

void rerank(const RerankArgs& a, int64_t q_lo, int64_t q_hi) {
  TopK top(a.k);
  const int64_t lines = (a.d * 4 + 63) / 64, ahead = std::max<int64_t>(2, 32 / lines);
  auto fetch = [&](int64_t p) {
    const char* row = reinterpret_cast<const char*>(a.xb + p * a.d);
    for (int64_t l = 0; l < lines; ++l) _mm_prefetch(row + 64 * l, _MM_HINT_T0);
  };
  for (int64_t q = q_lo; q < q_hi; ++q) {
    const int64_t* c = a.cand + q * a.r;
    const float* qv = a.Q + q * a.d;
    top.n = 0;
    for (int64_t t = 0; t < std::min(a.r, ahead); ++t)
      if (c[t] >= 0) fetch(c[t]);
    for (int64_t t = 0; t < a.r; ++t) {
      if (t + ahead < a.r && c[t + ahead] >= 0) fetch(c[t + ahead]);
      if (c[t] < 0) continue;
      const float s = dot(qv, a.xb + c[t] * a.d, a.d);
      if (s > top.threshold()) top.push(s, c[t]);
    }
    top.finish(a.out_pos + q * a.k, a.out_scores + q * a.k, a.k, true);
  }
}

namespace {

// out[j] = q . x[j] for the n rows of x: four rows at a time share the query's loads and one
// reduction (the per-row horizontal sum is what bounds a one-row-at-a-time scan at small d)
void dots(const float* q, const float* x, int64_t n, int64_t d, float* out) {
  int64_t j = 0;
#if defined(SS_AVX512)
  for (; j + 4 <= n; j += 4) {
    const float* x0 = x + j * d;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t t = 0; t < d; t += 16) {
      const __mmask16 m = d - t >= 16 ? 0xffff : static_cast<__mmask16>((1u << (d - t)) - 1u);
      const __m512 qv = _mm512_maskz_loadu_ps(m, q + t);
      a0 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, x0 + t), a0);
      a1 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, x0 + d + t), a1);
      a2 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, x0 + 2 * d + t), a2);
      a3 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, x0 + 3 * d + t), a3);
    }
    // per 128-bit lane: [a0, a1, a2, a3] partial sums, then the four lanes added
    const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    const __m512 u = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 v = _mm256_add_ps(_mm512_castps512_ps256(u), _mm512_extractf32x8_ps(u, 1));
    _mm_storeu_ps(out + j, _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
  }
#endif
  for (; j < n; ++j) out[j] = dot(q, x + j * d, d);
}

}  // namespace

void flat_topk(const FlatArgs& a, int64_t q_lo, int64_t q_hi) {
  using Entry = Scored;
  std::vector<Entry> heap;
  heap.reserve(a.k);
  constexpr int64_t B = 256;  // rows scored before their pass through the heap
  float sc[B];
  const bool l2 = a.xsq != nullptr;
  for (int64_t q = q_lo; q < q_hi; ++q) {
    const float* qv = a.Q + q * a.d;
    const float qn = l2 ? dot(qv, qv, a.d) : 0.f;
    heap.clear();
    for (int64_t lo = 0; lo < a.n; lo += B) {
      const int64_t m = std::min(B, a.n - lo);
      dots(qv, a.xb + lo * a.d, m, a.d, sc);
      if (l2)  // the oracle's formula (simsearch._exact), negated: higher is better
        for (int64_t j = 0; j < m; ++j) sc[j] = -std::max(qn - 2.f * sc[j] + a.xsq[lo + j], 0.f);
      int64_t j = 0;
      for (; j < m && static_cast<int64_t>(heap.size()) < a.k; ++j) {
        heap.push_back({sc[j], a.ids[lo + j]});
        std::push_heap(heap.begin(), heap.end(), better);
      }
      auto offer = [&](int64_t r) {
        const Entry e{sc[r], a.ids[lo + r]};
        if (e.first >= heap.front().first && better(e, heap.front())) {
          std::pop_heap(heap.begin(), heap.end(), better);
          heap.back() = e;
          std::push_heap(heap.begin(), heap.end(), better);
        }
      };
#if defined(SS_AVX512)
      // once the heap is full few rows reach its worst score: sixteen compared at once, and
      // only those at or above it offered (row by row, the heap's top was reloaded each time;
      // 7-15% of the scan at 10,000 rows, docs/kernels.md)
      for (; j + 16 <= m; j += 16) {
        uint32_t hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(sc + j),
                                          _mm512_set1_ps(heap.front().first), _CMP_GE_OQ);
        for (; hit; hit &= hit - 1) offer(j + __builtin_ctz(hit));
      }
#endif
      for (; j < m; ++j) offer(j);
    }
    std::sort_heap(heap.begin(), heap.end(), better);
    for (int64_t t = 0; t < a.k; ++t) {
      a.out_ids[q * a.k + t] = heap[t].second;
      a.out_scores[q * a.k + t] = l2 ? -heap[t].first : heap[t].first;
    }
  }
}


// ---- Seismic --------------------------------------------------------------------------------

namespace {

// sum of qd[idx[e]] * w[e] over [0, m): a float32 row against a dense query
inline float gather_dot(const float* qd, const uint32_t* idx, const float* w, int64_t m) {
  int64_t e = 0;
  float r = 0.f;
#if defined(SS_AVX512)
  __m512 acc = _mm512_setzero_ps();
  for (; e < m; e += 16) {
    const __mmask16 mk = m - e >= 16 ? 0xffff : static_cast<__mmask16>((1u << (m - e)) - 1u);
    const __m512i t = _mm512_maskz_loadu_epi32(mk, idx + e);
    acc = _mm512_fmadd_ps(_mm512_mask_i32gather_ps(_mm512_setzero_ps(), mk, t, qd, 4),
                          _mm512_maskz_loadu_ps(mk, w + e), acc);
  }
  r = _mm512_reduce_add_ps(acc);
#endif
  for (; e < m; ++e) r += qd[idx[e]] * w[e];
  return r;
}

// IEEE half to float, for the builds without F16C
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu,
                 man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float f = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  const uint32_t bits = exp == 31 ? sign | 0x7f800000u | (man << 13)
                                  : sign | ((exp + 112) << 23) | (man << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// a compact row (each entry: 16-bit term number in the low half, float16 weight in the high)
// against the dense query over term numbers
inline float compact_dot(const float* qh, const uint32_t* p, int64_t m) {
  int64_t e = 0;
  float r = 0.f;
#if defined(SS_AVX512)
  __m512 acc = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi32(0xffff);
  for (; e < m; e += 16) {
    const __mmask16 mk = m - e >= 16 ? 0xffff : static_cast<__mmask16>((1u << (m - e)) - 1u);
    const __m512i x = _mm512_maskz_loadu_epi32(mk, p + e);
    const __m512 w = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(x, 16)));
    acc = _mm512_fmadd_ps(
        _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mk, _mm512_and_si512(x, low), qh, 4), w,
        acc);
  }
  r = _mm512_reduce_add_ps(acc);
#endif
  for (; e < m; ++e) r += qh[p[e] & 0xffffu] * half_to_float(static_cast<uint16_t>(p[e] >> 16));
  return r;
}

// a forward row to score: its position, where it starts, its length
struct Row {
  int64_t pos, start, len;
};

// every line of the row, so that the misses of a block's rows overlap
// every line of [p, p + bytes). In asm: GCC 12 drops _mm_prefetch loops under the branch in
// prefetch_row (no prefetch was emitted in seismic_search; docs/kernels.md)
inline void prefetch_lines(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) asm volatile("prefetcht0 %0" : : "m"(c[b]));
}

inline void prefetch_row(const SeismicArgs& a, const Row& r) {
  if (a.compact) {
    prefetch_lines(a.compact + r.start, 4 * r.len);
  } else {
    prefetch_lines(a.fi + r.start, 4 * r.len);
    prefetch_lines(a.fv + r.start, 4 * r.len);
  }
}

// the summary bounds of one list's blocks into acc: the query's terms (ascending, [qa, qb))
// met in the list's summary terms [c, c1) by galloping, each match's entries added
inline void list_bounds(const SeismicArgs& a, int64_t qa, int64_t qb, int64_t c, int64_t c1,
                        float* acc) {
  for (int64_t j = qa; j < qb && c < c1; ++j) {
    const uint32_t t = a.qi[j];
    if (a.comps[c] < t) {
      int64_t lo = c, step = 1;
      while (lo + step < c1 && a.comps[lo + step] < t) {
        lo += step;
        step <<= 1;
      }
      c = std::lower_bound(a.comps + lo + 1, a.comps + std::min(lo + step + 1, c1), t) -
          a.comps;
      if (c == c1) break;
    }
    if (a.comps[c] != t) continue;
    const float w = a.qv[j];
    for (int64_t e = a.comp_ptr[c]; e < a.comp_ptr[c + 1]; ++e)
      acc[a.ent_block[e]] += w * static_cast<float>(a.ent_code[e]);
    ++c;
  }
}

// what a thread reuses across queries and calls; zeroed after each query by what it touched
struct SeismicScratch {
  std::vector<float> qd, qh, acc;
  std::vector<uint8_t> seen;
  std::vector<int64_t> touched, heavy;
  std::vector<Row> rows;
  std::vector<Scored> top;
  std::vector<float> kth;  // with compact rows: the k best approximate scores (a min-heap)
};

}  // namespace

void seismic_search(const SeismicArgs& a, int64_t q_lo, int64_t q_hi) {
  thread_local SeismicScratch scratch;
  SeismicScratch& S = scratch;  // one TLS lookup, not one per use
  if (static_cast<int64_t>(S.qd.size()) < a.dim) S.qd.assign(a.dim, 0.f);
  if (a.compact && S.qh.size() < 65536) S.qh.assign(65536, 0.f);
  if (static_cast<int64_t>(S.seen.size()) < a.n_pos) S.seen.assign(a.n_pos, 0);
  float* qd = S.qd.data();
  float* qh = S.qh.data();
  uint8_t* seen = S.seen.data();
  auto& top = S.top;
  auto& kth = S.kth;
  // compact scores are approximate: twice the answers are kept, then scored exactly; blocks
  // are still skipped by the k-th best
  const int64_t kc = a.compact ? 2 * a.k : a.k;
  auto threshold = [&]() {
    return a.compact ? (static_cast<int64_t>(kth.size()) == a.k ? kth.front() : NEG_INF)
                     : (static_cast<int64_t>(top.size()) == a.k ? top.front().first : NEG_INF);
  };
  auto consider = [&](float s, int64_t pos) {
    if (a.compact && (static_cast<int64_t>(kth.size()) < a.k || s > kth.front())) {
      if (static_cast<int64_t>(kth.size()) == a.k) {
        std::pop_heap(kth.begin(), kth.end(), std::greater<float>());
        kth.pop_back();
      }
      kth.push_back(s);
      std::push_heap(kth.begin(), kth.end(), std::greater<float>());
    }
    if (static_cast<int64_t>(top.size()) < kc || s >= top.front().first) offer(top, kc, {s, pos});
  };
  for (int64_t q = q_lo; q < q_hi; ++q) {
    const int64_t qa = a.qp[q], qb = a.qp[q + 1];
    for (int64_t j = qa; j < qb; ++j) {
      qd[a.qi[j]] = a.qv[j];
      if (a.compact) qh[a.term_code[a.qi[j]]] = a.qv[j];
    }
    if (a.compact) qh[0xffff] = 0.f;  // the code of every term no compact row holds
    S.heavy.resize(qb - qa);
    for (int64_t j = 0; j < qb - qa; ++j) S.heavy[j] = qa + j;
    const int64_t cut = std::min<int64_t>(a.query_cut, qb - qa);
    std::partial_sort(S.heavy.begin(), S.heavy.begin() + cut, S.heavy.end(),
                      [&](int64_t x, int64_t y) {
                        return a.qv[x] > a.qv[y] || (a.qv[x] == a.qv[y] && x < y);
                      });
    S.touched.clear();
    top.clear();
    kth.clear();
    for (int64_t h = 0; h < cut; ++h) {
      const int64_t t = a.qi[S.heavy[h]];
      const int64_t b0 = a.term_blocks[t], nb = a.term_blocks[t + 1] - b0;
      if (static_cast<int64_t>(S.acc.size()) < nb) S.acc.resize(nb);
      float* acc = S.acc.data();
      std::fill(acc, acc + nb, 0.f);
      list_bounds(a, qa, qb, a.term_comps[t], a.term_comps[t + 1], acc);
      for (int64_t blk = 0; blk < nb; ++blk) {
        if (acc[blk] * a.scale[b0 + blk] < a.heap_factor * threshold()) continue;
        // two passes: the block's new rows located and all fetched at once (their misses
        // overlap), then scored
        S.rows.clear();
        for (int64_t e = a.block_docs_ptr[b0 + blk]; e < a.block_docs_ptr[b0 + blk + 1]; ++e) {
          const int64_t d = a.block_docs[e];
          if (seen[d]) continue;
          seen[d] = 1;
          S.touched.push_back(d);
          if (!a.ok[d]) continue;
          const Row r{d, a.fp[d], a.fp[d + 1] - a.fp[d]};
          prefetch_row(a, r);
          S.rows.push_back(r);
        }
        for (const Row& r : S.rows) {
          const float s = a.compact ? compact_dot(qh, a.compact + r.start, r.len)
                                    : gather_dot(qd, a.fi + r.start, a.fv + r.start, r.len);
          consider(s, r.pos);
        }
      }
    }
    for (int64_t d = a.n_main; d < a.n_pos; ++d) {
      if (!a.ok[d]) continue;
      const int64_t r0 = a.fp[d];
      consider(gather_dot(qd, a.fi + r0, a.fv + r0, a.fp[d + 1] - r0), d);
    }
    // the answers: scored exactly from the float32 rows, best first, ties to the smaller id
    for (Scored& c : top) {
      const int64_t r0 = a.fp[c.second];
      c = {gather_dot(qd, a.fi + r0, a.fv + r0, a.fp[c.second + 1] - r0), a.pos_ids[c.second]};
    }
    std::sort(top.begin(), top.end(), better);
    for (const int64_t d : S.touched) seen[d] = 0;
    for (int64_t j = qa; j < qb; ++j) {
      qd[a.qi[j]] = 0.f;
      if (a.compact) qh[a.term_code[a.qi[j]]] = 0.f;
    }
    for (int64_t t = 0; t < a.k; ++t) {
      const bool kept = t < static_cast<int64_t>(top.size());
      a.out_ids[q * a.k + t] = kept ? top[t].second : -1;
      a.out_scores[q * a.k + t] = kept ? top[t].first : NEG_INF;
    }
  }
}

namespace {

// sum_t qi[t] * c[t]: int8 query, 8-bit codes, exact in int32 (qi padded with zeros to 64)
inline int32_t dot_i8(const int8_t* qi, const uint8_t* c, int64_t d) {
#if defined(SS_AVX512)
  __m512i s = _mm512_setzero_si512();
  int64_t t = 0;
  for (; t + 64 <= d; t += 64)
    s = _mm512_dpbusd_epi32(s, _mm512_loadu_si512(c + t), _mm512_loadu_si512(qi + t));
  if (t < d) {
    __mmask64 m = (~uint64_t{0}) >> (64 - (d - t));
    s = _mm512_dpbusd_epi32(s, _mm512_maskz_loadu_epi8(m, c + t), _mm512_loadu_si512(qi + t));
  }
  return _mm512_reduce_add_epi32(s);
#elif defined(SS_AVX2)
  __m256i s = _mm256_setzero_si256();
  int64_t t = 0;
  for (; t + 16 <= d; t += 16) {
    __m256i cv = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + t)));
    __m256i qv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qi + t)));
    s = _mm256_add_epi32(s, _mm256_madd_epi16(cv, qv));
  }
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
  int32_t r = _mm_cvtsi128_si32(h);
  for (; t < d; ++t) r += static_cast<int32_t>(qi[t]) * c[t];
  return r;
#else
  int32_t r = 0;
  for (int64_t t = 0; t < d; ++t) r += static_cast<int32_t>(qi[t]) * c[t];
  return r;
#endif
}

// ---- graph search -------------------------------------------------------------------------

// Visited marks as one-byte epochs in a caller's reusable row (n bytes: L2-resident where
// int32 tags were 4n): each walk starts a new epoch; every 255th clears the row.
struct Visited {
  uint8_t* tag;
  int64_t n;
  uint8_t epoch;
  void next() {
    if (++epoch == 0) {
      std::memset(tag, 0, static_cast<size_t>(n));
      epoch = 1;
    }
  }
  bool mark(int32_t u) {  // true when u is new to this walk
    if (tag[u] == epoch) return false;
    tag[u] = epoch;
    return true;
  }
};

// The beam: ids, scores and expanded flags sorted by decreasing score, capacity cap
// (simsearch.graph._kernels.pool_insert).
struct Pool {
  std::vector<int32_t> ids;
  std::vector<float> s;
  std::vector<uint8_t> done;
  int64_t size = 0, cap = 0;
  explicit Pool(int64_t c) : ids(c), s(c), done(c) {}
  // returns the position, or -1 when rejected
  int64_t insert(int32_t node, float score) {
    if (size == cap && score <= s[size - 1]) return -1;
    int64_t lo = 0, hi = size;
    while (lo < hi) {
      int64_t mid = (lo + hi) >> 1;
      if (s[mid] >= score) lo = mid + 1; else hi = mid;
    }
    int64_t end = size < cap ? size : cap - 1;
    for (int64_t t = end; t > lo; --t) { ids[t] = ids[t - 1]; s[t] = s[t - 1]; done[t] = done[t - 1]; }
    ids[lo] = node; s[lo] = score; done[lo] = 0;
    if (size < cap) ++size;
    return lo;
  }
};

struct Scorer {
  const GraphArgs& a;
  const float* q;
  // with codes, q . x ~ qinv * (qi . code) + qc: qi = q * vstep scaled to int8 (so the sums
  // are exact integers: VNNI on AVX-512), padded with zeros to a multiple of 64
  std::vector<int8_t> qi;
  float qc = 0.f;    // q . vmin
  float qinv = 0.f;  // 1 / the int8 scale
  int64_t lines, window;
  Scorer(const GraphArgs& a_, const float* q_) : a(a_), q(q_) {
    if (a.codes) {
      std::vector<float> qs(a.d);
      float mx = 0.f;
      for (int64_t t = 0; t < a.d; ++t) {
        qs[t] = q[t] * a.vstep[t];
        qc += q[t] * a.vmin[t];
        mx = std::max(mx, std::fabs(qs[t]));
      }
      qi.assign((a.d + 63) / 64 * 64, 0);
      const float scale = mx > 0.f ? 127.f / mx : 1.f;
      for (int64_t t = 0; t < a.d; ++t) qi[t] = static_cast<int8_t>(std::nearbyint(qs[t] * scale));
      qinv = 1.f / scale;
      lines = (a.d + 63) / 64;
    } else {
      lines = (a.d * 4 + 63) / 64;
    }
    window = std::max<int64_t>(2, 32 / lines);  // ~32 lines in flight (12, 48: no faster)
  }
  float ip(int32_t u) const {
    if (a.codes)
      return static_cast<float>(dot_i8(qi.data(), a.codes + static_cast<int64_t>(u) * a.d, a.d)) *
                 qinv + qc;
    return dot(q, a.xb + static_cast<int64_t>(u) * a.d, a.d);
  }
#if defined(SS_AVX512)
  // four code rows at once, the four horizontal sums in one transpose-and-add
  void ip4(const int32_t* u, float* out) const {
    const uint8_t* c[4];
    for (int j = 0; j < 4; ++j) c[j] = a.codes + static_cast<int64_t>(u[j]) * a.d;
    __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                      _mm512_setzero_si512()};
    for (int64_t t = 0; t < a.d; t += 64) {
      const __m512i qv = _mm512_loadu_si512(qi.data() + t);
      const __mmask64 m = a.d - t >= 64 ? ~uint64_t{0} : (~uint64_t{0}) >> (64 - (a.d - t));
      for (int j = 0; j < 4; ++j)
        acc[j] = _mm512_dpbusd_epi32(acc[j], _mm512_maskz_loadu_epi8(m, c[j] + t), qv);
    }
    __m512i x = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[0], acc[1]),
                                 _mm512_unpackhi_epi32(acc[0], acc[1]));
    __m512i y = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[2], acc[3]),
                                 _mm512_unpackhi_epi32(acc[2], acc[3]));
    __m512i z = _mm512_add_epi32(_mm512_unpacklo_epi64(x, y), _mm512_unpackhi_epi64(x, y));
    __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(z), _mm512_extracti64x4_epi64(z, 1));
    __m128i r = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    _mm_storeu_ps(out, _mm_fmadd_ps(_mm_cvtepi32_ps(r), _mm_set1_ps(qinv), _mm_set1_ps(qc)));
  }
#endif
  mutable const int32_t* links = nullptr;  // the graph being walked, for prefetch_links
  mutable int64_t width = 0;
  void prefetch_links(int32_t u) const {
    const char* r = reinterpret_cast<const char*>(links + static_cast<int64_t>(u) * width);
    for (int64_t l = 0; l < width * 4; l += 64) _mm_prefetch(r + l, _MM_HINT_T0);
  }
  void prefetch(int32_t u) const {
    const char* p = a.codes ? reinterpret_cast<const char*>(a.codes + static_cast<int64_t>(u) * a.d)
                            : reinterpret_cast<const char*>(a.xb + static_cast<int64_t>(u) * a.d);
    for (int64_t l = 0; l < lines; ++l) _mm_prefetch(p + 64 * l, _MM_HINT_T0);
  }
};

// Score the unvisited neighbours of ``node`` into the pool; lowers ``cur`` when one lands
// before it. Returns the distance computations.
int64_t expand(const Scorer& sc, bool angular, const int32_t* row, int32_t deg, Visited& visited,
               Pool& pool, int64_t& cur, std::vector<int32_t>& fresh) {
  int64_t nf = 0;
  uint8_t* tag = visited.tag;
  int32_t* out = fresh.data();
  const uint8_t ep = visited.epoch;
  for (int32_t t = 0; t < deg; ++t) {  // branch-free: about half are visited already, at random
    const int32_t u = row[t];
    out[nf] = u;
    nf += tag[u] != ep;
    tag[u] = ep;
  }
  // a window of rows in flight ahead of the one scored: all at once overflows the CPU's
  // outstanding-miss buffers when rows span several cache lines
  const int64_t ahead = sc.window;
  for (int64_t t = 0; t < std::min(nf, ahead); ++t) sc.prefetch(fresh[t]);
  int64_t t = 0;
#if defined(SS_AVX512)
  if (sc.a.codes) {
    float s4[4];
    for (; t + 4 <= nf; t += 4) {
      for (int64_t j = t + ahead; j < std::min(nf, t + ahead + 4); ++j) sc.prefetch(fresh[j]);
      sc.ip4(&fresh[t], s4);
      for (int j = 0; j < 4; ++j) {
        const int32_t u = fresh[t + j];
        const float s = angular ? s4[j] * sc.a.inv_norm[u] : s4[j];
        int64_t pos = pool.insert(u, s);
        if (pos >= 0 && pos < cur) cur = pos;
      }
    }
  }
#endif
  for (; t < nf; ++t) {
    if (t + ahead < nf) sc.prefetch(fresh[t + ahead]);
    int32_t u = fresh[t];
    float s = sc.ip(u);
    if (angular) s *= sc.a.inv_norm[u];
    int64_t pos = pool.insert(u, s);
    if (pos >= 0 && pos < cur) cur = pos;
  }
  return nf;
}

// Expand the beam's best unexpanded entry until none is left; ``prefetch(u)`` is called on the
// likely next node while ``expand(node, cur)`` scores the current one's neighbours.
template <class Prefetch, class Expand>
int64_t best_first(Pool& pool, Prefetch prefetch, Expand expand_node) {
  int64_t ndis = 0, cur = 0;
  for (;;) {
    while (cur < pool.size && pool.done[cur]) ++cur;
    if (cur >= pool.size) break;
    pool.done[cur] = 1;
    int32_t node = pool.ids[cur];
    for (int64_t nx = cur + 1; nx < pool.size; ++nx) {
      if (!pool.done[nx]) {  // (two ahead measured no faster)
        prefetch(pool.ids[nx]);
        break;
      }
    }
    ndis += expand_node(node, cur);
  }
  return ndis;
}

int64_t best_first(const Scorer& sc, bool angular, const int32_t* links, int64_t width,
                   const int32_t* degree, Visited& visited, Pool& pool,
                   std::vector<int32_t>& fresh) {
  sc.links = links;
  sc.width = width;
  return best_first(
      pool,
      [&](int32_t u) {  // the likely next node's links
        sc.prefetch_links(u);
        _mm_prefetch(reinterpret_cast<const char*>(degree + u), _MM_HINT_T0);
      },
      [&](int32_t node, int64_t& cur) {
        return expand(sc, angular, links + static_cast<int64_t>(node) * width, degree[node],
                      visited, pool, cur, fresh);
      });
}

// The inner-product walk on the quantized graph: a node's blocks give estimates for all its
// neighbours at once; the unvisited ones enter the beam.
struct QuantizedWalk {
  const GraphArgs& a;
  const void* lut_vecs;
  float scale, bias;
  int64_t stride;
  std::vector<float> est;
  std::vector<int32_t> fresh;
  const float* q = nullptr;
  std::vector<std::pair<float, int32_t>> exact;  // every expanded live node, scored exactly
  QuantizedWalk(const GraphArgs& a_)
      : a(a_), lut_vecs(nullptr), scale(0.f), bias(0.f), stride(a_.q_pairs * 32 + 32),
        est((a_.width + 31) / 32 * 32 + 64), fresh(a_.width + 1) {}
  // node u's blocks start at block u * q_per_node: no index to load before the prefetch
  void prefetch(int32_t u) const {
    _mm_prefetch(reinterpret_cast<const char*>(a.links + static_cast<int64_t>(u) * a.width),
                 _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(a.degree + u), _MM_HINT_T0);
    const char* p = reinterpret_cast<const char*>(a.qblocks + u * a.q_per_node * stride);
    for (int64_t l = 0; l < a.q_per_node * stride; l += 64) _mm_prefetch(p + l, _MM_HINT_T0);
    const char* v = reinterpret_cast<const char*>(a.xb + static_cast<int64_t>(u) * a.d);
    for (int64_t l = 0; l < a.d * 4; l += 64) _mm_prefetch(v + l, _MM_HINT_T0);
  }
  int64_t expand(int32_t node, Visited& visited, Pool& pool, int64_t& cur) {
    if (a.live[node]) exact.emplace_back(dot(q, a.xb + static_cast<int64_t>(node) * a.d, a.d), node);
    const int32_t* row = a.links + static_cast<int64_t>(node) * a.width;
    // the blocks the node's degree fills (a node owns room for its whole row)
    const int64_t b = node * a.q_per_node;
    const int64_t b_end = b + std::min<int64_t>(a.q_per_node, (a.degree[node] + 31) / 32);
    const int64_t deg = std::min<int64_t>(a.degree[node], 32 * (b_end - b));
    int64_t nf = 0;
    uint8_t* tag = visited.tag;
    const uint8_t ep = visited.epoch;
    for (int64_t t = 0; t < deg; ++t) {  // branch-free, as expand()
      const int32_t u = row[t];
      fresh[nf] = static_cast<int32_t>(t);
      nf += tag[u] != ep;
      tag[u] = ep;
    }
    if (nf == 0) return 0;
    block_estimates(a.qblocks, a.q_pairs, b, b_end, lut_vecs, a.norm_codebook, scale, bias,
                    est.data());
    for (int64_t f = 0; f < nf; ++f) {
      const int32_t t = fresh[f];
      int64_t pos = pool.insert(row[t], est[t]);
      if (pos >= 0 && pos < cur) cur = pos;
    }
    return nf;
  }
};

}  // namespace

void graph_search(const GraphArgs& a, int64_t q_lo, int64_t q_hi, uint8_t* visited_row,
                  uint8_t* epoch) {
  const int64_t cap = std::max(a.ef, a.angular_ef);
  Pool pool(cap);
  std::vector<int32_t> seeds(a.angular_ef);
  std::vector<int32_t> fresh(std::max(a.width, std::max(a.a_width0, a.a_width1)) + 1);
  std::vector<std::pair<float, int32_t>> best;
  Visited visited{visited_row, a.n, *epoch};
  QuantizedWalk qw(a);
  LutVecs lv(a.qblocks ? a.q_pairs : 0);
  for (int64_t i = q_lo; i < q_hi; ++i) {
    const float* q = a.Q + i * a.d;
    Scorer sc(a, q);
    if (a.qblocks) {
      qw.q = q;
      qw.exact.clear();
      qw.lut_vecs = lv.load(a.luts + i * 2 * a.q_pairs * 16);
      qw.scale = a.lut_scale[i];
      qw.bias = a.lut_bias[i];
    }
    visited.next();
    // angular HNSW: greedy through the upper levels, then best-first with beam angular_ef
    int32_t cur_node = static_cast<int32_t>(a.a_entry);
    float best_s = sc.ip(cur_node) * a.inv_norm[cur_node];
    int64_t nd_a = 1;
    for (int64_t level = a.a_max_level; level > 0; --level) {
      bool changed = true;
      while (changed) {
        changed = false;
        int64_t row = a.a_upper_start[cur_node] + level - 1;
        const int32_t* lk = a.a_upper_links + row * a.a_width1;
        int32_t deg = a.a_upper_degree[row];
        for (int32_t t = 0; t < deg; ++t) sc.prefetch(lk[t]);
        for (int32_t t = 0; t < deg; ++t) {
          int32_t u = lk[t];
          float s = sc.ip(u) * a.inv_norm[u];
          ++nd_a;
          if (s > best_s) { best_s = s; cur_node = u; changed = true; }
        }
      }
    }
    visited.mark(cur_node);
    pool.size = 0;
    pool.cap = a.angular_ef;
    pool.insert(cur_node, best_s);
    nd_a += best_first(sc, true, a.a_links0, a.a_width0, a.a_degree0, visited, pool, fresh);
    const int64_t n_seeds = pool.size;
    std::copy(pool.ids.begin(), pool.ids.begin() + n_seeds, seeds.begin());
    // the seeded inner-product search
    visited.next();
    pool.size = 0;
    pool.cap = a.ef;
    int64_t nd_ip = 0;
    for (int64_t t = 0; t < n_seeds; ++t) {
      int32_t s = seeds[t];
      if (!visited.mark(s)) continue;
      ++nd_ip;
      int64_t pos = pool.insert(s, sc.ip(s));
      if (pos >= 0) pool.done[pos] = 1;  // expanded just below
    }
    int64_t cur = 0;
    if (a.qblocks) {
      for (int64_t t = 0; t < n_seeds; ++t) nd_ip += qw.expand(seeds[t], visited, pool, cur);
      nd_ip += best_first(pool, [&](int32_t u) { qw.prefetch(u); },
                          [&](int32_t node, int64_t& c) {
                            return qw.expand(node, visited, pool, c);
                          });
    } else {
      for (int64_t t = 0; t < n_seeds; ++t) {
        int32_t s = seeds[t];
        nd_ip += expand(sc, false, a.links + static_cast<int64_t>(s) * a.width, a.degree[s],
                        visited, pool, cur, fresh);
      }
      nd_ip += best_first(sc, false, a.links, a.width, a.degree, visited, pool, fresh);
    }
    a.out_ndis[2 * i] = nd_a;
    a.out_ndis[2 * i + 1] = nd_ip;
    int32_t* op = a.out_pos + i * a.k;
    float* os = a.out_scores + i * a.k;
    int64_t j = 0;
    if (a.qblocks) {  // the best of the expanded nodes, scored exactly as they were expanded
      auto& ex = qw.exact;
      const int64_t m = std::min<int64_t>(a.k, ex.size());
      std::partial_sort(ex.begin(), ex.begin() + m, ex.end(),
                        [](const auto& x, const auto& y) {
                          return x.first > y.first || (x.first == y.first && x.second < y.second);
                        });
      for (; j < m; ++j) { op[j] = ex[j].second; os[j] = ex[j].first; }
    } else if (a.codes) {  // exact re-rank of the beam's best live entries
      best.clear();
      const int64_t depth = std::max(a.k, a.rerank);
      for (int64_t t = 0; t < pool.size && static_cast<int64_t>(best.size()) < depth; ++t) {
        int32_t u = pool.ids[t];
        if (a.live[u]) best.emplace_back(0.f, u);
      }
      for (auto& e : best) _mm_prefetch(reinterpret_cast<const char*>(a.xb + static_cast<int64_t>(e.second) * a.d), _MM_HINT_T0);
      for (auto& e : best) e.first = dot(q, a.xb + static_cast<int64_t>(e.second) * a.d, a.d);
      const int64_t m = std::min<int64_t>(a.k, best.size());
      std::partial_sort(best.begin(), best.begin() + m, best.end(),
                        [](const auto& x, const auto& y) {
                          return x.first > y.first || (x.first == y.first && x.second < y.second);
                        });
      for (; j < m; ++j) { op[j] = best[j].second; os[j] = best[j].first; }
    } else {
      for (int64_t t = 0; t < pool.size && j < a.k; ++t) {
        int32_t u = pool.ids[t];
        if (a.live[u]) { op[j] = u; os[j] = pool.s[t]; ++j; }
      }
    }
    for (; j < a.k; ++j) { op[j] = -1; os[j] = NEG_INF; }
  }
  *epoch = visited.epoch;
}

}  // namespace SIMSEARCH_NS
}  // namespace simsearch
