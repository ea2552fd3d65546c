"""`edgefleet bench NAME [OPTIONS]`: the benchmarks of bench/, each printing ratios against
the naive way. Each benchmark is imported only when it runs (they pull in heavy libraries)."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    help="Benchmarks: each runs the naive way and edgefleet's side by side and prints ratios.\n\n"
    "Each benchmark's options: `edgefleet bench NAME --help`.\n\n"
    "Example: edgefleet bench kernels --rounds 5",
    no_args_is_help=True,
)

# name -> (module under bench/ whose `app` is the benchmark's typer app, what it measures)
BENCHMARKS = {
    "kernels": (
        "edgefleet.bench.bench_kernels",
        "fused NV12 pre-processing and NMS vs OpenCV/numpy",
    ),
    "imaging": (
        "edgefleet.bench.bench_imaging",
        "safe decoding: memory and speed vs Pillow/OpenCV",
    ),
    "executor": ("edgefleet.bench.bench_executor", "model latency, batch 1 vs dynamic batching"),
    "edge": ("edgefleet.bench.bench_edge", "agent pipeline vs the naive loop; outbox throughput"),
    "cloud": ("edgefleet.bench.bench_cloud", "REST and MQTT ingest under concurrent load"),
    "case-calls": (
        "edgefleet.bench.case_calls",
        "what one case costs the cloud on its way in: decodes, parses, store look-ups",
    ),
    "fleet": ("edgefleet.bench.bench_fleet", "dashboard and registry with a large fleet"),
    "dashboard": (
        "edgefleet.bench.bench_dashboard",
        "the fleet dashboard in headless Chromium: first paint and per-tick cost, N devices",
    ),
    "fleet-load": (
        "edgefleet.bench.bench_fleet_load",
        "N enrolled devices against R cloud replicas: stored/s, CPU, latency, loss",
    ),
    "ocr": (
        "edgefleet.bench.bench_ocr",
        "edge OCR vs faster-paddle and rapidocr: ms/image and accuracy, easy and hard scenes",
    ),
    "broker": (
        "edgefleet.bench.bench_broker",
        "Mosquitto's memory and CPU with one real, authenticated connection per device",
    ),
    "soak": (
        "edgefleet.bench.bench_soak",
        "memory over time: cloud, broker and a real agent under a steady fleet, MB/h",
    ),
    "mqtt-properties": (
        "edgefleet.bench.bench_mqtt_properties",
        "paho's PUBLISH property decoder vs edgefleet's: µs per received message",
    ),
    "cascade": (
        "edgefleet.bench.bench_cascade",
        "edge-only vs cloud-only vs the cascade at 4 budgets",
    ),
    "gpu-check": ("edgefleet.bench.gpu_check", "every GPU path run and measured, each step capped"),
}


def _forwarder(name: str, module: str):
    def run(ctx: typer.Context) -> None:
        importlib.import_module(module).app(args=ctx.args, prog_name=f"edgefleet bench {name}")

    return run


for _name, (_module, _summary) in BENCHMARKS.items():
    app.command(
        _name,
        help=f"{_summary}. Options: `edgefleet bench {_name} --help`.",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,
    )(_forwarder(_name, _module))
