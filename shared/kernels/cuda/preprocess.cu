// Fused camera frame -> normalised NCHW tensor on the GPU, one thread per output pixel.
//
// Same definitions as shared/kernels/src/preprocess.c (and so the OpenCV reference):
// BT.601 in cv2's 20-bit fixed point, cv2 INTER_LINEAR tables (half-pixel centres,
// 11-bit weights), the weighted sum kept exact and normalised in float. The frame stays
// in device memory: decoders' pitched NV12 surfaces are read through `pitch`.
// Build with --fmad=false (the launcher does) to match the CPU results bit for bit.
#include <cuda_fp16.h>
#include <stdint.h>

#define CY 1220542
#define CUB 2116026
#define CUG (-409993)
#define CVG (-852492)
#define CVR 1673527
#define SHIFT 20
#define HALF (1 << (SHIFT - 1))

struct Axis {
    int s0, s1, w0, w1;
};

__device__ __forceinline__ Axis axis(int src, int dst, int d) {
    double scale = 1.0 / ((double)dst / src);
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
    Axis a;
    a.s0 = s;
    a.s1 = s + 1 < src ? s + 1 : src - 1;
    a.w0 = __float2int_rn((1.f - f) * 2048.f);
    a.w1 = __float2int_rn(f * 2048.f);
    return a;
}

__device__ __forceinline__ int clamp8(int v) { return v < 0 ? 0 : (v > 255 ? 255 : v); }

// format: 0 NV12, 1 I420, 2 BGR, 3 RGB
__device__ __forceinline__ void rgb_at(const uint8_t *f, int format, int h, int pitch, int x,
                                       int y, int rgb[3]) {
    if (format >= 2) {
        const uint8_t *p = f + (size_t)y * pitch + 3 * x;
        int swap = format == 2;
        rgb[0] = p[swap ? 2 : 0];
        rgb[1] = p[1];
        rgb[2] = p[swap ? 0 : 2];
        return;
    }
    int yy = f[(size_t)y * pitch + x], u, v;
    if (format == 0) {
        const uint8_t *uv = f + (size_t)h * pitch + (size_t)(y / 2) * pitch + (x & ~1);
        u = uv[0];
        v = uv[1];
    } else {
        // I420 is tightly packed: the chroma planes follow with pitch/2 rows.
        const uint8_t *up = f + (size_t)h * pitch;
        const uint8_t *vp = up + (size_t)(h / 2) * (pitch / 2);
        u = up[(size_t)(y / 2) * (pitch / 2) + x / 2];
        v = vp[(size_t)(y / 2) * (pitch / 2) + x / 2];
    }
    int yv = (yy - 16 > 0 ? yy - 16 : 0) * CY;
    u -= 128;
    v -= 128;
    rgb[0] = clamp8((yv + (HALF + CVR * v)) >> SHIFT);
    rgb[1] = clamp8((yv + (HALF + CVG * v + CUG * u)) >> SHIFT);
    rgb[2] = clamp8((yv + (HALF + CUB * u)) >> SHIFT);
}

template <typename T>
__device__ __forceinline__ void store(T *o, size_t i, float v);
template <>
__device__ __forceinline__ void store<float>(float *o, size_t i, float v) {
    o[i] = v;
}
template <>
__device__ __forceinline__ void store<__half>(__half *o, size_t i, float v) {
    o[i] = __float2half_rn(v);
}

template <typename T>
__device__ void to_tensor(const uint8_t *frame, int format, int src_h, int src_w, int pitch,
                          int dst_h, int dst_w, int new_h, int new_w, int top, int left,
                          float3 scale, float3 bias, float3 pad, T *out) {
    int ox = blockIdx.x * blockDim.x + threadIdx.x;
    int oy = blockIdx.y * blockDim.y + threadIdx.y;
    if (ox >= dst_w || oy >= dst_h) return;
    size_t plane = (size_t)dst_h * dst_w, i = (size_t)oy * dst_w + ox;
    // EF_BGR_OUT (16) or'ed into the format: RGB channel c lands in plane 2 - c
    size_t first = (format & 16) ? 2 * plane : 0;
    ptrdiff_t step = (format & 16) ? -(ptrdiff_t)plane : (ptrdiff_t)plane;
    format &= 15;
    int rx = ox - left, ry = oy - top;
    if (rx < 0 || ry < 0 || rx >= new_w || ry >= new_h) {
        store(out, first + i, pad.x);
        store(out, first + step + i, pad.y);
        store(out, first + 2 * step + i, pad.z);
        return;
    }
    Axis ax = axis(src_w, new_w, rx), ay = axis(src_h, new_h, ry);
    int p00[3], p01[3], p10[3], p11[3];
    rgb_at(frame, format, src_h, pitch, ax.s0, ay.s0, p00);
    rgb_at(frame, format, src_h, pitch, ax.s1, ay.s0, p01);
    rgb_at(frame, format, src_h, pitch, ax.s0, ay.s1, p10);
    rgb_at(frame, format, src_h, pitch, ax.s1, ay.s1, p11);
    float k[3] = {scale.x, scale.y, scale.z}, b[3] = {bias.x, bias.y, bias.z};
    for (int c = 0; c < 3; c++) {
        int h0 = p00[c] * ax.w0 + p01[c] * ax.w1;
        int h1 = p10[c] * ax.w0 + p11[c] * ax.w1;
        int v = h0 * ay.w0 + h1 * ay.w1;
        store(out, first + c * step + i, (float)v * k[c] + b[c]);
    }
}

