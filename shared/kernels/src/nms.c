/* Greedy NMS and OKS pose NMS.
 *
 * Each candidate (by score, then index) is compared with the boxes kept so far; it is
 * kept when none of the same class overlaps it by more than the threshold. Work is
 * O(candidates x kept) with early exit, over structure-of-arrays blocks that gcc
 * vectorises. The arithmetic is the reference's, in float32, with contraction to FMA
 * disabled at build time so the decisions are bit-identical to numpy's.
 */
#include "ef_kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(EF_NO_CLONES)
#define EF_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define EF_CLONES
#endif

typedef struct {
    float s;
    int32_t i;
} scored;

static int by_score(const void *pa, const void *pb) {
    const scored *a = pa, *b = pb;
    if (a->s > b->s) return -1;
    if (a->s < b->s) return 1;
    return (a->i > b->i) - (a->i < b->i);
}

int ef_score_order(const float *scores, int n, float score_threshold, int32_t *order) {
    scored *c = malloc((size_t)(n > 0 ? n : 1) * sizeof(scored));
    if (!c) return -1;
    int m = 0;
    for (int i = 0; i < n; i++)
        if (scores[i] >= score_threshold) c[m++] = (scored){scores[i], i};
    qsort(c, (size_t)m, sizeof(scored), by_score);
    for (int i = 0; i < m; i++) order[i] = c[i].i;
    free(c);
    return m;
}

#define BLOCK 16

typedef struct {
    float *x1, *y1, *x2, *y2, *area;
    int32_t *cls;
} kept_set;

/* 1 when any of the first n kept boxes suppresses the candidate. */
EF_CLONES static int overlaps(const kept_set *k, int n, float x1, float y1, float x2, float y2,
                              float area, int32_t cls, float thr) {
    int k0 = 0;
    for (; k0 + BLOCK <= n; k0 += BLOCK) {
        int hit = 0;
        for (int j = k0; j < k0 + BLOCK; j++) {
            float xx1 = k->x1[j] > x1 ? k->x1[j] : x1, yy1 = k->y1[j] > y1 ? k->y1[j] : y1;
            float xx2 = k->x2[j] < x2 ? k->x2[j] : x2, yy2 = k->y2[j] < y2 ? k->y2[j] : y2;
            float w = xx2 - xx1, h = yy2 - yy1;
            w = w > 0.f ? w : 0.f;
            h = h > 0.f ? h : 0.f;
            float inter = w * h;
            float uni = (k->area[j] + area) - inter;
            hit |= (inter > thr * uni) & (k->cls[j] == cls);
        }
        if (hit) return 1;
    }
    for (int j = k0; j < n; j++) {
        float xx1 = k->x1[j] > x1 ? k->x1[j] : x1, yy1 = k->y1[j] > y1 ? k->y1[j] : y1;
        float xx2 = k->x2[j] < x2 ? k->x2[j] : x2, yy2 = k->y2[j] < y2 ? k->y2[j] : y2;
        float w = xx2 - xx1, h = yy2 - yy1;
        w = w > 0.f ? w : 0.f;
        h = h > 0.f ? h : 0.f;
        float inter = w * h;
        float uni = (k->area[j] + area) - inter;
        if ((inter > thr * uni) && k->cls[j] == cls) return 1;
    }
    return 0;
}

int ef_nms(const float *boxes, const float *scores, const int32_t *class_ids, int n,
           float iou_threshold, float score_threshold, int max_det, int64_t *keep, int impl) {
    (void)impl;
    if (n <= 0 || max_det <= 0) return 0;
    int32_t *order = malloc((size_t)n * sizeof(int32_t));
    int cap = max_det < n ? max_det : n;
    float *mem = malloc((size_t)cap * 5 * sizeof(float));
    int32_t *cls = malloc((size_t)cap * sizeof(int32_t));
    if (!order || !mem || !cls) {
        free(order);
        free(mem);
        free(cls);
        return -1;
    }
    kept_set k = {mem, mem + cap, mem + 2 * (size_t)cap, mem + 3 * (size_t)cap,
                  mem + 4 * (size_t)cap, cls};
    int m = ef_score_order(scores, n, score_threshold, order);
    int nk = 0;
    for (int o = 0; o < m && nk < cap; o++) {
        int i = order[o];
        const float *b = boxes + 4 * (size_t)i;
        float w = b[2] - b[0], h = b[3] - b[1];
        float area = (w > 0.f ? w : 0.f) * (h > 0.f ? h : 0.f);
        int32_t c = class_ids ? class_ids[i] : 0;
        if (overlaps(&k, nk, b[0], b[1], b[2], b[3], area, c, iou_threshold)) continue;
        k.x1[nk] = b[0];
        k.y1[nk] = b[1];
        k.x2[nk] = b[2];
        k.y2[nk] = b[3];
        k.area[nk] = area;
        k.cls[nk] = c;
        keep[nk++] = i;
    }
    free(order);
    free(mem);
    free(cls);
    return nk;
}

int ef_keypoint_nms(const float *kp, const float *scores, const double *areas,
                    const double *sigmas, int n, int k, double oks_threshold,
                    float score_threshold, int max_det, int64_t *keep) {
    if (n <= 0 || max_det <= 0) return 0;
    int32_t *order = malloc((size_t)n * sizeof(int32_t));
    double *var = malloc((size_t)k * sizeof(double));
    if (!order || !var) {
        free(order);
        free(var);
        return -1;
    }
    for (int j = 0; j < k; j++) var[j] = (2.0 * sigmas[j]) * (2.0 * sigmas[j]);
    int m = ef_score_order(scores, n, score_threshold, order);
    const double eps = 2.220446049250313e-16;
    int nk = 0;
    for (int o = 0; o < m && nk < max_det; o++) {
        int i = order[o];
        const float *b = kp + (size_t)i * k * 3;
        int suppressed = 0;
        for (int q = 0; q < nk && !suppressed; q++) {
            const float *a = kp + (size_t)keep[q] * k * 3;
            double area = areas[keep[q]], sum = 0.0;
            int nvis = 0;
            for (int j = 0; j < k; j++) {
                if (!(a[3 * j + 2] > 0.f)) continue;
                double dx = (double)a[3 * j] - (double)b[3 * j];
                double dy = (double)a[3 * j + 1] - (double)b[3 * j + 1];
                double e = (dx * dx + dy * dy) / var[j] / (area + eps) / 2.0;
                sum += exp(-e);
                nvis++;
            }
            if (nvis && sum / nvis > oks_threshold) suppressed = 1;
        }
        if (!suppressed) keep[nk++] = i;
    }
    free(order);
    free(var);
    return nk;
}
