/* Text-line quads -> normalised NCHW slots, sampled straight from the camera frame.
 *
 * The definition is shared/kernels/lines.py and reference.py: per output pixel, the mean of
 * kx x ky bilinear taps through the quad's homography (coordinates in double, like the
 * reference), replicating the frame's border. Only the pixels the taps reach are
 * colour-converted (cv2's BT.601 fixed point, so the RGB samples equal the reference's),
 * and the result is normalised and written in the same pass: no crop, no resize buffer.
 * Rows (of all quads together) are split across pthreads.
 */
#include "ef_internal.h"
#include "ef_kernels.h"

#include <pthread.h>
#include <stddef.h>

#define EF_INLINE static inline __attribute__((always_inline))

/* The RGB of packed frame pixel (x, y), already clamped into the frame; `format` is a
 * constant where this is inlined (line_row_as), so each format gets its own loop. */
EF_INLINE void rgb_at(const ef_lines_args *a, int format, int x, int y, int32_t rgb[3]) {
    const uint8_t *p = a->frame + ((size_t)y * (size_t)a->src_w + (size_t)x) * 3;
    int swap = format == EF_BGR;
    rgb[0] = p[swap ? 2 : 0];
    rgb[1] = p[1];
    rgb[2] = p[swap ? 0 : 2];
}

EF_INLINE int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* The chroma terms of ef_yuv_px for chroma sample (cx, cy): r, g, b offsets. */
EF_INLINE void chroma_at(const ef_lines_args *a, int format, int cx, int cy, int32_t t[3]) {
    size_t w = (size_t)a->src_w, h = (size_t)a->src_h;
    const uint8_t *c = a->frame + h * w;
    int uu, vv;
    if (format == EF_NV12) {
        const uint8_t *uv = c + (size_t)cy * w + 2 * (size_t)cx;
        uu = (int)uv[0] - 128;
        vv = (int)uv[1] - 128;
    } else {
        uu = (int)c[(size_t)cy * (w / 2) + cx] - 128;
        vv = (int)c[(h / 2) * (w / 2) + (size_t)cy * (w / 2) + cx] - 128;
    }
    t[0] = EF_HALF + EF_CVR * vv;
    t[1] = EF_HALF + EF_CVG * vv + EF_CUG * uu;
    t[2] = EF_HALF + EF_CUB * uu;
}

/* RGB of the four pixels of a 4:2:0 tap, as ef_yuv_px converts them, computing each
 * distinct chroma sample once (neighbours share one half of the time per axis). */
EF_INLINE void yuv_quad(const ef_lines_args *a, int format, int xa, int xb, int ya, int yb,
                        int32_t p00[3], int32_t p01[3], int32_t p10[3], int32_t p11[3]) {
    size_t w = (size_t)a->src_w;
    int32_t ta[3], tb[3], tc[3], td[3];
    int cxa = xa >> 1, cxb = xb >> 1, cya = ya >> 1, cyb = yb >> 1;
    chroma_at(a, format, cxa, cya, ta);
    if (cxb == cxa)
        for (int c = 0; c < 3; c++) tb[c] = ta[c];
    else
        chroma_at(a, format, cxb, cya, tb);
    if (cyb == cya) {
        for (int c = 0; c < 3; c++) tc[c] = ta[c], td[c] = tb[c];
    } else {
        chroma_at(a, format, cxa, cyb, tc);
        if (cxb == cxa)
            for (int c = 0; c < 3; c++) td[c] = tc[c];
        else
            chroma_at(a, format, cxb, cyb, td);
    }
    const uint8_t *ra = a->frame + (size_t)ya * w, *rb = a->frame + (size_t)yb * w;
    int l[4] = {(int)ra[xa] - 16, (int)ra[xb] - 16, (int)rb[xa] - 16, (int)rb[xb] - 16};
    int32_t *px[4] = {p00, p01, p10, p11};
    const int32_t *tt[4] = {ta, tb, tc, td};
    for (int k = 0; k < 4; k++) {
        int yy = (l[k] < 0 ? 0 : l[k]) * EF_CY;
        for (int c = 0; c < 3; c++) px[k][c] = ef_clamp8((yy + tt[k][c]) >> EF_SHIFT);
    }
}

