/* Native test driver for shared/kernels/src: runs every kernel path the build has
 * (NEON on aarch64, AVX2/F16C on x86 where the CPU has them, the portable C everywhere) on fixed and random inputs and checks
 * them against a naive golden model written here, and against each other.
 *
 * Build and run (tests/unit/test_kernels_neon.py does this):
 *   gcc -O2 -ffp-contract=off -I shared/kernels/src tests/native/driver.c \
 *       shared/kernels/src/preprocess.c shared/kernels/src/preprocess_x86.c \
 *       shared/kernels/src/nms.c -lm -pthread -o driver
 *   aarch64-linux-gnu-gcc ... (same) && qemu-aarch64 -L /usr/aarch64-linux-gnu ./driver
 * Prints one line per check and "OK <n> checks" at the end; exits 1 on any failure.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ef_kernels.h"

static int failures = 0, checks = 0;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

static float rndf(void) { return (float)(rnd() & 0xffffff) / 16777216.0f; }

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    float f;
    if (exp == 0)
        f = ldexpf((float)mant, -24);
    else if (exp == 31)
        f = mant ? NAN : INFINITY;
    else
        f = ldexpf((float)(mant | 0x400), (int)exp - 25);
    return sign ? -f : f;
}

/* --- golden pre-processing: per output pixel, straight from the definitions --------- */

static int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

static void golden_rgb(const ef_pre_args *a, int x, int y, int rgb[3]) {
    const uint8_t *f = a->frame;
    int w = a->src_w, h = a->src_h;
    if (a->format == EF_BGR || a->format == EF_RGB) {
        const uint8_t *p = f + ((size_t)y * w + x) * 3;
        int sw = a->format == EF_BGR;
        rgb[0] = p[sw ? 2 : 0];
        rgb[1] = p[1];
        rgb[2] = p[sw ? 0 : 2];
        return;
    }
    int yy = f[(size_t)y * w + x], u, v;
    if (a->format == EF_NV12) {
        const uint8_t *uv = f + (size_t)h * w + (size_t)(y / 2) * w + (x / 2) * 2;
        u = uv[0];
        v = uv[1];
    } else {
        const uint8_t *up = f + (size_t)h * w;
        const uint8_t *vp = up + (size_t)(h / 2) * (w / 2);
        u = up[(size_t)(y / 2) * (w / 2) + x / 2];
        v = vp[(size_t)(y / 2) * (w / 2) + x / 2];
    }
    int yv = (yy - 16 > 0 ? yy - 16 : 0) * 1220542;
    int half = 1 << 19;
    rgb[0] = clampi((yv + half + 1673527 * (v - 128)) >> 20, 0, 255);
    rgb[1] = clampi((yv + half - 852492 * (v - 128) - 409993 * (u - 128)) >> 20, 0, 255);
    rgb[2] = clampi((yv + half + 2116026 * (u - 128)) >> 20, 0, 255);
}

static void axis(int src, int dst, int d, int *s0, int *s1, double *w0, double *w1) {
    double scale = 1.0 / ((double)dst / src);
    float f = (float)((d + 0.5) * scale - 0.5);
    int s = (int)floorf(f);
    f -= (float)s;
    if (s < 0) f = 0.f, s = 0;
    if (s >= src - 1) f = 0.f, s = src - 1;
    *s0 = s;
    *s1 = s + 1 < src ? s + 1 : src - 1;
    *w0 = lrintf((1.f - f) * 2048) / 2048.0;
    *w1 = lrintf(f * 2048) / 2048.0;
}

static double golden_value(const ef_pre_args *a, int ch, int oy, int ox, const float mean[3],
                           const float std[3], int pad) {
    int ry = oy - a->top, rx = ox - a->left;
    double v;
    if (ry < 0 || ry >= a->new_h || rx < 0 || rx >= a->new_w) {
        v = pad;
    } else {
        int y0, y1, x0, x1, p[3];
        double wy0, wy1, wx0, wx1;
        axis(a->src_h, a->new_h, ry, &y0, &y1, &wy0, &wy1);
        axis(a->src_w, a->new_w, rx, &x0, &x1, &wx0, &wx1);
        golden_rgb(a, x0, y0, p);
        v = p[ch] * wx0 * wy0;
        golden_rgb(a, x1, y0, p);
        v += p[ch] * wx1 * wy0;
        golden_rgb(a, x0, y1, p);
        v += p[ch] * wx0 * wy1;
        golden_rgb(a, x1, y1, p);
        v += p[ch] * wx1 * wy1;
    }
    return (v / 255.0 - mean[ch]) / std[ch];
}