// Pointers first, then ints, then float3s: no padding questions across launchers.
extern "C" __global__ void ef_to_tensor_f32(const uint8_t *frame, float *out, int format,
                                            int src_h, int src_w, int pitch, int dst_h,
                                            int dst_w, int new_h, int new_w, int top, int left,
                                            float3 scale, float3 bias, float3 pad) {
    to_tensor<float>(frame, format, src_h, src_w, pitch, dst_h, dst_w, new_h, new_w, top, left,
                     scale, bias, pad, out);
}

// Pointers first, then ints, then float3s: no padding questions across launchers.
extern "C" __global__ void ef_to_tensor_f16(const uint8_t *frame, __half *out, int format,
                                            int src_h, int src_w, int pitch, int dst_h,
                                            int dst_w, int new_h, int new_w, int top, int left,
                                            float3 scale, float3 bias, float3 pad) {
    to_tensor<__half>(frame, format, src_h, src_w, pitch, dst_h, dst_w, new_h, new_w, top, left,
                      scale, bias, pad, out);
}

// Text-line quads -> slots of an NCHW float32 batch (shared/kernels/lines.py defines it):
// one thread per output pixel of one quad (blockIdx.z); the mean of kx x ky bilinear taps
// through the quad's homography (float here, double on the CPU: within the documented
// tolerance), border replicated, colour-converted per tap, normalised in the same pass.
__device__ __forceinline__ void line_tap(const uint8_t *frame, int format, int src_h, int src_w,
                                         int pitch, float sx, float sy, float acc[3]) {
    if (!(sx >= -1.f)) sx = -1.f;  // also NaN
    if (!(sy >= -1.f)) sy = -1.f;
    if (sx > (float)src_w) sx = (float)src_w;
    if (sy > (float)src_h) sy = (float)src_h;
    float fx0 = floorf(sx), fy0 = floorf(sy);
    float fx = sx - fx0, fy = sy - fy0;
    int x0 = (int)fx0, y0 = (int)fy0;
    int xa = min(max(x0, 0), src_w - 1), xb = min(max(x0 + 1, 0), src_w - 1);
    int ya = min(max(y0, 0), src_h - 1), yb = min(max(y0 + 1, 0), src_h - 1);
    int p00[3], p01[3], p10[3], p11[3];
    rgb_at(frame, format, src_h, pitch, xa, ya, p00);
    rgb_at(frame, format, src_h, pitch, xb, ya, p01);
    rgb_at(frame, format, src_h, pitch, xa, yb, p10);
    rgb_at(frame, format, src_h, pitch, xb, yb, p11);
    for (int c = 0; c < 3; c++) {
        float top = (float)p00[c] * (1.f - fx) + (float)p01[c] * fx;
        float bottom = (float)p10[c] * (1.f - fx) + (float)p11[c] * fx;
        acc[c] += top * (1.f - fy) + bottom * fy;
    }
}

// Pointers first, then ints, then floats/float3s. hom: (n, 9) float, taps: (n, 2) kx, ky.
extern "C" __global__ void ef_quads_to_tensor_f32(const uint8_t *frame, const float *hom,
                                                  const int *taps, const int *widths,
                                                  const int *slots, float *out, int format,
                                                  int src_h, int src_w, int pitch, int n,
                                                  int out_h, int out_w, float fill, float3 scale,
                                                  float3 bias) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    int i = blockIdx.z;
    if (x >= out_w || y >= out_h || i >= n) return;
    size_t plane = (size_t)out_h * out_w;
    size_t at = (size_t)slots[i] * 3 * plane + (size_t)y * out_w + x;
    int bgr = (format & 16) != 0;
    format &= 15;
    if (x >= widths[i]) {
        out[at] = fill;
        out[at + plane] = fill;
        out[at + 2 * plane] = fill;
        return;
    }
    const float *m = hom + 9 * (size_t)i;
    int kx = taps[2 * i], ky = taps[2 * i + 1];
    float acc[3] = {0.f, 0.f, 0.f};
    for (int b = 0; b < ky; b++) {
        float py = (float)y + ((float)b + 0.5f) / (float)ky;
        for (int t = 0; t < kx; t++) {
            float px = (float)x + ((float)t + 0.5f) / (float)kx;
            float den = m[6] * px + m[7] * py + m[8];
            line_tap(frame, format, src_h, src_w, pitch, (m[0] * px + m[1] * py + m[2]) / den,
                     (m[3] * px + m[4] * py + m[5]) / den, acc);
        }
    }
    float inv = 1.f / (float)(kx * ky);
    float k[3] = {scale.x, scale.y, scale.z}, o[3] = {bias.x, bias.y, bias.z};
    for (int c = 0; c < 3; c++)
        out[at + (size_t)(bgr ? 2 - c : c) * plane] = acc[c] * inv * k[c] + o[c];
}
