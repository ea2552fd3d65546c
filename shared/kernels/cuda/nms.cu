// NMS on the GPU: the suppression bitmask of the score-sorted candidates, tile by tile.
//
// mask[i * words + j / 64] has bit (j % 64) set when candidate j (after i in the order)
// is suppressed by candidate i: same class and inter > thr * union, in float32 exactly as
// the reference computes it (build with --fmad=false). The greedy pass over the mask
// (keep i unless a kept box's row marks it) then equals the CPU's greedy NMS.
#include <stdint.h>

#define TILE 64

extern "C" __global__ void ef_nms_mask(const float4 *boxes, const int32_t *cls, int n,
                                       float thr, unsigned long long *mask) {
    int row_tile = blockIdx.y, col_tile = blockIdx.x;
    if (row_tile > col_tile) return;  // only j > i matters
    int rows = min(n - row_tile * TILE, TILE), cols = min(n - col_tile * TILE, TILE);
    __shared__ float4 sb[TILE];
    __shared__ int32_t sc[TILE];
    int tid = (int)threadIdx.x;
    if (tid < cols) {
        sb[tid] = boxes[col_tile * TILE + tid];
        sc[tid] = cls[col_tile * TILE + tid];
    }
    __syncthreads();
    if (tid >= rows) return;
    int i = row_tile * TILE + tid;
    float4 a = boxes[i];
    int32_t ca = cls[i];
    float wa = a.z - a.x, ha = a.w - a.y;
    float area_a = (wa > 0.f ? wa : 0.f) * (ha > 0.f ? ha : 0.f);
    unsigned long long bits = 0;
    int start = row_tile == col_tile ? tid + 1 : 0;
    for (int t = start; t < cols; t++) {
        float4 b = sb[t];
        if (sc[t] != ca) continue;
        float wb = b.z - b.x, hb = b.w - b.y;
        float area_b = (wb > 0.f ? wb : 0.f) * (hb > 0.f ? hb : 0.f);
        float xx1 = a.x > b.x ? a.x : b.x, yy1 = a.y > b.y ? a.y : b.y;
        float xx2 = a.z < b.z ? a.z : b.z, yy2 = a.w < b.w ? a.w : b.w;
        float w = xx2 - xx1, h = yy2 - yy1;
        w = w > 0.f ? w : 0.f;
        h = h > 0.f ? h : 0.f;
        float inter = __fmul_rn(w, h);
        float uni = __fsub_rn(__fadd_rn(area_a, area_b), inter);
        if (inter > __fmul_rn(thr, uni)) bits |= 1ull << t;
    }
    int words = (n + TILE - 1) / TILE;
    mask[(size_t)i * words + col_tile] = bits;
}
