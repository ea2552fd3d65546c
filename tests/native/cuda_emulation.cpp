// Runs the CUDA kernels' code (shared/kernels/cuda/*.cu) on the CPU through the shim in
// cuda_shim/, thread by thread, and checks it against the C kernels: the pre-processing
// tensor must be bit-identical, the line crops (float coordinates on the GPU, double in C)
// within 0.05 of a level, and the greedy pass over the NMS bitmask must keep exactly
// ef_nms's indices. This tests the kernels' arithmetic and indexing where no GPU
// is present; launch, memory and timing are left to the `gpu` tests.
//
// Build (tests/unit/test_kernels_cuda_build.py does this):
//   gcc -O2 -ffp-contract=off -c shared/kernels/src/{preprocess,preprocess_x86,nms,lines}.c
//   g++ -O2 -ffp-contract=off -I tests/native/cuda_shim -I shared/kernels/src
//       tests/native/cuda_emulation.cpp *.o -pthread -o emu && ./emu
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_fp16.h"

thread_local EmuDim3 blockIdx, threadIdx, blockDim;

#include "../../shared/kernels/cuda/nms.cu"
#include "../../shared/kernels/cuda/preprocess.cu"

extern "C" {
#include "ef_kernels.h"
}

static int failures = 0, checks = 0;
static uint64_t rng = 0x243f6a8885a308d3ull;
static uint32_t rnd() {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static void plan(ef_pre_args &a, int sh, int sw, int dh, int dw) {
    double s = std::min((double)dh / sh, (double)dw / sw);
    int nh = std::max(1, std::min(dh, (int)std::nearbyint(sh * s)));
    int nw = std::max(1, std::min(dw, (int)std::nearbyint(sw * s)));
    a.src_h = sh, a.src_w = sw, a.dst_h = dh, a.dst_w = dw, a.new_h = nh, a.new_w = nw;
    a.top = (dh - nh) / 2, a.left = (dw - nw) / 2;
}

static void check_pre(int format, int sh, int sw, int dh, int dw, int f16) {
    size_t in = format <= EF_I420 ? (size_t)sh * sw * 3 / 2 : (size_t)sh * sw * 3;
    std::vector<uint8_t> frame(in);
    for (auto &b : frame) b = (uint8_t)rnd();
    ef_pre_args a;
    std::memset(&a, 0, sizeof a);
    a.format = format;
    a.frame = frame.data();
    plan(a, sh, sw, dh, dw);
    const float mean[3] = {0.485f, 0.456f, 0.406f}, stdv[3] = {0.229f, 0.224f, 0.225f};
    for (int c = 0; c < 3; c++) {
        a.scale[c] = (float)(1.0 / (255.0 * 4194304.0 * stdv[c]));
        a.bias[c] = -mean[c] / stdv[c];
        a.pad_value[c] = (float)((114 / 255.0 - mean[c]) / stdv[c]);
    }
    a.f16 = f16;
    size_t n = (size_t)3 * dh * dw, bytes = n * (f16 ? 2 : 4);
    std::vector<uint8_t> want(bytes), got(bytes, 0xAB);
    a.out = want.data();
    ef_preprocess(&a, EF_IMPL_PORTABLE, 1);
    int pitch = format >= EF_BGR ? sw * 3 : sw;
    float3 scale = {a.scale[0], a.scale[1], a.scale[2]}, bias = {a.bias[0], a.bias[1], a.bias[2]};
    float3 pad = {a.pad_value[0], a.pad_value[1], a.pad_value[2]};
    blockDim = {32, 8, 1};
    for (unsigned by = 0; by < (unsigned)(dh + 7) / 8; by++)
        for (unsigned bx = 0; bx < (unsigned)(dw + 31) / 32; bx++)
            for (unsigned ty = 0; ty < 8; ty++)
                for (unsigned tx = 0; tx < 32; tx++) {
                    blockIdx = {bx, by, 0};
                    threadIdx = {tx, ty, 0};
                    if (f16)
                        ef_to_tensor_f16(frame.data(), (__half *)got.data(), format, sh, sw, pitch,
                                         dh, dw, a.new_h, a.new_w, a.top, a.left, scale, bias, pad);
                    else
                        ef_to_tensor_f32(frame.data(), (float *)got.data(), format, sh, sw, pitch,
                                         dh, dw, a.new_h, a.new_w, a.top, a.left, scale, bias, pad);
                }
    bool ok = want == got;
    checks++;
    failures += !ok;
    std::printf("%s cuda-emu pre format=%d %dx%d -> %dx%d %s\n", ok ? "ok  " : "FAIL", format, sh,
                sw, dh, dw, f16 ? "f16" : "f32");
}

// Parallelogram lines (an affine homography: slot (x, y) -> tl + x/w (tr - tl) + y/h (bl - tl)).
static void check_lines(int format, int sh, int sw) {
    size_t in = format <= EF_I420 ? (size_t)sh * sw * 3 / 2 : (size_t)sh * sw * 3;
    std::vector<uint8_t> frame(in);
    for (auto &b : frame) b = (uint8_t)rnd();
    const int n = 5, oh = 16, ow = 40;
    std::vector<double> hom(9 * n);
    std::vector<float> homf(9 * n);
    std::vector<int32_t> taps(2 * n), widths(n), slots(n);
    for (int i = 0; i < n; i++) {
        double tlx = (double)(rnd() % (sw + 20)) - 10.3, tly = (double)(rnd() % (sh + 20)) - 10.7;
        double ux = (double)(rnd() % 300) + 1.5, uy = (double)(rnd() % 40) - 20.25;
        double vx = (double)(rnd() % 20) - 10.5, vy = (double)(rnd() % 120) + 2.5;
        widths[i] = 1 + (int)(rnd() % ow);
        slots[i] = n - 1 - i;
        taps[2 * i] = 1 + i % 3;
        taps[2 * i + 1] = 1 + i % 4;
        double m[9] = {ux / widths[i], vx / oh, tlx, uy / widths[i], vy / oh, tly, 0, 0, 1};
        for (int k = 0; k < 9; k++) hom[9 * i + k] = m[k], homf[9 * i + k] = (float)m[k];
    }
    ef_lines_args a;
    std::memset(&a, 0, sizeof a);
    a.format = format;
    a.frame = frame.data();
    a.src_h = sh, a.src_w = sw, a.n = n, a.out_h = oh, a.out_w = ow;
    a.hom = hom.data(), a.taps = taps.data(), a.widths = widths.data(), a.slots = slots.data();
    for (int c = 0; c < 3; c++) a.scale[c] = 1.f / 255.f, a.bias[c] = 0.f;
    a.fill = -1.f;
    std::vector<float> want((size_t)n * 3 * oh * ow), got(want.size(), 9.f);
    a.out = want.data();
    ef_quads_to_tensor(&a, 1);
    float3 scale = {a.scale[0], a.scale[1], a.scale[2]}, bias = {0.f, 0.f, 0.f};
    blockDim = {32, 8, 1};
    for (unsigned bz = 0; bz < (unsigned)n; bz++)
        for (unsigned by = 0; by < (unsigned)(oh + 7) / 8; by++)
            for (unsigned bx = 0; bx < (unsigned)(ow + 31) / 32; bx++)
                for (unsigned ty = 0; ty < 8; ty++)
                    for (unsigned tx = 0; tx < 32; tx++) {
                        blockIdx = {bx, by, bz};
                        threadIdx = {tx, ty, 0};
                        ef_quads_to_tensor_f32(frame.data(), homf.data(), taps.data(), widths.data(),
                                           slots.data(), got.data(), format,
                                           sh, sw, format >= EF_BGR ? sw * 3 : sw, n, oh, ow,
                                           a.fill, scale, bias);
                    }
    float worst = 0.f;
    for (size_t k = 0; k < want.size(); k++) worst = std::max(worst, std::fabs(want[k] - got[k]));
    bool ok = worst <= 0.05f / 255.f;
    checks++;
    failures += !ok;
    std::printf("%s cuda-emu lines format=%d %dx%d max diff %.2e levels\n", ok ? "ok  " : "FAIL",
                format, sh, sw, worst * 255.f);
}

static void check_nms(int n, float thr, bool classes, float sthr, int max_det) {
    std::vector<float> boxes(4 * (size_t)n), scores(n);
    std::vector<int32_t> cls(n);
    for (int i = 0; i < n; i++) {
        float x = (float)(rnd() % 1000), y = (float)(rnd() % 1000);
        boxes[4 * i] = x, boxes[4 * i + 1] = y;
        boxes[4 * i + 2] = x + 1 + (float)(rnd() % 120), boxes[4 * i + 3] = y + 1 + (float)(rnd() % 120);
        scores[i] = (float)(rnd() % 500) / 500.f;
        cls[i] = classes ? (int32_t)(rnd() % 3) : 0;
    }
    std::vector<int64_t> want(n ? n : 1);
    int nw = ef_nms(boxes.data(), scores.data(), classes ? cls.data() : nullptr, n, thr, sthr,
                    max_det, want.data(), EF_IMPL_AUTO);
    // What the launcher does: order on the host, bitmask on the "device", greedy pass.
    std::vector<int32_t> order(n ? n : 1);
    int m = ef_score_order(scores.data(), n, sthr, order.data());
    std::vector<float4> sb(m ? m : 1);
    std::vector<int32_t> sc(m ? m : 1);
    for (int i = 0; i < m; i++) {
        const float *b = &boxes[4 * (size_t)order[i]];
        sb[i] = {b[0], b[1], b[2], b[3]};
        sc[i] = cls[order[i]];
    }
    int words = (m + 63) / 64;
    std::vector<unsigned long long> mask((size_t)m * words + 1, 0);
    blockDim = {64, 1, 1};
    for (int ry = 0; ry < words; ry++)
        for (int rx = 0; rx < words; rx++)
            // __syncthreads: run the block's threads twice, the first run fills its tile
            for (int pass = 0; pass < 2; pass++)
                for (unsigned t = 0; t < 64; t++) {
                    blockIdx = {(unsigned)rx, (unsigned)ry, 0};
                    threadIdx = {t, 0, 0};
                    ef_nms_mask(sb.data(), sc.data(), m, thr, mask.data());
                }
    std::vector<unsigned long long> removed(words + 1, 0);
    std::vector<int64_t> got;
    for (int i = 0; i < m && (int)got.size() < max_det; i++) {
        if (removed[i / 64] >> (i % 64) & 1ull) continue;
        got.push_back(order[i]);
        for (int w = 0; w < words; w++) removed[w] |= mask[(size_t)i * words + w];
    }
    bool ok = (int)got.size() == nw && std::equal(got.begin(), got.end(), want.begin());
    checks++;
    failures += !ok;
    std::printf("%s cuda-emu nms n=%d iou=%.2f classes=%d kept %zu vs %d\n", ok ? "ok  " : "FAIL",
                n, thr, (int)classes, got.size(), nw);
}

int main() {
    const int shapes[][4] = {{1080, 1920, 640, 640}, {2, 2, 5, 7},  {36, 100, 64, 38},
                             {480, 640, 640, 640},   {6, 4, 17, 3}, {250, 2, 32, 32}};
    for (int f = 0; f < 4; f++)
        for (int s = 0; s < 6; s++) check_pre(f, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], s % 2);
    check_pre(EF_BGR, 1, 1, 3, 5, 0);
    check_pre(EF_RGB, 7, 3, 9, 9, 1);
    for (int f = 0; f < 4; f++) {
        check_lines(f, 720, 1280);
        check_lines(f, 2, 2);
    }
    check_nms(0, 0.5f, false, 0.f, 100);
    check_nms(1, 0.5f, false, 0.f, 100);
    check_nms(64, 0.5f, false, 0.f, 64);
    check_nms(65, 0.3f, true, 0.f, 65);
    check_nms(1000, 0.5f, false, 0.f, 1000);
    check_nms(2000, 0.6f, true, 0.3f, 200);
    std::printf("%s %d checks, %d failed\n", failures ? "FAILED" : "OK", checks, failures);
    return failures ? 1 : 0;
}
