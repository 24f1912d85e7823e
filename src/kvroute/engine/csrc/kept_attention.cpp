// Attention of the query rows of each (KV head, cell) over that cell's kept context entries only.
//
// The masked engine's forwards attend, for every cell of a batch and every KV head, R query rows (the G query heads of
// the group times the forward's queries: R = G for a decode step) over the shared context K/V, of which the cell keeps
// a subset. The dense kernels multiply all T keys and drop the masked scores; this kernel visits the kept positions
// alone (a CSR list per (KV head, cell)), reading each kept key and value row once per (KV head, cell) and step, with
// an online softmax over blocks of kept entries. Work items are (KV head, a run of cells) walking the context in spans,
// so a span's keys and values stay in cache for the run's cells. Scores of a few rows are dot products (four keys'
// horizontal sums at once); of many rows, products with 32 keys held transposed; value products are blocked over rows.
// Given the cells' own suffix (their question and answer so far), the online softmax goes on over it, causally, and the
// output is the whole attention; without it, the output is the context part and each row's log-sum-exp, which
// kvroute.engine.streaming.with_suffix joins with the suffix as it does for PyTorch's fused kernel. float32 in, float32
// out; accumulation in float32.
#include <torch/extension.h>
#include <immintrin.h>
#include <omp.h>

#if !defined(__AVX512F__)
#error "kvroute's kept-entries attention kernel needs AVX-512 (the masked engine falls back to PyTorch's kernels)"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kBlock = 128;  // kept entries per online-softmax step (their scores stay in L1)
constexpr int64_t kSpan = 512;   // context positions whose keys and values the cells of a work item share in cache
constexpr int64_t kRun = 8;      // cells per work item, at most
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// exp(x) of 16 lanes (Cephes' single-precision polynomial after range reduction, relative error about 1e-7; 2^n
// applied by scalef, so that a lane below about -87 goes to 0 and -inf to exactly 0).
inline __m512 exp16(__m512 x) {
  const __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f),
                                                         _mm512_set1_ps(0.5f)),
                                         _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
  const __m512 z = _mm512_mul_ps(r, r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_add_ps(_mm512_fmadd_ps(y, z, r), _mm512_set1_ps(1.0f));
  // x = -inf gives fx = -inf and r = NaN: those lanes are 0
  const __mmask16 finite = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-1e30f), _CMP_GT_OQ);
  return _mm512_maskz_scalef_ps(finite, y, fx);
}

inline float exp1(float x) { return _mm512_cvtss_f32(exp16(_mm512_set1_ps(x))); }

// The online-softmax state of one (KV head, cell) pair: R query rows of NV·16 floats, their output so far (``out``,
// unnormalised), running maximum ``m`` and running sum ``l``.
template <int NV>
struct Pair {
  const float* q;
  float* out;
  float* m;
  float* l;
};

