/* Fused camera frame -> normalised NCHW tensor, one pass, no intermediate image.
 *
 * Matches the OpenCV chain the reference runs: BT.601 colour conversion in the same
 * 20-bit fixed point as cv2.COLOR_YUV2RGB_NV12 (so the RGB samples are identical),
 * bilinear resize with cv2's INTER_LINEAR tables (half-pixel centres, 11-bit weights),
 * but the weighted sum is kept exact and normalised in float instead of being rounded
 * to uint8: the result is within half a level of the reference.
 *
 * Work is row-wise: for each output row, the (at most two) source rows it needs are
 * colour-converted and resampled horizontally once each (a two-slot cache), then blended
 * vertically straight into the three output planes. Rows are split across pthreads.
 */
#include "ef_kernels.h"
#include "ef_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#ifdef __ARM_NEON
#include <arm_neon.h>
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(EF_NO_CLONES)
/* gcc builds an AVX2 and a baseline copy and picks one at load time (ifunc). */
#define EF_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define EF_CLONES
#endif

#define CY EF_CY
#define CUB EF_CUB
#define CUG EF_CUG
#define CVG EF_CVG
#define CVR EF_CVR
#define SHIFT EF_SHIFT
#define HALF EF_HALF
#define COEF_BITS 11
#define COEF_SCALE (1 << COEF_BITS)

int ef_have_neon(void) {
#ifdef __ARM_NEON
    return 1;
#else
    return 0;
#endif
}

typedef struct {
    int *x0, *x1;
    int32_t *ax0, *ax1;
    int *y0, *y1;
    int32_t *by0, *by1;
} tables;

/* cv2::resize INTER_LINEAR coefficient tables for one axis. */
static void build_axis(int src, int dst, int *o0, int *o1, int32_t *w0, int32_t *w1) {
    double scale = 1.0 / ((double)dst / src);
    for (int d = 0; d < dst; d++) {
        float f = (float)((d + 0.5) * scale - 0.5);
        int s = (int)floorf(f);
        f -= (float)s;
        if (s < 0) {
            f = 0.f;
            s = 0;
        }
        if (s >= src - 1) {
            f = 0.f;
            s = src - 1;
        }
        o0[d] = s;
        o1[d] = s + 1 < src ? s + 1 : src - 1;
        w0[d] = (int32_t)lrintf((1.f - f) * COEF_SCALE);
        w1[d] = (int32_t)lrintf(f * COEF_SCALE);
    }
}

/* One row of 4:2:0 YUV to planar RGB; uvstep 2 = NV12 (interleaved UV), 1 = I420. */
static inline void yuv_row_c(const uint8_t *restrict y, const uint8_t *restrict u,
                             const uint8_t *restrict v, int uvstep, int w,
                             uint8_t *restrict r, uint8_t *restrict g, uint8_t *restrict b) {
    for (int j = 0; j < w / 2; j++) {
        int uu = (int)u[j * uvstep] - 128, vv = (int)v[j * uvstep] - 128;
        int ruv = HALF + CVR * vv, guv = HALF + CVG * vv + CUG * uu, buv = HALF + CUB * uu;
        int ya = (int)y[2 * j] - 16, yb = (int)y[2 * j + 1] - 16;
        ya = (ya < 0 ? 0 : ya) * CY;
        yb = (yb < 0 ? 0 : yb) * CY;
        r[2 * j] = ef_clamp8((ya + ruv) >> SHIFT);
        r[2 * j + 1] = ef_clamp8((yb + ruv) >> SHIFT);
        g[2 * j] = ef_clamp8((ya + guv) >> SHIFT);
        g[2 * j + 1] = ef_clamp8((yb + guv) >> SHIFT);
        b[2 * j] = ef_clamp8((ya + buv) >> SHIFT);
        b[2 * j + 1] = ef_clamp8((yb + buv) >> SHIFT);
    }
}

