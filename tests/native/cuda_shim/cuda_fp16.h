// Host-side stand-ins for the CUDA built-ins shared/kernels/cuda/*.cu use, so that
// tests/native/cuda_emulation.cpp can run the kernels' code on the CPU (g++), one
// emulated thread at a time. Only what those kernels need; not a CUDA implementation.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

struct EmuDim3 {
    unsigned x, y, z;
};
extern thread_local EmuDim3 blockIdx, threadIdx, blockDim;

struct float3 {
    float x, y, z;
};
struct float4 {
    float x, y, z, w;
};
struct __half {
    uint16_t bits;
};

inline int __float2int_rn(float f) { return (int)std::lrintf(f); }  // round half to even
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline void __syncthreads() {}
using std::max;
using std::min;

// IEEE binary16, round to nearest even (what __float2half_rn does on the device).
inline __half __float2half_rn(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    __half h;
    if (x >= 0x47800000u) {
        h.bits = (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
        return h;
    }
    if (x < 0x38800000u) {
        float m, half = 0.5f;
        std::memcpy(&m, &x, 4);
        float s = m + half;
        uint32_t q;
        std::memcpy(&q, &s, 4);
        h.bits = (uint16_t)(sign | (q - 0x3f000000u));
        return h;
    }
    uint32_t odd = (x >> 13) & 1u;
    x += 0xc8000fffu + odd;
    h.bits = (uint16_t)(sign | (x >> 13));
    return h;
}