static void plan(ef_pre_args *a, int sh, int sw, int dh, int dw) {
    double scale = fmin((double)dh / sh, (double)dw / sw);
    int nh = (int)lround(sh * scale), nw = (int)lround(sw * scale); /* round-half-even is not */
    /* Python's round() is half-to-even; match it for the rare exact .5 case. */
    double eh = sh * scale, ew = sw * scale;
    if (fabs(eh - floor(eh) - 0.5) < 1e-12) nh = (int)(2 * round(eh / 2));
    if (fabs(ew - floor(ew) - 0.5) < 1e-12) nw = (int)(2 * round(ew / 2));
    nh = nh < 1 ? 1 : (nh > dh ? dh : nh);
    nw = nw < 1 ? 1 : (nw > dw ? dw : nw);
    a->src_h = sh, a->src_w = sw, a->dst_h = dh, a->dst_w = dw, a->new_h = nh, a->new_w = nw;
    a->top = (dh - nh) / 2, a->left = (dw - nw) / 2;
}

static void check_pre(int format, int sh, int sw, int dh, int dw, int f16, int threads) {
    static const char *names[] = {"nv12", "i420", "bgr", "rgb"};
    size_t in_len = (format <= EF_I420) ? (size_t)sh * sw * 3 / 2 : (size_t)sh * sw * 3;
    uint8_t *frame = malloc(in_len);
    for (size_t i = 0; i < in_len; i++) frame[i] = (uint8_t)rnd();
    if (sh >= 4) frame[0] = 0, frame[1] = 255; /* clamp paths */
    ef_pre_args a;
    memset(&a, 0, sizeof a);
    a.format = format;
    a.frame = frame;
    plan(&a, sh, sw, dh, dw);
    float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
    int pad = 114;
    for (int c = 0; c < 3; c++) {
        a.scale[c] = (float)(1.0 / (255.0 * 4194304.0 * std[c]));
        a.bias[c] = -mean[c] / std[c];
        a.pad_value[c] = (float)((pad / 255.0 - mean[c]) / std[c]);
    }
    a.f16 = f16;
    size_t n = (size_t)3 * dh * dw, bytes = n * (f16 ? 2 : 4);
    void *out_auto = malloc(bytes), *out_port = malloc(bytes);
    a.out = out_auto;
    int rc1 = ef_preprocess(&a, EF_IMPL_AUTO, threads);
    a.out = out_port;
    int rc2 = ef_preprocess(&a, EF_IMPL_PORTABLE, 1);
    double worst_gold = 0, worst_pair = 0;
    for (int ch = 0; ch < 3; ch++)
        for (int y = 0; y < dh; y++)
            for (int x = 0; x < dw; x++) {
                size_t i = ((size_t)ch * dh + y) * dw + x;
                double g = golden_value(&a, ch, y, x, mean, std, pad);
                double va = f16 ? half_to_float(((uint16_t *)out_auto)[i]) : ((float *)out_auto)[i];
                double vp = f16 ? half_to_float(((uint16_t *)out_port)[i]) : ((float *)out_port)[i];
                double dg = fmax(fabs(va - g), fabs(vp - g)) * std[ch];
                double dp = fabs(va - vp) * std[ch];
                if (!(dg <= worst_gold)) worst_gold = dg; /* NaN-safe */
                if (!(dp <= worst_pair)) worst_pair = dp;
            }
    /* Golden is exact; kernels add float32 rounding (~1e-6), float16 its own (~2e-3). */
    double tol = f16 ? 2.5e-3 : 1e-5;
    int ok = rc1 == 0 && rc2 == 0 && worst_gold <= tol && worst_pair <= tol;
    checks++;
    if (!ok) failures++;
    printf("%s pre %s %dx%d -> %dx%d %s threads=%d: max|auto-golden|,|port-golden| %.3g, "
           "|auto-port| %.3g (tol %.1g)\n",
           ok ? "ok  " : "FAIL", names[format], sh, sw, dh, dw, f16 ? "f16" : "f32", threads,
           worst_gold, worst_pair, tol);
    free(frame);
    free(out_auto);
    free(out_port);
}

/* --- golden NMS: the textbook suppress-forward loop, same float32 rule ------------- */

static int golden_nms(const float *b, const float *s, const int32_t *cls, int n, float thr,
                      float sthr, int max_det, int64_t *keep) {
    int32_t *order = malloc(sizeof(int32_t) * (n ? n : 1));
    int m = ef_score_order(s, n, sthr, order), nk = 0;
    char *dead = calloc(n ? n : 1, 1);
    for (int o = 0; o < m && nk < max_det; o++) {
        int i = order[o];
        if (dead[i]) continue;
        keep[nk++] = i;
        float ai = fmaxf(b[4 * i + 2] - b[4 * i], 0.f) * fmaxf(b[4 * i + 3] - b[4 * i + 1], 0.f);
        for (int p = o + 1; p < m; p++) {
            int j = order[p];
            if (dead[j] || (cls && cls[j] != cls[i])) continue;
            float aj = fmaxf(b[4 * j + 2] - b[4 * j], 0.f) * fmaxf(b[4 * j + 3] - b[4 * j + 1], 0.f);
            float w = fmaxf(fminf(b[4 * i + 2], b[4 * j + 2]) - fmaxf(b[4 * i], b[4 * j]), 0.f);
            float h = fmaxf(fminf(b[4 * i + 3], b[4 * j + 3]) - fmaxf(b[4 * i + 1], b[4 * j + 1]), 0.f);
            float inter = w * h;
            float uni = (ai + aj) - inter;
            if (inter > thr * uni) dead[j] = 1;
        }
    }
    free(order);
    free(dead);
    return nk;
}

