"""Build glue: the import names of the parts, and the native kernels; metadata is in pyproject.toml.

The repository keeps its top-level folders (shared/, edge/, cloud/, fleet/, bench/), but they
install as `edgefleet.<part>`: a user's environment never gains top-level packages with
those common names. `package_dir` maps each import name to its folder; the editable finder
(`pip install -e .`) and the wheel both honour it. The package list is computed from the
folders so that a new subpackage needs no edit here.

`edgefleet.shared.kernels._native` is plain C (buffer protocol, no numpy headers needed). x86
builds stay portable: hot loops carry gcc `target_clones("avx2", "default")`, picked at
load time, so no -march=native. NEON intrinsics compile under __ARM_NEON on aarch64.
-ffp-contract=off keeps NMS decisions bit-identical to the numpy reference.
"""

import sys

from setuptools import Extension, find_packages, setup

PARTS = ("shared", "edge", "cloud", "fleet", "bench")

package_dir = {"edgefleet": "edgefleet"}
packages = ["edgefleet"] + [f"edgefleet.{sub}" for sub in find_packages(where="edgefleet")]
for part in PARTS:
    package_dir[f"edgefleet.{part}"] = part
    packages.append(f"edgefleet.{part}")
    packages += [f"edgefleet.{part}.{sub}" for sub in find_packages(where=part)]

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
        "shared/kernels/src/lines.c",
    ],
    depends=["shared/kernels/src/ef_kernels.h", "shared/kernels/src/ef_internal.h"],
    include_dirs=["shared/kernels/src"],
    extra_compile_args=extra,
    extra_link_args=["-pthread"],
    optional=False,
)

setup(packages=packages, package_dir=package_dir, ext_modules=[native])