EF_CLONES static void nv12_row_c(const uint8_t *y, const uint8_t *uv, int w, uint8_t *r,
                                 uint8_t *g, uint8_t *b) {
    yuv_row_c(y, uv, uv + 1, 2, w, r, g, b);
}

EF_CLONES static void i420_row_c(const uint8_t *y, const uint8_t *u, const uint8_t *v, int w,
                                 uint8_t *r, uint8_t *g, uint8_t *b) {
    yuv_row_c(y, u, v, 1, w, r, g, b);
}

#ifdef __ARM_NEON
static inline uint8x8_t neon_pack(int32x4_t lo, int32x4_t hi) {
    lo = vshrq_n_s32(lo, SHIFT);
    hi = vshrq_n_s32(hi, SHIFT);
    return vqmovn_u16(vcombine_u16(vqmovun_s32(lo), vqmovun_s32(hi)));
}

/* 16 pixels per step: even/odd luma share one chroma pair. */
static void yuv_row_neon(const uint8_t *y, const uint8_t *u, const uint8_t *v, int uvstep, int w,
                         uint8_t *r, uint8_t *g, uint8_t *b) {
    const int32x4_t cy = vdupq_n_s32(CY), half = vdupq_n_s32(HALF);
    const int16x8_t k16 = vdupq_n_s16(16), k128 = vdupq_n_s16(128), zero = vdupq_n_s16(0);
    int j = 0;
    for (; j + 8 <= w / 2; j += 8) {
        uint8x8_t u8, v8;
        if (uvstep == 2) {
            uint8x8x2_t uvp = vld2_u8(u + 2 * j);
            u8 = uvp.val[0];
            v8 = uvp.val[1];
        } else {
            u8 = vld1_u8(u + j);
            v8 = vld1_u8(v + j);
        }
        uint8x8x2_t yy = vld2_u8(y + 2 * j);
        int16x8_t uu = vsubq_s16(vreinterpretq_s16_u16(vmovl_u8(u8)), k128);
        int16x8_t vv = vsubq_s16(vreinterpretq_s16_u16(vmovl_u8(v8)), k128);
        int16x8_t ye = vmaxq_s16(vsubq_s16(vreinterpretq_s16_u16(vmovl_u8(yy.val[0])), k16), zero);
        int16x8_t yo = vmaxq_s16(vsubq_s16(vreinterpretq_s16_u16(vmovl_u8(yy.val[1])), k16), zero);
        int32x4_t ul = vmovl_s16(vget_low_s16(uu)), uh = vmovl_s16(vget_high_s16(uu));
        int32x4_t vl = vmovl_s16(vget_low_s16(vv)), vh = vmovl_s16(vget_high_s16(vv));
        int32x4_t rl = vmlaq_n_s32(half, vl, CVR), rh = vmlaq_n_s32(half, vh, CVR);
        int32x4_t gl = vmlaq_n_s32(vmlaq_n_s32(half, vl, CVG), ul, CUG);
        int32x4_t gh = vmlaq_n_s32(vmlaq_n_s32(half, vh, CVG), uh, CUG);
        int32x4_t bl = vmlaq_n_s32(half, ul, CUB), bh = vmlaq_n_s32(half, uh, CUB);
        int32x4_t yel = vmulq_s32(vmovl_s16(vget_low_s16(ye)), cy);
        int32x4_t yeh = vmulq_s32(vmovl_s16(vget_high_s16(ye)), cy);
        int32x4_t yol = vmulq_s32(vmovl_s16(vget_low_s16(yo)), cy);
        int32x4_t yoh = vmulq_s32(vmovl_s16(vget_high_s16(yo)), cy);
        uint8x8x2_t o;
        o.val[0] = neon_pack(vaddq_s32(yel, rl), vaddq_s32(yeh, rh));
        o.val[1] = neon_pack(vaddq_s32(yol, rl), vaddq_s32(yoh, rh));
        vst2_u8(r + 2 * j, o);
        o.val[0] = neon_pack(vaddq_s32(yel, gl), vaddq_s32(yeh, gh));
        o.val[1] = neon_pack(vaddq_s32(yol, gl), vaddq_s32(yoh, gh));
        vst2_u8(g + 2 * j, o);
        o.val[0] = neon_pack(vaddq_s32(yel, bl), vaddq_s32(yeh, bh));
        o.val[1] = neon_pack(vaddq_s32(yol, bl), vaddq_s32(yoh, bh));
        vst2_u8(b + 2 * j, o);
    }
    yuv_row_c(y + 2 * j, u + j * uvstep, v + j * uvstep, uvstep, w - 2 * j, r + 2 * j,
              g + 2 * j, b + 2 * j);
}
#endif

