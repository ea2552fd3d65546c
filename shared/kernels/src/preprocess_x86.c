/* x86 helpers for preprocess.c: AVX2 gather-convert-resample and F16C stores.
 *
 * Compiled with function-level target attributes and chosen at run time
 * (__builtin_cpu_supports), so the extension still loads on any x86-64.
 * Bit-identical to the portable path: the same integer arithmetic, in 32-bit lanes.
 */
#include "ef_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

int ef_x86_avx2(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    }
    return cached;
}

#define AVX2 __attribute__((target("avx2,f16c")))

/* RGB of 8 pixels from Y, U, V lanes (each 0..255 in int32). */
AVX2 static inline void convert8(__m256i yv, __m256i uv, __m256i vv, __m256i *r, __m256i *g,
                                 __m256i *b) {
    const __m256i k16 = _mm256_set1_epi32(16), k128 = _mm256_set1_epi32(128);
    const __m256i zero = _mm256_setzero_si256(), k255 = _mm256_set1_epi32(255);
    const __m256i half = _mm256_set1_epi32(EF_HALF);
    __m256i yy = _mm256_mullo_epi32(_mm256_max_epi32(_mm256_sub_epi32(yv, k16), zero),
                                    _mm256_set1_epi32(EF_CY));
    __m256i uu = _mm256_sub_epi32(uv, k128), vvv = _mm256_sub_epi32(vv, k128);
    yy = _mm256_add_epi32(yy, half);
    __m256i rr = _mm256_add_epi32(yy, _mm256_mullo_epi32(vvv, _mm256_set1_epi32(EF_CVR)));
    __m256i gg = _mm256_add_epi32(
        yy, _mm256_add_epi32(_mm256_mullo_epi32(vvv, _mm256_set1_epi32(EF_CVG)),
                             _mm256_mullo_epi32(uu, _mm256_set1_epi32(EF_CUG))));
    __m256i bb = _mm256_add_epi32(yy, _mm256_mullo_epi32(uu, _mm256_set1_epi32(EF_CUB)));
    *r = _mm256_min_epi32(_mm256_max_epi32(_mm256_srai_epi32(rr, EF_SHIFT), zero), k255);
    *g = _mm256_min_epi32(_mm256_max_epi32(_mm256_srai_epi32(gg, EF_SHIFT), zero), k255);
    *b = _mm256_min_epi32(_mm256_max_epi32(_mm256_srai_epi32(bb, EF_SHIFT), zero), k255);
}

AVX2 static inline void fetch8(const uint8_t *y, const uint8_t *u, const uint8_t *v, int nv12,
                               __m256i idx, __m256i *r, __m256i *g, __m256i *b) {
    const __m256i lo = _mm256_set1_epi32(0xff);
    __m256i yv = _mm256_and_si256(_mm256_i32gather_epi32((const int *)y, idx, 1), lo);
    __m256i uv, vv;
    if (nv12) {
        __m256i pair = _mm256_andnot_si256(_mm256_set1_epi32(1), idx);
        __m256i c = _mm256_i32gather_epi32((const int *)u, pair, 1);
        uv = _mm256_and_si256(c, lo);
        vv = _mm256_and_si256(_mm256_srli_epi32(c, 8), lo);
    } else {
        __m256i half_idx = _mm256_srli_epi32(idx, 1);
        uv = _mm256_and_si256(_mm256_i32gather_epi32((const int *)u, half_idx, 1), lo);
        vv = _mm256_and_si256(_mm256_i32gather_epi32((const int *)v, half_idx, 1), lo);
    }
    convert8(yv, uv, vv, r, g, b);
}

AVX2 int ef_yuv_hresample_avx2(const uint8_t *y, const uint8_t *u, const uint8_t *v, int nv12,
                               const int *x0, const int *x1, const int32_t *a0,
                               const int32_t *a1, int new_w, int src_w, int32_t *hr,
                               int32_t *hg, int32_t *hb) {
    /* 32-bit gathers read 3 bytes past the pixel (and I420 chroma x/2 + 3): stay inside
     * the row, so x1 (non-decreasing) must keep 8 pixels from its end. */
    int dx = 0;
    for (; dx + 8 <= new_w && x1[dx + 7] <= src_w - 8; dx += 8) {
        __m256i i0 = _mm256_loadu_si256((const __m256i *)(x0 + dx));
        __m256i w0 = _mm256_loadu_si256((const __m256i *)(a0 + dx));
        __m256i w1 = _mm256_loadu_si256((const __m256i *)(a1 + dx));
        __m256i r, g, b;
        fetch8(y, u, v, nv12, i0, &r, &g, &b);
        r = _mm256_mullo_epi32(r, w0);
        g = _mm256_mullo_epi32(g, w0);
        b = _mm256_mullo_epi32(b, w0);
        if (!_mm256_testz_si256(w1, w1)) { /* skip the second tap where its weight is 0 */
            __m256i i1 = _mm256_loadu_si256((const __m256i *)(x1 + dx));
            __m256i r1, g1, b1;
            fetch8(y, u, v, nv12, i1, &r1, &g1, &b1);
            r = _mm256_add_epi32(r, _mm256_mullo_epi32(r1, w1));
            g = _mm256_add_epi32(g, _mm256_mullo_epi32(g1, w1));
            b = _mm256_add_epi32(b, _mm256_mullo_epi32(b1, w1));
        }
        _mm256_storeu_si256((__m256i *)(hr + dx), r);
        _mm256_storeu_si256((__m256i *)(hg + dx), g);
        _mm256_storeu_si256((__m256i *)(hb + dx), b);
    }
    return dx;
}

AVX2 int ef_vblend_f16_f16c(const int32_t *h0, const int32_t *h1, int32_t b0, int32_t b1,
                            float k, float bias, int n, uint16_t *o) {
    const __m256i vb0 = _mm256_set1_epi32(b0), vb1 = _mm256_set1_epi32(b1);
    const __m256 vk = _mm256_set1_ps(k), vbias = _mm256_set1_ps(bias);
    int x = 0;
    for (; x + 8 <= n; x += 8) {
        __m256i s = _mm256_add_epi32(
            _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)(h0 + x)), vb0),
            _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)(h1 + x)), vb1));
        __m256 f = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s), vk), vbias);
        _mm_storeu_si128((__m128i *)(o + x), _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT));
    }
    return x;
}

#else /* not x86-64 with gcc/clang: no helpers */

int ef_x86_avx2(void) { return 0; }

int ef_yuv_hresample_avx2(const uint8_t *y, const uint8_t *u, const uint8_t *v, int nv12,
                          const int *x0, const int *x1, const int32_t *a0, const int32_t *a1,
                          int new_w, int src_w, int32_t *hr, int32_t *hg, int32_t *hb) {
    (void)y, (void)u, (void)v, (void)nv12, (void)x0, (void)x1, (void)a0, (void)a1;
    (void)new_w, (void)src_w, (void)hr, (void)hg, (void)hb;
    return 0;
}

int ef_vblend_f16_f16c(const int32_t *h0, const int32_t *h1, int32_t b0, int32_t b1, float k,
                       float bias, int n, uint16_t *o) {
    (void)h0, (void)h1, (void)b0, (void)b1, (void)k, (void)bias, (void)n, (void)o;
    return 0;
}
#endif
