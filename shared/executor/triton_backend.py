"""Triton backend: the forward pass runs on a Triton Inference Server (KServe v2).

Everything else stays in this process (the model's scheduler, pre- and post-processing),
so a pipeline reads the same text in process and on Triton; only tensors travel. The call
carries what is left of its batch's deadline (`executor.deadline`). A server that is down,
slow or answering errors raises a typed error (`TritonUnavailable`, `InferenceTimeout`,
`InferenceFailed`): the cloud's fallback chain takes the case, and the next call tries the
server again, so the primary comes back by itself when the server does.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np

from edgefleet.shared.errors import EdgefleetError, InferenceTimeout
from edgefleet.shared.executor.base import (
    Capabilities,
    InferenceFailed,
    ModelBlob,
    ModelLoadError,
    TensorSpec,
)
from edgefleet.shared.executor.deadline import current_deadline
from edgefleet.shared.executor.metrics import (
    INFER_SECONDS,
    MODEL_LOAD_SECONDS,
    TRITON_CALLS,
    TRITON_SECONDS,
)
from edgefleet.shared.executor.settings import ExecutionSettings, TritonServing

log = logging.getLogger(__name__)

SHA256_PARAMETER = "edgefleet_sha256"  # what `cloud triton-repo` writes into config.pbtxt
# tritonclient's own channel options, but reconnect backoff capped at 1 s (gRPC's default
# grows to 120 s): a restarted server is used again within a second, not minutes
_CHANNEL = [
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
_DTYPES = {"FP32": "float32", "FP16": "float16", "FP64": "float64", "INT64": "int64",
           "INT32": "int32", "UINT8": "uint8", "INT8": "int8", "BOOL": "bool"}  # fmt: skip


class TritonUnavailable(EdgefleetError):
    """The Triton server, or the model on it, does not answer."""

    code = "triton_unavailable"
    http_status = 503
    hint = "check the Triton server named in the manifest (its /v2/health/ready)"


class TritonExecutor:
    """A model served by Triton, used through `tritonclient` (gRPC or HTTP)."""

    def __init__(self, settings: ExecutionSettings, serving: TritonServing | None = None) -> None:
        if serving is None:
            raise EdgefleetError("the triton backend needs the manifest entry's `triton:`")
        self.settings = settings
        self.serving = serving
        self.name = "triton"
        self._model = serving.model or "?"
        self._inputs: list[TensorSpec] = []
        self._outputs: list[TensorSpec] = []
        self._max_batch = 0
        self._local = threading.local()  # the HTTP client is not thread-safe: one a thread
        self._grpc: Any = None
        self._up = True
        self._loaded = False

    # --- the client ---------------------------------------------------------------------

    def _client(self) -> Any:
        s = self.serving
        if s.protocol == "grpc":
            if self._grpc is None:
                import tritonclient.grpc as grpcclient

                self._grpc = grpcclient.InferenceServerClient(s.url, channel_args=_CHANNEL)
            return self._grpc
        client = getattr(self._local, "client", None)
        if client is None:
            import tritonclient.http as httpclient

            client = httpclient.InferenceServerClient(
                s.url, connection_timeout=s.connect_timeout_s, network_timeout=s.timeout_s
            )
            self._local.client = client
        return client

    def _ask(self, method: str, *args: Any, timeout_s: float | None = None, **kw: Any) -> Any:
        """A health or metadata call, bounded by the connect timeout (gRPC) or the client's."""
        if self.serving.protocol == "grpc":
            kw = {**kw, "as_json": True} if method.startswith("get_") else kw
            kw["client_timeout"] = timeout_s or self.serving.connect_timeout_s
        return getattr(self._client(), method)(*args, **kw)

    def probe(self) -> dict[str, Any]:
        """The server's and the model's readiness, with the reason when not ready."""
        s = self.serving
        out: dict[str, Any] = {"url": s.url, "protocol": s.protocol, "model": self._model,
                               "version": s.version, "server_ready": False,
                               "model_ready": False, "reason": None}  # fmt: skip
        try:
            out["server_ready"] = bool(self._ask("is_server_ready"))
            out["model_ready"] = bool(self._ask("is_model_ready", self._model, s.version))
        except Exception as exc:  # tritonclient's own error, or the socket's
            out["reason"] = _why(exc)
            return out
        if not out["server_ready"]:
            out["reason"] = "the server is not ready"
        elif not out["model_ready"]:
            out["reason"] = f"model {self._model} is not ready on the server"
        return out

    # --- the Executor protocol ----------------------------------------------------------

    def load(self, blob: ModelBlob) -> None:
        s = self.serving
        self._model = s.model or blob.name
        started = time.perf_counter()
        ready = self.probe()
        if ready["reason"] is not None:
            raise TritonUnavailable(f"triton {s.url}: {self._model}: {ready['reason']}")
        try:
            meta = self._ask("get_model_metadata", self._model, s.version)
            config = self._ask("get_model_config", self._model, s.version)
        except Exception as exc:  # the server went away between the calls, or refused
            raise TritonUnavailable(f"triton {s.url}: {self._model}: {_why(exc)}") from None
        config = config.get("config", config)  # gRPC wraps it, HTTP does not
        self._check_sha256(blob, config)
        self._max_batch = int(config.get("max_batch_size", 0) or 0)
        self._inputs = [_spec(t) for t in meta.get("inputs", [])]
        self._outputs = [_spec(t) for t in meta.get("outputs", [])]
        if not self._inputs or not self._outputs:
            raise ModelLoadError(f"triton {s.url}: {self._model} declares no inputs or outputs")
        self._loaded = True
        _SERVED[id(self)] = self
        MODEL_LOAD_SECONDS.labels(blob.name, self.name).observe(time.perf_counter() - started)
        log.info(
            "model served by triton",
            extra={"model": blob.name, "backend": self.name, "url": s.url,
                   "protocol": s.protocol, "served_as": self._model},
        )  # fmt: skip

    def _check_sha256(self, blob: ModelBlob, config: dict[str, Any]) -> None:
        served = config.get("parameters", {}).get(SHA256_PARAMETER, {}).get("string_value")
        if served is None:
            log.warning(
                "triton model names no sha256: it cannot be checked against the manifest",
                extra={"model": self._model, "url": self.serving.url},
            )
        elif served != blob.sha256 and self.serving.verify_sha256:
            raise ModelLoadError(
                f"triton {self.serving.url}: {self._model} serves sha256 {served[:16]}…, the "
                f"manifest pins {blob.sha256[:16]}…; refused",
                hint="write the server's repository from this manifest "
                "(`edgefleet cloud triton-repo`)",
            )

    def infer(self, batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        if not self._loaded:
            raise EdgefleetError(f"{self.name}: infer() before load()")
        size = len(next(iter(batch.values())))
        step = self._max_batch or size
        if size <= step:
            return self._call(batch)
        parts = [self._call({k: v[i : i + step] for k, v in batch.items()})
                 for i in range(0, size, step)]  # fmt: skip
        return [np.concatenate([p[j] for p in parts]) for j in range(len(self._outputs))]

    def _call(self, batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        """One request: what is left of the batch's deadline bounds it."""
        deadline = current_deadline()
        timeout_s = deadline.remaining_s() if deadline is not None else self.serving.timeout_s
        if timeout_s <= 0:
            TRITON_CALLS.labels(self._model, "timeout").inc()
            raise InferenceTimeout(f"{self._model}: no time left for the call to triton")
        started = time.perf_counter()
        try:
            outputs = self._send(batch, timeout_s)
        except EdgefleetError as exc:
            outcome = {"inference_timeout": "timeout", "triton_unavailable": "unavailable"}
            TRITON_CALLS.labels(self._model, outcome.get(exc.code, "error")).inc()
            self._went_down(exc)
            raise
        elapsed = time.perf_counter() - started
        TRITON_CALLS.labels(self._model, "ok").inc()
        TRITON_SECONDS.labels(self._model).observe(elapsed)
        INFER_SECONDS.labels(self._model, self.name).observe(elapsed)
        if not self._up:
            self._up = True
            log.info("triton answers again", extra={"model": self._model, "url": self.serving.url})
        return outputs

    def _send(self, batch: dict[str, np.ndarray], timeout_s: float) -> list[np.ndarray]:
        s = self.serving
        if s.protocol == "grpc":
            import tritonclient.grpc as client_module
        else:
            import tritonclient.http as client_module
        from tritonclient.utils import InferenceServerException, np_to_triton_dtype

        inputs = []
        for name, array in batch.items():
            tensor = client_module.InferInput(
                name, list(array.shape), np_to_triton_dtype(array.dtype)
            )
            tensor.set_data_from_numpy(np.ascontiguousarray(array))
            inputs.append(tensor)
        wanted = [client_module.InferRequestedOutput(o.name) for o in self._outputs]
        extra = {"client_timeout": timeout_s} if s.protocol == "grpc" else {}
        try:
            result = self._client().infer(self._model, inputs, s.version, wanted, **extra)
        except InferenceServerException as exc:
            status = str(exc.status() or "")
            if "DEADLINE_EXCEEDED" in status:
                raise InferenceTimeout(
                    f"{self._model}: triton did not answer in {timeout_s:.3f} s"
                ) from None
            if "UNAVAILABLE" in status or status in {"503", "502", "504"}:
                raise TritonUnavailable(f"triton {s.url}: {self._model}: {_why(exc)}") from None
            raise InferenceFailed(f"triton {s.url}: {self._model}: {_why(exc)}") from None
        except TimeoutError:
            raise InferenceTimeout(f"{self._model}: triton did not answer in time") from None
        except OSError as exc:  # the HTTP client's socket: refused, reset, unreachable
            raise TritonUnavailable(f"triton {s.url}: {self._model}: {_why(exc)}") from None
        return [np.asarray(result.as_numpy(o.name)) for o in self._outputs]

    def _went_down(self, exc: EdgefleetError) -> None:
        """Warn once per outage (every case falling back is logged by the cascade)."""
        if self._up and exc.code == "triton_unavailable":
            self._up = False
            log.warning(
                "triton does not answer; cases go down the fallback chain",
                extra={"model": self._model, "url": self.serving.url, "error": exc.message},
            )

    def close(self) -> None:
        _SERVED.pop(id(self), None)
        self._loaded = False
        if self._grpc is not None:
            self._grpc.close()
            self._grpc = None

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            backend=self.name,
            device=f"triton:{self.serving.url}",
            max_batch_size=self._max_batch or None,
            providers=(f"triton-{self.serving.protocol}",),
        )

    @property
    def inputs(self) -> list[TensorSpec]:
        return list(self._inputs)

    @property
    def outputs(self) -> list[TensorSpec]:
        return list(self._outputs)


_SERVED: dict[int, TritonExecutor] = {}


def report() -> list[dict[str, Any]]:
    """Every Triton-served model of this process, probed now (for /readyz)."""
    return [executor.probe() for executor in list(_SERVED.values())]


def _spec(tensor: dict[str, Any]) -> TensorSpec:
    shape = tuple(None if int(d) < 0 else int(d) for d in tensor.get("shape", []))
    return TensorSpec(tensor["name"], shape, _DTYPES.get(tensor.get("datatype", ""), "float32"))


def _why(exc: BaseException) -> str:
    """tritonclient's message (its str() repeats the status), or the socket error's."""
    message = getattr(exc, "message", None)
    text = message() if callable(message) else str(exc)
    return (text or type(exc).__name__).strip().splitlines()[0][:300]
