"""Build glue for the native kernels; all metadata lives in pyproject.toml.

`edgefleet.shared.kernels._native` is plain C (buffer protocol, no numpy headers needed). x86
builds stay portable: hot loops carry gcc `target_clones("avx2", "default")`, picked at
load time, so no -march=native. NEON intrinsics compile under __ARM_NEON on aarch64.
-ffp-contract=off keeps NMS decisions bit-identical to the numpy reference.
"""

import sys

from setuptools import Extension, setup

extra = ["-O3", "-std=c99", "-D_GNU_SOURCE", "-ffp-contract=off", "-fno-math-errno"]
if sys.platform == "win32":  # pragma: no cover - not a target, but keep the build sane
    extra = ["/O2"]

native = Extension(
    "edgefleet.shared.kernels._native",
    sources=[
        "shared/kernels/src/module.c",
        "shared/kernels/src/preprocess.c",
        "shared/kernels/src/preprocess_x86.c",
        "shared/kernels/src/nms.c",
    ],
    depends=["shared/kernels/src/ef_kernels.h", "shared/kernels/src/ef_internal.h"],
    include_dirs=["shared/kernels/src"],
    extra_compile_args=extra,
    extra_link_args=["-pthread"],
    optional=False,
)

setup(ext_modules=[native])