// r[x] lane t becomes r[t] lane x: a 16×16 transpose in registers (64 shuffles in place of 256 scalar copies)
inline void transpose16(__m512* r) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  auto lo = [](__m512 a, __m512 b) {
    return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
  };
  auto hi = [](__m512 a, __m512 b) {
    return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
  };
  for (int g = 0; g < 16; g += 4) {
    r[g] = lo(t[g], t[g + 2]);
    r[g + 1] = hi(t[g], t[g + 2]);
    r[g + 2] = lo(t[g + 1], t[g + 3]);
    r[g + 3] = hi(t[g + 1], t[g + 3]);
  }
  for (int g = 0; g < 16; g += 8) {
    for (int i = 0; i < 4; ++i) {
      t[g + i] = _mm512_shuffle_f32x4(r[g + i], r[g + 4 + i], 0x88);
      t[g + 4 + i] = _mm512_shuffle_f32x4(r[g + i], r[g + 4 + i], 0xdd);
    }
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xdd);
  }
}
// Scores of rows [r0, r0 + RB) against 32 keys held transposed in ``kt`` ([NV·16 dims][32 keys]): two FMAs per
// (row, dimension) cover the 32 keys, with no horizontal sum (the form for many rows per pair). A dimension's two key
// registers serve the RB row broadcasts, so that with 12 rows the loop issues fewer loads than FMAs.
template <int NV, int RB>
inline void scores_transposed(const float* __restrict q, int64_t r0, const float* __restrict kt, float scale,
                              float* __restrict s) {
  constexpr int64_t d = NV * 16;
  __m512 acc[RB][2];
  for (int i = 0; i < RB; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t x = 0; x < d; ++x) {
    const __m512 k0 = _mm512_loadu_ps(kt + 32 * x), k1 = _mm512_loadu_ps(kt + 32 * x + 16);
    for (int i = 0; i < RB; ++i) {
      const __m512 qx = _mm512_set1_ps(q[(r0 + i) * d + x]);
      acc[i][0] = _mm512_fmadd_ps(qx, k0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(qx, k1, acc[i][1]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int i = 0; i < RB; ++i) {
    _mm512_storeu_ps(s + (r0 + i) * kBlock, _mm512_mul_ps(acc[i][0], sc));
    _mm512_storeu_ps(s + (r0 + i) * kBlock + 16, _mm512_mul_ps(acc[i][1], sc));
  }
}

// out rows [r0, r0 + RB) += their probabilities in ``s`` times the nb value rows ``idx``: each value row loaded
// once for the RB rows, whose outputs stay in registers across the step. With few accumulators (RB·NV ≤ 8) two
// sets take alternate value rows, so that consecutive products do not wait on each other's sums.
template <int NV, int RB>
inline void values_rows(float* __restrict out, int64_t r0, const float* __restrict v, int64_t vs,
                        const int32_t* __restrict idx, int64_t nb, const float* __restrict s) {
  constexpr int64_t d = NV * 16;
  constexpr int U = RB * NV <= 8 ? 2 : 1;
  __m512 acc[U][RB][NV];
  for (int i = 0; i < RB; ++i) {
    for (int c = 0; c < NV; ++c) {
      acc[0][i][c] = _mm512_loadu_ps(out + (r0 + i) * d + 16 * c);
      for (int u = 1; u < U; ++u) acc[u][i][c] = _mm512_setzero_ps();
    }
  }
  int64_t jj = 0;
  for (; jj + U <= nb; jj += U) {
    for (int u = 0; u < U; ++u) {
      const float* vr = v + static_cast<int64_t>(idx[jj + u]) * vs;
      __m512 vv[NV];
      for (int c = 0; c < NV; ++c) vv[c] = _mm512_loadu_ps(vr + 16 * c);
      for (int i = 0; i < RB; ++i) {
        const __m512 e = _mm512_set1_ps(s[(r0 + i) * kBlock + jj + u]);
        for (int c = 0; c < NV; ++c) acc[u][i][c] = _mm512_fmadd_ps(e, vv[c], acc[u][i][c]);
      }
    }
  }
  for (; jj < nb; ++jj) {
    const float* vr = v + static_cast<int64_t>(idx[jj]) * vs;
    for (int i = 0; i < RB; ++i) {
      const __m512 e = _mm512_set1_ps(s[(r0 + i) * kBlock + jj]);
      for (int c = 0; c < NV; ++c) acc[0][i][c] = _mm512_fmadd_ps(e, _mm512_loadu_ps(vr + 16 * c), acc[0][i][c]);
    }
  }
  for (int i = 0; i < RB; ++i) {
    for (int c = 0; c < NV; ++c) {
      __m512 t = acc[0][i][c];
      for (int u = 1; u < U; ++u) t = _mm512_add_ps(t, acc[u][i][c]);
      _mm512_storeu_ps(out + (r0 + i) * d + 16 * c, t);
    }
  }
}

// the value products of rows [r0, r0 + n) for n < RB (the rows left after whole register blocks), as one block
template <int NV, int RB>
inline void values_tail(float* __restrict out, int64_t r0, int64_t n, const float* __restrict v, int64_t vs,
                        const int32_t* __restrict idx, int64_t nb, const float* __restrict s) {
  if constexpr (RB > 1) {
    if (n == RB - 1) {
      values_rows<NV, RB - 1>(out, r0, v, vs, idx, nb, s);
    } else if (n > 0) {
      values_tail<NV, RB - 1>(out, r0, n, v, vs, idx, nb, s);
    }
  }
}

// lane t of the result: the sum of the 16 lanes of a[t], t < 4 (the four sums of a group of keys share their shuffles)
inline __m128 hsum4(const __m512* a) {
  // per 128-bit lane: a[0] a[1] a[2] a[3] pairwise, then the pairs, so lane t of each 128-bit part sums part of a[t]
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a[0], a[1]), _mm512_unpackhi_ps(a[0], a[1]));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(a[2], a[3]), _mm512_unpackhi_ps(a[2], a[3]));
  const __m512 x = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));
  // the four 128-bit parts added: halves, then quarters
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// keys per group of the few-rows scores: their key registers (KG·NV) stay within the 32 beside the sums
template <int NV>
constexpr int kKeyGroup = NV <= 4 ? 4 : (NV <= 8 ? 2 : 1);