/* Packed 3-channel row to planar RGB; swap = 1 for BGR input. */
static void packed_row(const uint8_t *restrict p, int w, int swap, uint8_t *restrict r,
                       uint8_t *restrict g, uint8_t *restrict b) {
    uint8_t *restrict first = swap ? b : r;
    uint8_t *restrict last = swap ? r : b;
#ifdef __ARM_NEON
    int x = 0;
    for (; x + 16 <= w; x += 16) {
        uint8x16x3_t px = vld3q_u8(p + 3 * x);
        vst1q_u8(first + x, px.val[0]);
        vst1q_u8(g + x, px.val[1]);
        vst1q_u8(last + x, px.val[2]);
    }
    for (; x < w; x++) {
#else
    for (int x = 0; x < w; x++) {
#endif
        first[x] = p[3 * x];
        g[x] = p[3 * x + 1];
        last[x] = p[3 * x + 2];
    }
}

/* Horizontal pass of one converted row: h = P[x0] * a0 + P[x1] * a1 (scaled by 2^11). */
static void hresample(const uint8_t *restrict p, const tables *t, int new_w,
                      int32_t *restrict h) {
    const int *restrict x0 = t->x0, *restrict x1 = t->x1;
    const int32_t *restrict a0 = t->ax0, *restrict a1 = t->ax1;
    for (int x = 0; x < new_w; x++) h[x] = (int32_t)p[x0[x]] * a0[x] + (int32_t)p[x1[x]] * a1[x];
}

static inline uint16_t f32_to_f16(float f) {
    /* IEEE binary16, round to nearest even; inputs are finite here. */
    union {
        float f;
        uint32_t u;
    } v = {f};
    uint32_t x = v.u, sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x >= 0x47800000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
    if (x < 0x38800000u) {                                     /* subnormal or zero */
        union {
            uint32_t u;
            float f;
        } m = {x};
        float s = m.f + 0.5f; /* 0.5 = 2^-1: aligns the 2^-24 ulp of half subnormals */
        union {
            float f;
            uint32_t u;
        } q = {s};
        return (uint16_t)(sign | (q.u - 0x3f000000u));
    }
    uint32_t mant_odd = (x >> 13) & 1u;
    x += 0xc8000fffu + mant_odd; /* rebias exponent (-112 << 23) and round */
    return (uint16_t)(sign | (x >> 13));
}

/* Vertical blend of two resampled rows into one output row of one plane. */
EF_CLONES static void vblend_f32(const int32_t *restrict h0, const int32_t *restrict h1, int32_t b0,
                                 int32_t b1, float k, float bias, int n, float *restrict o) {
    for (int x = 0; x < n; x++) o[x] = (float)(h0[x] * b0 + h1[x] * b1) * k + bias;
}

EF_CLONES static void vblend_f16(const int32_t *restrict h0, const int32_t *restrict h1, int32_t b0,
                                 int32_t b1, float k, float bias, int n, uint16_t *restrict o) {
    for (int x = 0; x < n; x++) o[x] = f32_to_f16((float)(h0[x] * b0 + h1[x] * b1) * k + bias);
}

#ifdef __ARM_NEON
static void vblend_neon(const int32_t *h0, const int32_t *h1, int32_t b0, int32_t b1, float k,
                        float bias, int n, void *out, int f16) {
    const float32x4_t kk = vdupq_n_f32(k), bb = vdupq_n_f32(bias);
    int x = 0;
    for (; x + 8 <= n; x += 8) {
        int32x4_t s0 = vmlaq_n_s32(vmulq_n_s32(vld1q_s32(h0 + x), b0), vld1q_s32(h1 + x), b1);
        int32x4_t s1 =
            vmlaq_n_s32(vmulq_n_s32(vld1q_s32(h0 + x + 4), b0), vld1q_s32(h1 + x + 4), b1);
        float32x4_t f0 = vaddq_f32(vmulq_f32(vcvtq_f32_s32(s0), kk), bb);
        float32x4_t f1 = vaddq_f32(vmulq_f32(vcvtq_f32_s32(s1), kk), bb);
        if (f16) {
            float16x8_t hv = vcombine_f16(vcvt_f16_f32(f0), vcvt_f16_f32(f1));
            vst1q_u16((uint16_t *)out + x, vreinterpretq_u16_f16(hv));
        } else {
            vst1q_f32((float *)out + x, f0);
            vst1q_f32((float *)out + x + 4, f1);
        }
    }
    for (; x < n; x++) {
        float f = (float)(h0[x] * b0 + h1[x] * b1) * k + bias;
        if (f16)
            ((uint16_t *)out)[x] = f32_to_f16(f);
        else
            ((float *)out)[x] = f;
    }
}
#endif

static void fill_row(void *out, int f16, size_t offset, int n, float value) {
    if (n <= 0) return;
    if (f16) {
        uint16_t h = f32_to_f16(value), *o = (uint16_t *)out + offset;
        for (int i = 0; i < n; i++) o[i] = h;
    } else {
        float *o = (float *)out + offset;
        for (int i = 0; i < n; i++) o[i] = value;
    }
}

typedef struct {
    const ef_pre_args *a;
    const tables *t;
    int impl;
    int img_begin, img_end; /* rows of the resized image (0..new_h) */
    int pad_begin, pad_end; /* index into the list of padding rows */
    int failed;
} job;

typedef struct {
    uint8_t *rgb;  /* 3 planes of src_w */
    int32_t *h[2]; /* 3 planes of new_w each */
    int key[2];
    int next;
} row_cache;

static void convert_row(const ef_pre_args *a, int sy, uint8_t *rgb, int impl) {
    int w = a->src_w, h = a->src_h;
    uint8_t *r = rgb, *g = rgb + w, *b = rgb + 2 * (size_t)w;
    const uint8_t *f = a->frame;
    (void)impl;
    switch (a->format) {
    case EF_NV12: {
        const uint8_t *y = f + (size_t)sy * w, *uv = f + (size_t)h * w + (size_t)(sy / 2) * w;
#ifdef __ARM_NEON
        if (impl != EF_IMPL_PORTABLE) {
            yuv_row_neon(y, uv, uv + 1, 2, w, r, g, b);
            return;
        }
#endif
        nv12_row_c(y, uv, w, r, g, b);
        return;
    }
    case EF_I420: {
        const uint8_t *y = f + (size_t)sy * w;
        const uint8_t *u = f + (size_t)h * w + (size_t)(sy / 2) * (w / 2);
        const uint8_t *v = u + (size_t)(h / 2) * (w / 2);
#ifdef __ARM_NEON
        if (impl != EF_IMPL_PORTABLE) {
            yuv_row_neon(y, u, v, 1, w, r, g, b);
            return;
        }
#endif
        i420_row_c(y, u, v, w, r, g, b);
        return;
    }
    default:
        packed_row(f + (size_t)sy * w * 3, w, a->format == EF_BGR, r, g, b);
    }
}

/* x86 with AVX2: convert only the pixels the output samples, straight into h. */
static void yuv_hresample_x86(const ef_pre_args *a, const tables *t, int sy, int32_t *h) {
    int w = a->src_w, nv12 = a->format == EF_NV12;
    const uint8_t *f = a->frame, *y = f + (size_t)sy * w, *u, *v;
    if (nv12) {
        u = f + (size_t)a->src_h * w + (size_t)(sy / 2) * w;
        v = u + 1;
    } else {
        u = f + (size_t)a->src_h * w + (size_t)(sy / 2) * (w / 2);
        v = u + (size_t)(a->src_h / 2) * (w / 2);
    }
    int32_t *hr = h, *hg = h + a->new_w, *hb = h + 2 * (size_t)a->new_w;
    int dx = ef_yuv_hresample_avx2(y, u, v, nv12, t->x0, t->x1, t->ax0, t->ax1, a->new_w, w, hr,
                                   hg, hb);
    for (; dx < a->new_w; dx++) {
        int32_t p0[3], p1[3];
        ef_yuv_px(y, u, v, nv12, t->x0[dx], p0);
        ef_yuv_px(y, u, v, nv12, t->x1[dx], p1);
        hr[dx] = p0[0] * t->ax0[dx] + p1[0] * t->ax1[dx];
        hg[dx] = p0[1] * t->ax0[dx] + p1[1] * t->ax1[dx];
        hb[dx] = p0[2] * t->ax0[dx] + p1[2] * t->ax1[dx];
    }
}

static const int32_t *resampled(const ef_pre_args *a, const tables *t, row_cache *c, int sy,
                                int impl) {
    for (int i = 0; i < 2; i++)
        if (c->key[i] == sy) return c->h[i];
    int slot = c->next;
    c->next ^= 1;
    c->key[slot] = sy;
    if (impl != EF_IMPL_PORTABLE && a->format <= EF_I420 && ef_x86_avx2()) {
        yuv_hresample_x86(a, t, sy, c->h[slot]);
        return c->h[slot];
    }
    convert_row(a, sy, c->rgb, impl);
    for (int ch = 0; ch < 3; ch++)
        hresample(c->rgb + (size_t)ch * a->src_w, t, a->new_w, c->h[slot] + (size_t)ch * a->new_w);
    return c->h[slot];
}

/* The output plane of RGB channel ch. */
static size_t plane_of(const ef_pre_args *a, int ch) { return (size_t)(a->bgr_out ? 2 - ch : ch); }

static void run_job(job *j) {
    const ef_pre_args *a = j->a;
    const tables *t = j->t;
    size_t plane = (size_t)a->dst_h * a->dst_w;
    int bottom = a->dst_h - a->top - a->new_h;
    for (int p = j->pad_begin; p < j->pad_end; p++) {
        int row = p < a->top ? p : a->top + a->new_h + (p - a->top);
        (void)bottom;
        for (int ch = 0; ch < 3; ch++)
            fill_row(a->out, a->f16, plane_of(a, ch) * plane + (size_t)row * a->dst_w,
                     a->dst_w, a->pad_value[ch]);
    }
    if (j->img_begin >= j->img_end) return;
    row_cache c;
    size_t hn = 3 * (size_t)a->new_w;
    c.rgb = malloc(3 * (size_t)a->src_w);
    c.h[0] = malloc(2 * hn * sizeof(int32_t));
    if (!c.rgb || !c.h[0]) {
        free(c.rgb);
        free(c.h[0]);
        j->failed = 1;
        return;
    }
    c.h[1] = c.h[0] + hn;
    c.key[0] = c.key[1] = -1;
    c.next = 0;
    int right = a->dst_w - a->left - a->new_w;
    for (int ry = j->img_begin; ry < j->img_end; ry++) {
        int sy0 = t->y0[ry], sy1 = t->y1[ry];
        int32_t b0 = t->by0[ry], b1 = t->by1[ry];
        const int32_t *h0 = resampled(a, t, &c, sy0, j->impl);
        const int32_t *h1 = h0;
        if (b1 != 0 && sy1 != sy0) h1 = resampled(a, t, &c, sy1, j->impl);
        if (h1 == h0) {
            b0 += b1;
            b1 = 0;
        }
        int row = a->top + ry;
        for (int ch = 0; ch < 3; ch++) {
            size_t base = plane_of(a, ch) * plane + (size_t)row * a->dst_w;
            fill_row(a->out, a->f16, base, a->left, a->pad_value[ch]);
            fill_row(a->out, a->f16, base + a->left + a->new_w, right, a->pad_value[ch]);
            const int32_t *p0 = h0 + (size_t)ch * a->new_w, *p1 = h1 + (size_t)ch * a->new_w;
            size_t at = base + a->left;
#ifdef __ARM_NEON
            if (j->impl != EF_IMPL_PORTABLE) {
                void *o = a->f16 ? (void *)((uint16_t *)a->out + at) : (void *)((float *)a->out + at);
                vblend_neon(p0, p1, b0, b1, a->scale[ch], a->bias[ch], a->new_w, o, a->f16);
                continue;
            }
#endif
            if (a->f16) {
                uint16_t *o = (uint16_t *)a->out + at;
                int done = 0;
                if (j->impl != EF_IMPL_PORTABLE && ef_x86_avx2())
                    done = ef_vblend_f16_f16c(p0, p1, b0, b1, a->scale[ch], a->bias[ch],
                                              a->new_w, o);
                vblend_f16(p0 + done, p1 + done, b0, b1, a->scale[ch], a->bias[ch],
                           a->new_w - done, o + done);
            }
            else
                vblend_f32(p0, p1, b0, b1, a->scale[ch], a->bias[ch], a->new_w,
                           (float *)a->out + at);
        }
    }
    free(c.rgb);
    free(c.h[0]);
}

static void *job_thread(void *arg) {
    run_job((job *)arg);
    return NULL;
}

#define MAX_THREADS 16

int ef_preprocess(const ef_pre_args *a, int impl, int threads) {
    tables t;
    size_t nx = (size_t)a->new_w, ny = (size_t)a->new_h;
    void *mem = malloc((nx + ny) * 2 * (sizeof(int) + sizeof(int32_t)));
    if (!mem) return -1;
    t.x0 = (int *)mem;
    t.x1 = t.x0 + nx;
    t.y0 = t.x1 + nx;
    t.y1 = t.y0 + ny;
    t.ax0 = (int32_t *)(t.y1 + ny);
    t.ax1 = t.ax0 + nx;
    t.by0 = t.ax1 + nx;
    t.by1 = t.by0 + ny;
    build_axis(a->src_w, a->new_w, t.x0, t.x1, t.ax0, t.ax1);
    build_axis(a->src_h, a->new_h, t.y0, t.y1, t.by0, t.by1);

    /* Threads only where the work pays for their start (~tens of microseconds). */
    long work = (long)a->new_w * a->new_h;
    int n = threads < 1 ? 1 : (threads > MAX_THREADS ? MAX_THREADS : threads);
    if (work < 65536) n = 1;
    if (n > a->new_h) n = a->new_h;
    int pad_rows = a->dst_h - a->new_h;
    job jobs[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int i = 0; i < n; i++) {
        jobs[i] = (job){a, &t, impl, (int)((long)a->new_h * i / n), (int)((long)a->new_h * (i + 1) / n),
                        (int)((long)pad_rows * i / n), (int)((long)pad_rows * (i + 1) / n), 0};
    }
    for (int i = 1; i < n; i++) started[i] = pthread_create(&tid[i], NULL, job_thread, &jobs[i]) == 0;
    run_job(&jobs[0]);
    int failed = jobs[0].failed;
    for (int i = 1; i < n; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        else
            run_job(&jobs[i]); /* could not start a thread: do its share here */
        failed |= jobs[i].failed;
    }
    free(mem);
    return failed ? -1 : 0;
}
