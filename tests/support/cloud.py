"""A cloud without models or a broker: the processor's tests run it on rules alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgefleet.cloud.services import CloudServices
from edgefleet.cloud.settings import CloudSettings
from edgefleet.shared.imaging import encode_png

PNG = encode_png(np.full((8, 8, 3), 90, np.uint8))


def rules_only_services(
    tmp_path: Path, *, ingest: dict[str, Any] | None = None, **queue: Any
) -> CloudServices:
    """Cloud services whose only route is the rules level, one case worker, no MQTT ingest
    (`ingest` settings still apply to what the processor reads of them)."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("default: {model: rules, timeout_s: 5}\n")
    settings = CloudSettings(
        data_dir=tmp_path / "data",
        ingest={"enabled": False, **(ingest or {})},
        models={"preload": False},
        rules={"file": rules},
        queue={"workers": 1, **queue},
    )
    return CloudServices.build(settings)