// rows per register block of the value products: RB·NV accumulators and NV value registers within the 32
template <int NV>
constexpr int kValueRows = NV <= 4 ? 4 : (NV <= 5 ? 3 : (NV <= 8 ? 2 : 1));
// from this many rows per pair the scores take the transposed form (its transpose is repaid over the rows)
constexpr int64_t kTransposeRows = 12;

// One step of pair ``p`` over ``nb`` ≤ kBlock kept rows ``idx`` of k/v (row strides ks, vs); ``s``: [R, kBlock]
// scratch; ``kt``: [NV·16, 32] scratch.
template <int NV>
inline void pair_step(const Pair<NV>& p, int64_t R, const float* __restrict k, const float* __restrict v, int64_t ks,
                      int64_t vs, const int32_t* __restrict idx, int64_t nb, float scale, float* __restrict s,
                      float* __restrict kt, int64_t causal_q = 0, int64_t causal_last = 0) {
  constexpr int64_t d = NV * 16;
  const int64_t nv = (nb + 15) / 16 * 16;  // scores padded to whole registers with -inf
  if (R >= kTransposeRows) {
    for (int64_t j0 = 0; j0 < nb; j0 += 32) {  // 32 keys at a time, transposed (a short group repeats its last key)
      const int64_t m = std::min<int64_t>(32, nb - j0);
      for (int g = 0; g < 2; ++g) {
        const float* kr[16];
        for (int64_t t = 0; t < 16; ++t) kr[t] = k + static_cast<int64_t>(idx[j0 + std::min(16 * g + t, m - 1)]) * ks;
        for (int c = 0; c < NV; ++c) {  // dimensions 16c … 16c + 15 of the 16 keys, transposed into kt's half g
          __m512 rows[16];
          for (int t = 0; t < 16; ++t) rows[t] = _mm512_loadu_ps(kr[t] + 16 * c);
          transpose16(rows);
          for (int x = 0; x < 16; ++x) _mm512_storeu_ps(kt + 32 * (16 * c + x) + 16 * g, rows[x]);
        }
      }
      int64_t r = 0;  // the scores of keys past nb (at most kBlock) are set to -inf below
      for (; r + 12 <= R; r += 12) scores_transposed<NV, 12>(p.q, r, kt, scale, s + j0);
      for (; r + 4 <= R; r += 4) scores_transposed<NV, 4>(p.q, r, kt, scale, s + j0);
      for (; r < R; ++r) scores_transposed<NV, 1>(p.q, r, kt, scale, s + j0);
    }
  } else {
    constexpr int KG = kKeyGroup<NV>;
    const __m128 sc = _mm_set1_ps(scale);
    for (int64_t j0 = 0; j0 < nb; j0 += KG) {  // KG keys at a time (a short group repeats its last key)
      __m512 kv[4][NV];
      for (int t = 0; t < KG; ++t) {
        const float* kr = k + static_cast<int64_t>(idx[std::min<int64_t>(j0 + t, nb - 1)]) * ks;
        for (int c = 0; c < NV; ++c) kv[t][c] = _mm512_loadu_ps(kr + 16 * c);
      }
      for (int64_t r = 0; r < R; ++r) {
        const float* qr = p.q + r * d;
        __m512 acc[4];
        const __m512 q0 = _mm512_loadu_ps(qr);
        for (int t = 0; t < KG; ++t) acc[t] = _mm512_mul_ps(q0, kv[t][0]);
        for (int c = 1; c < NV; ++c) {
          const __m512 qc = _mm512_loadu_ps(qr + 16 * c);
          for (int t = 0; t < KG; ++t) acc[t] = _mm512_fmadd_ps(qc, kv[t][c], acc[t]);
        }
        for (int t = KG; t < 4; ++t) acc[t] = _mm512_setzero_ps();
        // the group's KG scores only: a wider store would run past the row (KG < 4) into the next one
        _mm_mask_storeu_ps(s + r * kBlock + j0, static_cast<__mmask8>((1 << KG) - 1), _mm_mul_ps(hsum4(acc), sc));
      }
    }
  }
  for (int64_t r = 0; r < R; ++r) {  // online softmax over the step
    float* sr = s + r * kBlock;
    for (int64_t jj = nb; jj < nv; ++jj) sr[jj] = kNegInf;
    if (causal_q > 1) {  // suffix entries after the row's own query position (row r is query r % causal_q)
      const int32_t last = static_cast<int32_t>(causal_last + r % causal_q);
      for (int64_t jj = 0; jj < nb; ++jj) {
        if (idx[jj] > last) sr[jj] = kNegInf;
      }
    }
    __m512 mx = _mm512_set1_ps(kNegInf);
    for (int64_t jj = 0; jj < nv; jj += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(sr + jj));
    const float m_new = std::max(p.m[r], _mm512_reduce_max_ps(mx));
    const float corr = p.m[r] == kNegInf ? 0.0f : exp1(p.m[r] - m_new);
    const __m512 mv = _mm512_set1_ps(m_new);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t jj = 0; jj < nv; jj += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sr + jj), mv));
      _mm512_storeu_ps(sr + jj, e);
      sum = _mm512_add_ps(sum, e);
    }
    p.l[r] = p.l[r] * corr + _mm512_reduce_add_ps(sum);
    p.m[r] = m_new;
    if (corr != 1.0f) {
      float* o = p.out + r * d;
      const __m512 cv = _mm512_set1_ps(corr);
      for (int c = 0; c < NV; ++c) _mm512_storeu_ps(o + 16 * c, _mm512_mul_ps(_mm512_loadu_ps(o + 16 * c), cv));
    }
  }
  constexpr int RB = kValueRows<NV>;
  int64_t r = 0;
  for (; r + RB <= R; r += RB) values_rows<NV, RB>(p.out, r, v, vs, idx, nb, s);
  values_tail<NV, RB>(p.out, r, R - r, v, vs, idx, nb, s);
}