static void check_nms(int n, float thr, int use_cls, int identical, float sthr, int max_det) {
    float *b = malloc(sizeof(float) * 4 * (n ? n : 1)), *s = malloc(sizeof(float) * (n ? n : 1));
    int32_t *c = malloc(sizeof(int32_t) * (n ? n : 1));
    for (int i = 0; i < n; i++) {
        float x = identical ? 10.f : rndf() * 1000.f, y = identical ? 20.f : rndf() * 1000.f;
        b[4 * i] = x, b[4 * i + 1] = y;
        b[4 * i + 2] = x + (identical ? 30.f : 1.f + rndf() * 120.f);
        b[4 * i + 3] = y + (identical ? 40.f : 1.f + rndf() * 120.f);
        s[i] = identical ? 0.5f : (float)(rnd() % 1000) / 1000.f; /* ties on purpose */
        c[i] = (int32_t)(rnd() % 4);
    }
    int64_t *k1 = malloc(8 * (n ? n : 1)), *k2 = malloc(8 * (n ? n : 1)), *kg = malloc(8 * (n ? n : 1));
    const int32_t *cl = use_cls ? c : NULL;
    int n1 = ef_nms(b, s, cl, n, thr, sthr, max_det, k1, EF_IMPL_AUTO);
    int n2 = ef_nms(b, s, cl, n, thr, sthr, max_det, k2, EF_IMPL_PORTABLE);
    int ng = golden_nms(b, s, cl, n, thr, sthr, max_det, kg);
    int ok = n1 == ng && n2 == ng && !memcmp(k1, kg, 8 * (size_t)ng) && !memcmp(k2, kg, 8 * (size_t)ng);
    checks++;
    if (!ok) failures++;
    printf("%s nms n=%d iou=%.2f classes=%d identical=%d score>=%.2f max_det=%d: kept %d/%d/%d\n",
           ok ? "ok  " : "FAIL", n, thr, use_cls, identical, sthr, max_det, n1, n2, ng);
    free(b), free(s), free(c), free(k1), free(k2), free(kg);
}

int main(void) {
    printf("NEON compiled in: %d\n", ef_have_neon());
    static const int shapes[][4] = {
        {1080, 1920, 640, 640}, {2, 2, 5, 7}, {2, 1000, 64, 64}, {1000, 2, 64, 64},
        {36, 100, 640, 384},    {720, 1280, 384, 640}, {4, 6, 4, 6}, {48, 34, 17, 33},
    };
    for (int f = 0; f < 4; f++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            check_pre(f, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], (int)(i % 2),
                      i == 0 ? 2 : 1);
    /* odd sizes only exist for packed frames */
    check_pre(EF_BGR, 1, 1, 8, 8, 0, 1);
    check_pre(EF_RGB, 7, 3, 16, 16, 1, 1);
    check_pre(EF_BGR, 999, 3, 320, 320, 0, 2);
    for (int r = 0; r < 12; r++) {
        int fmt = (int)(rnd() % 4);
        int sh = 2 + (int)(rnd() % 300) * 2, sw = 2 + (int)(rnd() % 300) * 2;
        check_pre(fmt, sh, sw, 1 + (int)(rnd() % 400), 1 + (int)(rnd() % 400), (int)(rnd() % 2),
                  1 + (int)(rnd() % 3));
    }
    check_nms(0, 0.5f, 0, 0, 0.f, 300);
    check_nms(1, 0.5f, 0, 0, 0.f, 300);
    check_nms(50, 0.5f, 0, 1, 0.f, 300);
    check_nms(50, 0.5f, 1, 1, 0.f, 300);
    check_nms(1000, 0.5f, 0, 0, 0.f, 1000);
    check_nms(1000, 0.3f, 1, 0, 0.2f, 100);
    check_nms(3000, 0.7f, 1, 0, 0.f, 3000);
    check_nms(3000, 0.0f, 0, 0, 0.5f, 50);
    printf("%s %d checks, %d failed\n", failures ? "FAILED" : "OK", checks, failures);
    return failures ? 1 : 0;
}
