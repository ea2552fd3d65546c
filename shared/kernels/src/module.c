/* CPython bindings for the kernels (buffer protocol only, so no numpy ABI tie).
 *
 * shared/kernels/native.py validates every argument with typed errors first; the
 * checks here are a second line so that a direct caller gets ValueError, never a crash.
 * The GIL is released while a kernel runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "ef_kernels.h"

static int get3(PyObject *seq, float out[3], const char *name) {
    PyObject *fast = PySequence_Fast(seq, name);
    if (!fast) return -1;
    if (PySequence_Fast_GET_SIZE(fast) != 3) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "%s must have 3 values", name);
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        double v = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, i));
        if (v == -1.0 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
        out[i] = (float)v;
    }
    Py_DECREF(fast);
    return 0;
}

static PyObject *py_preprocess(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer frame, out;
    ef_pre_args a;
    PyObject *scale, *bias, *pad;
    int impl, threads;
    if (!PyArg_ParseTuple(args, "y*iiiiiiiiiOOOw*iii", &frame, &a.format, &a.src_h, &a.src_w,
                          &a.dst_h, &a.dst_w, &a.new_h, &a.new_w, &a.top, &a.left, &scale, &bias,
                          &pad, &out, &a.f16, &impl, &threads))
        return NULL;
    a.bgr_out = (a.format & EF_BGR_OUT) != 0;
    if (a.format >= 0) a.format &= EF_FORMAT_MASK;
    const char *err = NULL;
    Py_ssize_t expect_in = 0;
    if (a.src_h < 1 || a.src_w < 1 || a.src_h > 65536 || a.src_w > 65536) err = "bad source size";
    else if (a.format == EF_NV12 || a.format == EF_I420) {
        if (a.src_h % 2 || a.src_w % 2) err = "4:2:0 frames need even sizes";
        expect_in = (Py_ssize_t)a.src_h * a.src_w * 3 / 2;
    } else if (a.format == EF_BGR || a.format == EF_RGB) {
        expect_in = (Py_ssize_t)a.src_h * a.src_w * 3;
    } else err = "unknown format";
    if (!err && frame.len != expect_in) err = "frame buffer has the wrong length";
    if (!err && (a.dst_h < 1 || a.dst_w < 1 || a.new_h < 1 || a.new_w < 1 || a.top < 0 ||
                 a.left < 0 || a.top + a.new_h > a.dst_h || a.left + a.new_w > a.dst_w ||
                 a.dst_h > 65536 || a.dst_w > 65536))
        err = "bad letterbox geometry";
    if (!err && out.len != (Py_ssize_t)3 * a.dst_h * a.dst_w * (a.f16 ? 2 : 4))
        err = "out buffer has the wrong length";
    if (!err && (get3(scale, a.scale, "scale") || get3(bias, a.bias, "bias") ||
                 get3(pad, a.pad_value, "pad_value"))) {
        PyBuffer_Release(&frame);
        PyBuffer_Release(&out);
        return NULL;
    }
    if (err) {
        PyBuffer_Release(&frame);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    a.frame = frame.buf;
    a.out = out.buf;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = ef_preprocess(&a, impl, threads);
    Py_END_ALLOW_THREADS PyBuffer_Release(&frame);
    PyBuffer_Release(&out);
    if (rc) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_quads_to_tensor(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer frame, hom, taps, widths, slots, out;
    ef_lines_args a;
    PyObject *scale, *bias;
    int threads;
    if (!PyArg_ParseTuple(args, "y*iiiy*y*y*y*w*iiOOfi", &frame, &a.format, &a.src_h, &a.src_w,
                          &hom, &taps, &widths, &slots, &out, &a.out_h, &a.out_w, &scale, &bias,
                          &a.fill, &threads))
        return NULL;
    a.bgr_out = (a.format & EF_BGR_OUT) != 0;
    if (a.format >= 0) a.format &= EF_FORMAT_MASK;
    const char *err = NULL;
    Py_ssize_t expect_in = 0, n = widths.len / 4, batch = 0;
    if (a.src_h < 1 || a.src_w < 1 || a.src_h > 65536 || a.src_w > 65536) err = "bad source size";
    else if (a.format == EF_NV12 || a.format == EF_I420) {
        if (a.src_h % 2 || a.src_w % 2) err = "4:2:0 frames need even sizes";
        expect_in = (Py_ssize_t)a.src_h * a.src_w * 3 / 2;
    } else if (a.format == EF_BGR || a.format == EF_RGB) {
        expect_in = (Py_ssize_t)a.src_h * a.src_w * 3;
    } else err = "unknown format";
    if (!err && frame.len != expect_in) err = "frame buffer has the wrong length";
    if (!err && (a.out_h < 1 || a.out_w < 1 || a.out_h > 65536 || a.out_w > 65536))
        err = "bad slot size";
    if (!err) {
        Py_ssize_t slot_len = (Py_ssize_t)3 * a.out_h * a.out_w * 4;
        batch = out.len / slot_len;
        if (out.len % slot_len || widths.len % 4 || n > 0x7fffffff || hom.len != n * 72 ||
            taps.len != n * 8 || slots.len != n * 4)
            err = "buffer lengths differ";
    }
    const int32_t *w = widths.buf, *s = slots.buf, *k = taps.buf;
    for (Py_ssize_t i = 0; !err && i < n; i++) {
        if (w[i] < 1 || w[i] > a.out_w || s[i] < 0 || s[i] >= batch || k[2 * i] < 1 ||
            k[2 * i] > 64 || k[2 * i + 1] < 1 || k[2 * i + 1] > 64)
            err = "width, slot or taps out of range";
    }
    if (!err && (get3(scale, a.scale, "scale") || get3(bias, a.bias, "bias"))) {
        PyBuffer_Release(&frame);
        PyBuffer_Release(&hom);
        PyBuffer_Release(&taps);
        PyBuffer_Release(&widths);
        PyBuffer_Release(&slots);
        PyBuffer_Release(&out);
        return NULL;
    }
    if (!err) {
        a.frame = frame.buf;
        a.n = (int)n;
        a.hom = hom.buf;
        a.taps = k;
        a.widths = w;
        a.slots = s;
        a.out = out.buf;
        Py_BEGIN_ALLOW_THREADS ef_quads_to_tensor(&a, threads);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&frame);
    PyBuffer_Release(&hom);
    PyBuffer_Release(&taps);
    PyBuffer_Release(&widths);
    PyBuffer_Release(&slots);
    PyBuffer_Release(&out);
    if (err) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_nms(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer boxes, scores, keep, cls = {0};
    PyObject *cls_obj;
    float iou, score_thr;
    int max_det, impl;
    if (!PyArg_ParseTuple(args, "y*y*Offiw*i", &boxes, &scores, &cls_obj, &iou, &score_thr,
                          &max_det, &keep, &impl))
        return NULL;
    int have_cls = cls_obj != Py_None;
    if (have_cls && PyObject_GetBuffer(cls_obj, &cls, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&boxes);
        PyBuffer_Release(&scores);
        PyBuffer_Release(&keep);
        return NULL;
    }
    Py_ssize_t n = scores.len / 4;
    const char *err = NULL;
    if (scores.len % 4 || boxes.len != n * 16 || n > 0x7fffffff) err = "boxes/scores lengths differ";
    else if (have_cls && cls.len != n * 4) err = "class_ids length differs";
    else if (max_det < 0) err = "max_det must be >= 0";
    else if (keep.len < 8 * (n < max_det ? n : max_det)) err = "keep buffer too small";
    int count = 0;
    if (!err) {
        const int32_t *c = have_cls ? cls.buf : NULL;
        Py_BEGIN_ALLOW_THREADS count = ef_nms(boxes.buf, scores.buf, c, (int)n, iou, score_thr,
                                              max_det, keep.buf, impl);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&boxes);
    PyBuffer_Release(&scores);
    PyBuffer_Release(&keep);
    if (have_cls) PyBuffer_Release(&cls);
    if (err) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    if (count < 0) return PyErr_NoMemory();
    return PyLong_FromLong(count);
}

static PyObject *py_keypoint_nms(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer kp, scores, areas, sigmas, keep;
    int k, max_det;
    double oks;
    float score_thr;
    if (!PyArg_ParseTuple(args, "y*y*y*y*idfiw*", &kp, &scores, &areas, &sigmas, &k, &oks,
                          &score_thr, &max_det, &keep))
        return NULL;
    Py_ssize_t n = scores.len / 4;
    const char *err = NULL;
    if (k < 1 || scores.len % 4 || n > 0x7fffffff) err = "bad sizes";
    else if (kp.len != n * k * 12 || areas.len != n * 8 || sigmas.len != (Py_ssize_t)k * 8)
        err = "keypoints/areas/sigmas lengths differ";
    else if (max_det < 0) err = "max_det must be >= 0";
    else if (keep.len < 8 * (n < max_det ? n : max_det)) err = "keep buffer too small";
    int count = 0;
    if (!err) {
        Py_BEGIN_ALLOW_THREADS count = ef_keypoint_nms(kp.buf, scores.buf, areas.buf, sigmas.buf,
                                                       (int)n, k, oks, score_thr, max_det,
                                                       keep.buf);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&kp);
    PyBuffer_Release(&scores);
    PyBuffer_Release(&areas);
    PyBuffer_Release(&sigmas);
    PyBuffer_Release(&keep);
    if (err) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    if (count < 0) return PyErr_NoMemory();
    return PyLong_FromLong(count);
}

static PyObject *py_have_neon(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(ef_have_neon());
}

static PyMethodDef methods[] = {
    {"preprocess", py_preprocess, METH_VARARGS, "Fused frame -> NCHW tensor (see native.py)."},
    {"quads_to_tensor", py_quads_to_tensor, METH_VARARGS,
     "Text-line quads -> slots of an NCHW batch (see native.py)."},
    {"nms", py_nms, METH_VARARGS, "Greedy NMS; returns the number of kept indices."},
    {"keypoint_nms", py_keypoint_nms, METH_VARARGS, "Greedy OKS NMS; returns the count kept."},
    {"have_neon", py_have_neon, METH_NOARGS, "True when built with the NEON paths."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native",
                                    "edgefleet native kernels", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