// The cells' own suffix, attended after the context when given: keys and values [B, H, s, D] (any strides but the
// last), the queries the last ``q`` of its s positions (causal), ``own`` bool [B, s] (nullptr: every slot is the
// cell's) the slots each cell may see.
struct Suffix {
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t kb = 0, kh = 0, kr = 0, vb = 0, vh = 0, vr = 0;
  int64_t s = 0, q = 1;
  const bool* own = nullptr;
  int64_t own_stride = 0;
};

// context positions per work item of the few-rows form (run_all): a fixed number, so that the order of the sums,
// and so the rounding, does not depend on the thread count
constexpr int64_t kChunk = 512;
// at most this many context chunks per KV head (a longer context takes longer chunks)
constexpr int64_t kMaxChunks = 64;

template <int NV>
void run_all(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const int64_t* offsets,
             const int32_t* idx, float scale, const Suffix& suf, torch::Tensor& out, torch::Tensor& lse) {
  constexpr int64_t d = NV * 16;
  const int64_t H = q.size(0), B = q.size(1), R = q.size(2), T = k.size(1);
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  float* lp = lse.data_ptr<float>();
  const int64_t ks0 = k.stride(0), ks1 = k.stride(1), vs0 = v.stride(0), vs1 = v.stride(1);
  out.zero_();
  // Work items walk a KV head's context in spans of kSpan positions and step every cell of the item through its kept
  // entries in the span, so that the span's keys and values stay in the core's cache for all of them. With many rows
  // per pair (a question forward) an item is (KV head, a run of cells) over the whole context: the rows repay each
  // key read. With few (a decode step) an item is (KV head, a chunk of the context) with every cell of the batch, so
  // that each key and value is fetched into cache once per forward; the chunks' partial softmax states are merged
  // after.
  const int threads = std::max(1, at::get_num_threads());
  const bool few = R < kTransposeRows;
  const int64_t per_item =
      few ? std::max<int64_t>(B, 1)
          : std::max<int64_t>(1, std::min<int64_t>(kRun, (H * B + 2 * threads - 1) / (2 * threads)));
  const int64_t runs = (B + per_item - 1) / per_item;
  const int64_t chunk = few ? std::max(kChunk, (T + kMaxChunks - 1) / kMaxChunks) : std::max<int64_t>(T, 1);
  const int64_t C = std::max<int64_t>(1, (T + chunk - 1) / chunk);
  const int64_t items = H * runs * C, pairs = H * B;
  // per chunk and row: running maximum and sum; chunk 0's outputs go to ``out``, the others' to ``rest``
  std::vector<float> ms(C * pairs * R, kNegInf), ls(C * pairs * R, 0.0f), rest((C - 1) * pairs * R * d, 0.0f);
  auto state = [&](int64_t c, int64_t pr) {
    return Pair<NV>{qp + pr * R * d, c == 0 ? op + pr * R * d : rest.data() + ((c - 1) * pairs + pr) * R * d,
                    ms.data() + (c * pairs + pr) * R, ls.data() + (c * pairs + pr) * R};
  };
#pragma omp parallel num_threads(std::min<int64_t>(threads, std::max(items, pairs)))
  {
    std::vector<float> sbuf(R * kBlock), kt(d * 32);
    std::vector<int64_t> cur(per_item);
    std::vector<int32_t> seen(suf.s);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t h = it / (runs * C), run = it % (runs * C) / C, c = it % C;
      const int64_t b0 = run * per_item, b1 = std::min(B, b0 + per_item);
      const int64_t a0 = c * chunk, a1 = std::min(T, a0 + chunk);
      const float* kh = kp + h * ks0;
      const float* vh = vp + h * vs0;
      for (int64_t b = b0; b < b1; ++b) {  // each cell's first kept entry in the chunk
        const int64_t pr = h * B + b;
        cur[b - b0] = std::lower_bound(idx + offsets[pr], idx + offsets[pr + 1], static_cast<int32_t>(a0)) - idx;
      }
      for (int64_t a = a0; a < a1; a += kSpan) {
        const int32_t end = static_cast<int32_t>(std::min(a1, a + kSpan));
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t pr = h * B + b;
          int64_t j = cur[b - b0];
          const int64_t stop = offsets[pr + 1];
          const Pair<NV> p = state(c, pr);
          while (j < stop && idx[j] < end) {
            int64_t e = j;
            while (e < stop && e - j < kBlock && idx[e] < end) ++e;
            pair_step<NV>(p, R, kh, vh, ks1, vs1, idx + j, e - j, scale, sbuf.data(), kt.data());
            j = e;
          }
          cur[b - b0] = j;
        }
      }
    }
    // per pair: the chunks' states merged into chunk 0's, the cell's own suffix (causal), the normalisation
