/* Internals shared by preprocess.c and its x86 SIMD helpers (not part of the API). */
#ifndef EF_INTERNAL_H
#define EF_INTERNAL_H

#include <stdint.h>

#define EF_CY 1220542
#define EF_CUB 2116026
#define EF_CUG (-409993)
#define EF_CVG (-852492)
#define EF_CVR 1673527
#define EF_SHIFT 20
#define EF_HALF (1 << (EF_SHIFT - 1))

static inline uint8_t ef_clamp8(int v) { return (uint8_t)(v < 0 ? 0 : (v > 255 ? 255 : v)); }

/* One pixel of a 4:2:0 frame as cv2.COLOR_YUV2RGB_NV12 / _I420 converts it. y is the pixel's
 * luma row; nv12: u is the interleaved UV row (v unused), else the I420 U and V rows. */
static inline void ef_yuv_px(const uint8_t *y, const uint8_t *u, const uint8_t *v, int nv12,
                             int x, int32_t rgb[3]) {
    int uu, vv;
    if (nv12) {
        uu = (int)u[x & ~1] - 128;
        vv = (int)u[(x & ~1) + 1] - 128;
    } else {
        uu = (int)u[x >> 1] - 128;
        vv = (int)v[x >> 1] - 128;
    }
    int yy = (int)y[x] - 16;
    yy = (yy < 0 ? 0 : yy) * EF_CY;
    rgb[0] = ef_clamp8((yy + (EF_HALF + EF_CVR * vv)) >> EF_SHIFT);
    rgb[1] = ef_clamp8((yy + (EF_HALF + EF_CVG * vv + EF_CUG * uu)) >> EF_SHIFT);
    rgb[2] = ef_clamp8((yy + (EF_HALF + EF_CUB * uu)) >> EF_SHIFT);
}

/* 1 when this CPU runs the AVX2 (+F16C) helpers below; 0 elsewhere and on non-x86. */
int ef_x86_avx2(void);

/* Colour-convert only the source pixels a row of output needs and resample them
 * horizontally in one go (AVX2 gathers): h = RGB(x0) * a0 + RGB(x1) * a1, per plane.
 * nv12: u is the interleaved UV row and v is ignored; else I420 U and V rows.
 * Returns how many leading columns it did; the caller finishes the rest. */
int ef_yuv_hresample_avx2(const uint8_t *y, const uint8_t *u, const uint8_t *v, int nv12,
                          const int *x0, const int *x1, const int32_t *a0, const int32_t *a1,
                          int new_w, int src_w, int32_t *hr, int32_t *hg, int32_t *hb);

/* out = half((h0 * b0 + h1 * b1) * k + bias) with F16C; returns the count done. */
int ef_vblend_f16_f16c(const int32_t *h0, const int32_t *h1, int32_t b0, int32_t b1, float k,
                       float bias, int n, uint16_t *o);

#endif
