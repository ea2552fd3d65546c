/* edgefleet kernels: fused camera-frame -> tensor pre-processing and NMS.
 *
 * Plain C99 with no Python dependency, so the same sources build the CPython
 * extension and the native test driver (x86 and aarch64 under qemu).
 * Callers validate shapes; these functions trust their arguments.
 */
#ifndef EF_KERNELS_H
#define EF_KERNELS_H

#include <stdint.h>

enum ef_format { EF_NV12 = 0, EF_I420 = 1, EF_BGR = 2, EF_RGB = 3 };
/* Or'ed into the format code by callers (Python, CUDA launch): planes out in B, G, R order. */
enum { EF_FORMAT_MASK = 15, EF_BGR_OUT = 16 };
enum ef_impl { EF_IMPL_AUTO = 0, EF_IMPL_PORTABLE = 1 };

typedef struct {
    int format;               /* enum ef_format */
    const uint8_t *frame;     /* NV12/I420: (H*3/2, W); BGR/RGB: (H, W, 3), C-contiguous */
    int src_h, src_w;
    int dst_h, dst_w;         /* model canvas */
    int new_h, new_w;         /* resized image, placed at (top, left) */
    int top, left;
    float scale[3];           /* out = value_0_255 * scale + bias, per RGB channel */
    float bias[3];
    float pad_value[3];       /* normalised value of the padding, per channel */
    int f16;                  /* 1: IEEE half output, 0: float32 */
    int bgr_out;              /* 1: channel c lands in plane 2 - c (models fed B, G, R) */
    void *out;                /* (3, dst_h, dst_w) */
} ef_pre_args;

/* 0 on success, -1 when memory or threads could not be had. */
int ef_preprocess(const ef_pre_args *a, int impl, int threads);

/* Text-line quads of one frame, each rectified into a slot of a batch (the geometry and the
 * definition: shared/kernels/lines.py; the plan comes from there, computed once). */
typedef struct {
    int format;            /* enum ef_format */
    const uint8_t *frame;  /* as in ef_pre_args */
    int src_h, src_w;
    int n;                 /* quads */
    const double *hom;     /* (n, 9): slot pixel (x, y, 1) -> frame pixel, row-major */
    const int32_t *taps;   /* (n, 2): kx, ky bilinear taps per output pixel */
    const int32_t *widths; /* (n): columns of the slot the line fills, 1..out_w */
    const int32_t *slots;  /* (n): distinct slots of out */
    int out_h, out_w;      /* one slot's (h, W) */
    float scale[3];        /* out = mean level * scale + bias, per RGB channel */
    float bias[3];
    float fill;            /* normalised value right of each line */
    int bgr_out;           /* 1: channel c lands in plane 2 - c */
    float *out;            /* (B, 3, out_h, out_w) float32 */
} ef_lines_args;

/* Returns 0 (a thread that cannot start has its rows done by the caller). */
int ef_quads_to_tensor(const ef_lines_args *a, int threads);

/* Greedy NMS (see shared/kernels/reference.py for the exact rule).
 * Writes up to max_det indices into keep; returns the count, or -1 on ENOMEM. */
int ef_nms(const float *boxes, const float *scores, const int32_t *class_ids, int n,
           float iou_threshold, float score_threshold, int max_det, int64_t *keep, int impl);

/* Greedy OKS pose NMS; keypoints (n, k, 3) x/y/visibility, areas (n), sigmas (k). */
int ef_keypoint_nms(const float *keypoints, const float *scores, const double *areas,
                    const double *sigmas, int n, int k, double oks_threshold,
                    float score_threshold, int max_det, int64_t *keep);

/* 1 when the NEON paths were compiled in. */
int ef_have_neon(void);

/* Fill 'order' with candidate indices (score >= thr), by score desc then index asc;
 * returns their count, or -1 on ENOMEM. */
int ef_score_order(const float *scores, int n, float score_threshold, int32_t *order);

#endif
