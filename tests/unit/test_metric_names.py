"""Every metric edgefleet exports carries one prefix, `ef_`, whichever part defines it."""

from __future__ import annotations

import importlib
import pkgutil

from prometheus_client import REGISTRY

# prometheus-client's own collectors (the process, the interpreter, its GC)
CLIENT_PREFIXES = ("process_", "python_", "platform_")


def test_every_metric_is_named_ef_() -> None:
    for part in ("shared", "edge", "cloud", "fleet"):
        package = importlib.import_module(f"edgefleet.{part}")
        for module in pkgutil.walk_packages(package.__path__, f"edgefleet.{part}."):
            try:
                importlib.import_module(module.name)
            except ImportError:  # a GPU backend's package not installed here
                continue
    names = [m.name for m in REGISTRY.collect() if not m.name.startswith(CLIENT_PREFIXES)]
    assert len(names) > 20, names
    assert [n for n in names if not n.startswith("ef_")] == []