/* One bilinear tap at frame position (sx, sy), added to acc. */
EF_INLINE void tap(const ef_lines_args *a, int format, double sx, double sy, float acc[3]) {
    if (!(sx >= -1.0)) sx = -1.0; /* also NaN: a degenerate plan never reads out of bounds */
    if (!(sy >= -1.0)) sy = -1.0;
    if (sx > a->src_w) sx = a->src_w;
    if (sy > a->src_h) sy = a->src_h;
    /* floor() without a libm call (baseline x86-64 has no roundsd): exact for s >= -1 */
    int x0 = (int)(sx + 1.0) - 1, y0 = (int)(sy + 1.0) - 1;
    float fx = (float)(sx - x0), fy = (float)(sy - y0);
    int xa = clampi(x0, 0, a->src_w - 1), xb = clampi(x0 + 1, 0, a->src_w - 1);
    int ya = clampi(y0, 0, a->src_h - 1), yb = clampi(y0 + 1, 0, a->src_h - 1);
    int32_t p00[3], p01[3], p10[3], p11[3];
    if (format == EF_NV12 || format == EF_I420) {
        yuv_quad(a, format, xa, xb, ya, yb, p00, p01, p10, p11);
    } else {
        rgb_at(a, format, xa, ya, p00);
        rgb_at(a, format, xb, ya, p01);
        rgb_at(a, format, xa, yb, p10);
        rgb_at(a, format, xb, yb, p11);
    }
    for (int c = 0; c < 3; c++) {
        float top = (float)p00[c] * (1.f - fx) + (float)p01[c] * fx;
        float bottom = (float)p10[c] * (1.f - fx) + (float)p11[c] * fx;
        acc[c] += top * (1.f - fy) + bottom * fy;
    }
}

/* One output row of one quad: the line's columns, then the fill. */
EF_INLINE void line_row_as(const ef_lines_args *a, int format, int i, int y) {
    const double *m = a->hom + 9 * (size_t)i;
    int kx = a->taps[2 * i], ky = a->taps[2 * i + 1], w = a->widths[i];
    size_t plane = (size_t)a->out_h * a->out_w;
    float *base = a->out + (size_t)a->slots[i] * 3 * plane + (size_t)y * a->out_w;
    float *o[3];
    for (int c = 0; c < 3; c++) o[c] = base + (size_t)(a->bgr_out ? 2 - c : c) * plane;
    float inv = 1.f / (float)(kx * ky);
    for (int x = 0; x < w; x++) {
        float acc[3] = {0.f, 0.f, 0.f};
        for (int b = 0; b < ky; b++) {
            double py = y + (b + 0.5) / ky;
            double nx = m[1] * py + m[2], ny = m[4] * py + m[5], nd = m[7] * py + m[8];
            for (int t = 0; t < kx; t++) {
                double px = x + (t + 0.5) / kx;
                double den = m[6] * px + nd;
                double inv_den = 1.0 / den;
                tap(a, format, (m[0] * px + nx) * inv_den, (m[3] * px + ny) * inv_den, acc);
            }
        }
        for (int c = 0; c < 3; c++) o[c][x] = acc[c] * inv * a->scale[c] + a->bias[c];
    }
    for (int c = 0; c < 3; c++)
        for (int x = w; x < a->out_w; x++) o[c][x] = a->fill;
}

static void line_row(const ef_lines_args *a, int i, int y) {
    switch (a->format) {
    case EF_NV12:
        line_row_as(a, EF_NV12, i, y);
        return;
    case EF_I420:
        line_row_as(a, EF_I420, i, y);
        return;
    case EF_BGR:
        line_row_as(a, EF_BGR, i, y);
        return;
    default:
        line_row_as(a, EF_RGB, i, y);
    }
}

typedef struct {
    const ef_lines_args *a;
    long begin, end; /* rows of all quads, quad-major */
} lines_job;

static void *lines_run(void *arg) {
    lines_job *j = (lines_job *)arg;
    for (long r = j->begin; r < j->end; r++)
        line_row(j->a, (int)(r / j->a->out_h), (int)(r % j->a->out_h));
    return NULL;
}

#define MAX_THREADS 16

int ef_quads_to_tensor(const ef_lines_args *a, int threads) {
    long rows = (long)a->n * a->out_h, work = 0;
    for (int i = 0; i < a->n; i++)
        work += (long)a->widths[i] * a->out_h * a->taps[2 * i] * a->taps[2 * i + 1];
    int n = threads < 1 ? 1 : (threads > MAX_THREADS ? MAX_THREADS : threads);
    /* A recogniser batch of one frame is ~0.1-0.3 M taps (1-3 ms): a second thread's start
     * and join cost more than that saves, much more on a busy machine (bench kernels). */
    if (work < (1L << 20)) n = 1;
    if (n > rows) n = rows > 0 ? (int)rows : 1;
    lines_job jobs[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int i = 0; i < n; i++) jobs[i] = (lines_job){a, rows * i / n, rows * (i + 1) / n};
    for (int i = 1; i < n; i++)
        started[i] = pthread_create(&tid[i], NULL, lines_run, &jobs[i]) == 0;
    lines_run(&jobs[0]);
    for (int i = 1; i < n; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        else
            lines_run(&jobs[i]); /* could not start a thread: do its share here */
    }
    return 0;
}