#pragma omp for schedule(dynamic, 4)
    for (int64_t pr = 0; pr < pairs; ++pr) {
      const int64_t h = pr / B, b = pr % B;
      const Pair<NV> p = state(0, pr);
      for (int64_t c = 1; c < C; ++c) {
        const Pair<NV> pc = state(c, pr);
        for (int64_t r = 0; r < R; ++r) {
          if (pc.m[r] == kNegInf) continue;  // the chunk kept nothing of this pair
          const float m_new = std::max(p.m[r], pc.m[r]);
          const float w0 = p.m[r] == kNegInf ? 0.0f : exp1(p.m[r] - m_new), wc = exp1(pc.m[r] - m_new);
          const __m512 w0v = _mm512_set1_ps(w0), wcv = _mm512_set1_ps(wc);
          float* o = p.out + r * d;
          const float* oc = pc.out + r * d;
          for (int x = 0; x < NV; ++x) {
            _mm512_storeu_ps(o + 16 * x, _mm512_fmadd_ps(_mm512_loadu_ps(oc + 16 * x), wcv,
                                                         _mm512_mul_ps(_mm512_loadu_ps(o + 16 * x), w0v)));
          }
          p.l[r] = p.l[r] * w0 + pc.l[r] * wc;
          p.m[r] = m_new;
        }
      }
      if (suf.k != nullptr) {
        int64_t n = 0;
        for (int64_t j = 0; j < suf.s; ++j) {
          if (suf.own == nullptr || suf.own[b * suf.own_stride + j]) seen[n++] = static_cast<int32_t>(j);
        }
        for (int64_t j = 0; j < n; j += kBlock) {
          pair_step<NV>(p, R, suf.k + b * suf.kb + h * suf.kh, suf.v + b * suf.vb + h * suf.vh, suf.kr, suf.vr,
                        seen.data() + j, std::min<int64_t>(kBlock, n - j), scale, sbuf.data(), kt.data(), suf.q,
                        suf.s - suf.q);
        }
      }
      for (int64_t r = 0; r < R; ++r) {
        const float mr = p.m[r], lr = p.l[r];
        float* o = p.out + r * d;
        if (lr > 0.0f) {
          const __m512 inv = _mm512_set1_ps(1.0f / lr);
          for (int c = 0; c < NV; ++c) _mm512_storeu_ps(o + 16 * c, _mm512_mul_ps(_mm512_loadu_ps(o + 16 * c), inv));
          lp[pr * R + r] = mr + std::log(lr);
        } else {
          lp[pr * R + r] = kNegInf;
        }
      }
    }
  }
}

}  // namespace

