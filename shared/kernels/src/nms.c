/* Greedy NMS and OKS pose NMS.
 *
 * Each candidate (by score, then index) is compared with the boxes kept so far; it is
 * kept when none of the same class overlaps it by more than the threshold. Work is
 * a scan of the kept boxes (structure-of-arrays blocks that gcc vectorises, early exit),
 * narrowed by a uniform grid when the threshold allows it (see ef_nms). The arithmetic
 * is the reference's, in float32, with contraction to FMA disabled at build time so the
 * decisions are bit-identical to numpy's.
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

/* With iou_threshold >= 0 a kept box can only suppress a candidate it intersects
 * (inter > 0), so kept boxes are also filed in a uniform grid of about one box size per
 * cell and a candidate is compared only with those filed in the cells it touches.
 * Cell indices are a monotonic function of the coordinates, so two boxes sharing an
 * interior point share a cell: the decisions are exactly those of the full scan. */
typedef struct {
    float x1, y1, x2, y2, area;
    int32_t cls;
} entry;

typedef struct {
    entry *v;
    int n, cap;
} cell;

typedef struct {
    double ox, oy, inv_w, inv_h;
    int gx, gy;
    cell *cells;
} grid;

#define GRID_MAX 128
#define GRID_SPAN_MAX 64 /* boxes touching more cells than this use the plain scan */

static int cell_of(double v, double origin, double inv, int g) {
    double d = (v - origin) * inv;
    if (!(d > 0.0)) return 0;
    if (d >= (double)g) return g - 1;
    return (int)d;
}

static int grid_init(grid *g, const float *boxes, const int32_t *order, int m) {
    double minx = INFINITY, miny = INFINITY, maxx = -INFINITY, maxy = -INFINITY, sw = 0, sh = 0;
    int counted = 0;
    for (int o = 0; o < m; o++) {
        const float *b = boxes + 4 * (size_t)order[o];
        if (!(b[2] > b[0] && b[3] > b[1])) continue;
        minx = fmin(minx, b[0]), miny = fmin(miny, b[1]);
        maxx = fmax(maxx, b[2]), maxy = fmax(maxy, b[3]);
        sw += (double)b[2] - b[0], sh += (double)b[3] - b[1];
        counted++;
    }
    g->ox = counted ? minx : 0.0, g->oy = counted ? miny : 0.0;
    double ex = counted ? maxx - minx : 0.0, ey = counted ? maxy - miny : 0.0;
    double size = counted ? fmax(sw, sh) / counted : 1.0;
    g->gx = size > 0 && ex / size < GRID_MAX ? (int)(ex / size) + 1 : GRID_MAX;
    g->gy = size > 0 && ey / size < GRID_MAX ? (int)(ey / size) + 1 : GRID_MAX;
    g->inv_w = ex > 0 ? g->gx / ex : 0.0;
    g->inv_h = ey > 0 ? g->gy / ey : 0.0;
    g->cells = calloc((size_t)g->gx * g->gy, sizeof(cell));
    return g->cells ? 0 : -1;
}

static void grid_free(grid *g) {
    if (!g->cells) return;
    for (int i = 0; i < g->gx * g->gy; i++) free(g->cells[i].v);
    free(g->cells);
}

/* Cell range of a box; 0 when it has no interior (it can then never intersect). */
static int grid_range(const grid *g, const float *b, int r[4]) {
    if (!(b[2] > b[0] && b[3] > b[1])) return 0;
    r[0] = cell_of(b[0], g->ox, g->inv_w, g->gx), r[2] = cell_of(b[2], g->ox, g->inv_w, g->gx);
    r[1] = cell_of(b[1], g->oy, g->inv_h, g->gy), r[3] = cell_of(b[3], g->oy, g->inv_h, g->gy);
    return 1;
}

static int grid_add(grid *g, const int r[4], entry e) {
    for (int cy = r[1]; cy <= r[3]; cy++)
        for (int cx = r[0]; cx <= r[2]; cx++) {
            cell *c = &g->cells[(size_t)cy * g->gx + cx];
            if (c->n == c->cap) {
                int cap = c->cap ? 2 * c->cap : 8;
                entry *v = realloc(c->v, (size_t)cap * sizeof(entry));
                if (!v) return -1;
                c->v = v, c->cap = cap;
            }
            c->v[c->n++] = e;
        }
    return 0;
}