// q [H, B, R, D] float32; k, v [H, T, D] float32 (last dim contiguous); offsets int64 [H*B + 1] into idx (int32, the
// kept positions of pair h*B + b in ascending order). Returns (out [H, B, R, D], lse [H, B, R]): the attention of
// each row over the pair's kept keys, and the log of its softmax normaliser (−inf, with out 0, where none is kept).
// With ``ks``/``vs`` [B, H, s, D] (the cells' own suffix, whose last ``nq`` positions are the queries': rows in
// (group head, query) order, row r being query r % nq) and ``own`` (bool [B, s] or None), the softmax runs over the
// kept context and then the suffix, causally: ``out`` is then the whole attention and ``lse`` its joint normaliser.
std::vector<torch::Tensor> kept_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor offsets,
                                          torch::Tensor idx, double scale, c10::optional<torch::Tensor> ks,
                                          c10::optional<torch::Tensor> vs, c10::optional<torch::Tensor> own,
                                          int64_t nq) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 3 && v.dim() == 3, "kept_attention: q [H,B,R,D], k/v [H,T,D]");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              "kept_attention: float32 only");
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1, "kept_attention: k/v rows must be contiguous");
  TORCH_CHECK(offsets.scalar_type() == at::kLong && idx.scalar_type() == at::kInt, "kept_attention: index dtypes");
  q = q.contiguous();
  offsets = offsets.contiguous();
  idx = idx.contiguous();
  const int64_t H = q.size(0), B = q.size(1), R = q.size(2), d = q.size(3);
  TORCH_CHECK(k.size(0) == H && v.size(0) == H && k.size(2) == d && v.size(2) == d, "kept_attention: shapes");
  TORCH_CHECK(offsets.numel() == H * B + 1, "kept_attention: offsets must have H*B + 1 entries");
  auto out = torch::empty({H, B, R, d}, q.options());
  auto lse = torch::empty({H, B, R}, q.options());
  const int64_t* off = offsets.data_ptr<int64_t>();
  const int32_t* ip = idx.data_ptr<int32_t>();
  // the index is read without further checks below: a CSR list whose rows stay inside idx and whose positions
  // stay inside the context, or an error (one pass over the index, small beside the attention itself)
  const int64_t T = k.size(1), nnz = idx.numel();
  TORCH_CHECK(v.size(1) == T, "kept_attention: k and v must have the same context length");
  TORCH_CHECK(off[0] == 0 && off[H * B] == nnz, "kept_attention: offsets must run from 0 to idx.numel()");
  for (int64_t r = 0; r < H * B; ++r)
    TORCH_CHECK(off[r] <= off[r + 1], "kept_attention: offsets must not decrease (row ", r, ")");
  for (int64_t j = 0; j < nnz; ++j)
    TORCH_CHECK(ip[j] >= 0 && ip[j] < T, "kept_attention: index ", ip[j], " at ", j, " outside the context of ", T);
  const float sc = static_cast<float>(scale);
  Suffix suf;
  torch::Tensor own_c;
  if (ks.has_value()) {
    TORCH_CHECK(vs.has_value(), "kept_attention: the suffix needs keys and values");
    const torch::Tensor& sk = *ks;
    const torch::Tensor& sv = *vs;
    TORCH_CHECK(sk.dim() == 4 && sv.dim() == 4 && sk.size(0) == B && sk.size(1) == H && sk.size(3) == d &&
                    sv.sizes() == sk.sizes(), "kept_attention: suffix keys and values must be [B, H, s, D]");
    TORCH_CHECK(sk.scalar_type() == at::kFloat && sv.scalar_type() == at::kFloat && sk.stride(3) == 1 &&
                    sv.stride(3) == 1, "kept_attention: suffix float32 with contiguous rows");
    TORCH_CHECK(nq >= 1 && nq <= sk.size(2) && R % nq == 0, "kept_attention: nq queries among the suffix positions");
    suf.k = sk.data_ptr<float>();
    suf.v = sv.data_ptr<float>();
    suf.kb = sk.stride(0), suf.kh = sk.stride(1), suf.kr = sk.stride(2);
    suf.vb = sv.stride(0), suf.vh = sv.stride(1), suf.vr = sv.stride(2);
    suf.s = sk.size(2), suf.q = nq;
    if (own.has_value()) {
      own_c = own->contiguous();
      TORCH_CHECK(own_c.scalar_type() == at::kBool && own_c.dim() == 2 && own_c.size(0) == B &&
                      own_c.size(1) >= suf.s, "kept_attention: own must be bool [B, >= s]");
      suf.own = own_c.data_ptr<bool>();
      suf.own_stride = own_c.size(1);
    }
  }
  switch (d) {
    case 64: run_all<4>(q, k, v, off, ip, sc, suf, out, lse); break;
    case 80: run_all<5>(q, k, v, off, ip, sc, suf, out, lse); break;
    case 96: run_all<6>(q, k, v, off, ip, sc, suf, out, lse); break;
    case 128: run_all<8>(q, k, v, off, ip, sc, suf, out, lse); break;
    case 256: run_all<16>(q, k, v, off, ip, sc, suf, out, lse); break;
    default: TORCH_CHECK(false, "kept_attention: head_dim must be one of 64, 80, 96, 128, 256");
  }
  return {out, lse};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("kept_attention", &kept_attention, "attention over each (KV head, cell)'s kept context entries",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("offsets"), py::arg("idx"), py::arg("scale"),
        py::arg("ks") = py::none(), py::arg("vs") = py::none(), py::arg("own") = py::none(), py::arg("nq") = 1);
}