static int grid_hit(const grid *g, const int r[4], const entry *q, float thr) {
    for (int cy = r[1]; cy <= r[3]; cy++)
        for (int cx = r[0]; cx <= r[2]; cx++) {
            const cell *c = &g->cells[(size_t)cy * g->gx + cx];
            for (int j = 0; j < c->n; j++) {
                const entry *k = &c->v[j];
                if (k->cls != q->cls) continue;
                float xx1 = k->x1 > q->x1 ? k->x1 : q->x1, yy1 = k->y1 > q->y1 ? k->y1 : q->y1;
                float xx2 = k->x2 < q->x2 ? k->x2 : q->x2, yy2 = k->y2 < q->y2 ? k->y2 : q->y2;
                float w = xx2 - xx1, h = yy2 - yy1;
                w = w > 0.f ? w : 0.f;
                h = h > 0.f ? h : 0.f;
                float inter = w * h;
                float uni = (k->area + q->area) - inter;
                if (inter > thr * uni) return 1;
            }
        }
    return 0;
}

static int span(const int r[4]) { return (r[2] - r[0] + 1) * (r[3] - r[1] + 1); }

int ef_nms(const float *boxes, const float *scores, const int32_t *class_ids, int n,
           float iou_threshold, float score_threshold, int max_det, int64_t *keep, int impl) {
    if (n <= 0 || max_det <= 0) return 0;
    int32_t *order = malloc((size_t)n * sizeof(int32_t));
    int cap = max_det < n ? max_det : n;
    float *mem = malloc((size_t)cap * 5 * sizeof(float));
    int32_t *cls = malloc((size_t)cap * sizeof(int32_t));
    grid g = {0};
    int rc = -1, nk = 0;
    if (!order || !mem || !cls) goto done;
    kept_set k = {mem, mem + cap, mem + 2 * (size_t)cap, mem + 3 * (size_t)cap,
                  mem + 4 * (size_t)cap, cls};
    int m = ef_score_order(scores, n, score_threshold, order);
    if (m < 0) goto done;
    /* The grid needs thr >= 0 (below 0 even disjoint boxes suppress). */
    int use_grid = impl != EF_IMPL_PORTABLE && iou_threshold >= 0.f && m >= 32;
    if (use_grid && grid_init(&g, boxes, order, m)) goto done;
    /* Kept boxes too big for the grid: compared with every candidate. */
    int nbig = 0;
    int32_t *big = use_grid ? malloc((size_t)cap * sizeof(int32_t)) : NULL;
    if (use_grid && !big) goto done;
    for (int o = 0; o < m && nk < cap; o++) {
        int i = order[o];
        const float *b = boxes + 4 * (size_t)i;
        float w = b[2] - b[0], h = b[3] - b[1];
        float area = (w > 0.f ? w : 0.f) * (h > 0.f ? h : 0.f);
        int32_t c = class_ids ? class_ids[i] : 0;
        entry q = {b[0], b[1], b[2], b[3], area, c};
        int r[4], inside = use_grid && grid_range(&g, b, r);
        int hit;
        if (!use_grid) {
            hit = overlaps(&k, nk, b[0], b[1], b[2], b[3], area, c, iou_threshold);
        } else if (!inside) {
            hit = 0; /* no interior: intersects nothing, and thr >= 0 */
        } else if (span(r) > GRID_SPAN_MAX) {
            hit = overlaps(&k, nk, b[0], b[1], b[2], b[3], area, c, iou_threshold);
        } else {
            hit = grid_hit(&g, r, &q, iou_threshold);
            for (int t = 0; t < nbig && !hit; t++) {
                int j = big[t];
                float xx1 = k.x1[j] > q.x1 ? k.x1[j] : q.x1, yy1 = k.y1[j] > q.y1 ? k.y1[j] : q.y1;
                float xx2 = k.x2[j] < q.x2 ? k.x2[j] : q.x2, yy2 = k.y2[j] < q.y2 ? k.y2[j] : q.y2;
                float iw = xx2 - xx1, ih = yy2 - yy1;
                iw = iw > 0.f ? iw : 0.f;
                ih = ih > 0.f ? ih : 0.f;
                float inter = iw * ih;
                float uni = (k.area[j] + area) - inter;
                hit = (inter > iou_threshold * uni) && k.cls[j] == c;
            }
        }
        if (hit) continue;
        if (inside) {
            if (span(r) > GRID_SPAN_MAX)
                big[nbig++] = nk;
            else if (grid_add(&g, r, q)) {
                free(big);
                goto done;
            }
        }
        k.x1[nk] = b[0];
        k.y1[nk] = b[1];
        k.x2[nk] = b[2];
        k.y2[nk] = b[3];
        k.area[nk] = area;
        k.cls[nk] = c;
        keep[nk++] = i;
    }
    free(big);
    rc = 0;
done:
    grid_free(&g);
    free(order);
    free(mem);
    free(cls);
    return rc ? -1 : nk;
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
