"""User models from a manifest: YOLO-family detection and image classification."""

from __future__ import annotations

import time
from dataclasses import dataclass

import cv2
import numpy as np

from edgefleet.shared import kernels
from edgefleet.shared.executor.memory import MemoryBudget
from edgefleet.shared.executor.metrics import MODEL_WARMUP_SECONDS
from edgefleet.shared.executor.settings import ExecutionSettings
from edgefleet.shared.imaging.letterbox import LetterboxTransform
from edgefleet.shared.imaging.normalise import normalise, pad_norm_value
from edgefleet.shared.messages import Detection
from edgefleet.shared.models.base import Model
from edgefleet.shared.models.frames import FrameIn
from edgefleet.shared.models.outputs.classification import top_k
from edgefleet.shared.models.outputs.yolo import decode_yolo
from edgefleet.shared.models.preprocess import stack_canvases
from edgefleet.shared.models.registry import ModelRegistry
from edgefleet.shared.models.session import Session, open_session, warmup_guard
from edgefleet.shared.models.spec import ModelSpec
from edgefleet.shared.models.tasks import ClassificationSpec, YoloSpec


def _input_hw(spec: ModelSpec, session: Session | None, default: int) -> tuple[int, int]:
    """Input size: the manifest's, else the model's static shape, else `default`."""
    h, w = spec.input.height, spec.input.width
    if session is not None and (h is None or w is None):
        shape = session.executor.inputs[0].shape
        if len(shape) == 4:
            dims = shape[2:] if spec.input.layout == "NCHW" else shape[1:3]
            h = h or dims[0]
            w = w or dims[1]
    return int(h or default), int(w or default)


class _SingleSessionModel(Model):
    default_size = 640

    def __init__(
        self,
        spec: ModelSpec,
        registry: ModelRegistry,
        settings: ExecutionSettings,
        budget: MemoryBudget | None = None,
    ) -> None:
        h, w = spec.input.height or self.default_size, spec.input.width or self.default_size
        session = open_session(
            spec,
            registry,
            settings,
            item_shape=(spec.input.channels, h, w),
            warmup_shape=None,
            max_batch=settings.batching.max_batch_size,
            budget=budget,
        )
        self.spec = spec
        self.session = session
        self.hw = _input_hw(spec, session, self.default_size)
        cap = session.executor.capabilities.max_batch_size
        self.static_batch = cap  # None = dynamic batch axis
        self._norm = (spec.mean, spec.std, spec.input.scale, spec.input.color == "BGR")
        if settings.warmup:  # before load_model returns: the first caller never pays it
            started = time.perf_counter()
            with warmup_guard(spec, session.executor):
                self._run(np.zeros((1, spec.input.channels, *self.hw), np.float32))
            MODEL_WARMUP_SECONDS.labels(spec.name, session.backend).observe(
                time.perf_counter() - started
            )
        super().__init__(spec, [session], settings, session.budget)

    def _run(self, batch: np.ndarray) -> np.ndarray:
        """First output for the batch; models with a fixed batch of 1 run image by image."""
        if self.spec.input.layout == "NHWC":
            batch = np.ascontiguousarray(batch.transpose(0, 2, 3, 1))
        if self.static_batch in (None, batch.shape[0]):
            return self.session.run(batch)[0]
        parts = [self.session.run(batch[i : i + 1])[0] for i in range(batch.shape[0])]
        return np.concatenate(parts, axis=0)

    def forward(self, prepared):
        return self._run(prepared.tensor)


@dataclass
class _Prepared:
    tensor: np.ndarray
    plans: list[LetterboxTransform]


class YoloModel(_SingleSessionModel):
    """YOLO v5 / v8 / v11 detection: letterbox in, boxes (label, score, xyxy) out."""

    def __init__(
        self,
        spec: YoloSpec,
        registry: ModelRegistry,
        settings: ExecutionSettings,
        budget: MemoryBudget | None = None,
    ) -> None:
        self.opts = spec.yolo
        super().__init__(spec, registry, settings, budget)
        self._fill = pad_norm_value(spec.input.pad_value, *self._norm)

    def pre_process(self, frames: list[FrameIn]) -> _Prepared:
        mean, std, scale, bgr = self._norm
        if scale != 1 / 255:  # the kernels normalise x / 255 only
            images = [kernels.to_rgb(f.pixels, f.fmt) for f in frames]
            plans = [LetterboxTransform.plan(f.hw, self.hw) for f in frames]
            return _Prepared(stack_canvases(images, plans, self._fill, *self._norm), plans)
        # colour conversion + resize + pad + normalise + NCHW in one pass from the frame's
        # own format, through the one dispatcher (CUDA, native C/NEON or the reference);
        # mean/std are given in the model's channel order, the kernels take them per R, G, B
        if bgr:
            mean, std = mean[::-1], std[::-1]
        batch = np.empty((len(frames), 3, *self.hw), np.float32)
        plans = []
        for i, frame in enumerate(frames):
            _, plan = kernels.frame_to_tensor(
                frame.pixels,
                frame.fmt,
                self.hw,
                mean,
                std,
                self.spec.input.pad_value,
                out=batch[i : i + 1],
                channels="bgr" if bgr else "rgb",
            )
            plans.append(plan)
        return _Prepared(batch, plans)

    def post_process(self, raw: np.ndarray, prepared: _Prepared) -> list[list[Detection]]:
        labels = self.spec.labels
        results = []
        for out, plan in zip(raw, prepared.plans, strict=True):
            dets = decode_yolo(
                out,
                layout=self.opts.layout,
                num_classes=len(labels) if labels else None,
                conf_threshold=self.opts.conf_threshold,
                iou_threshold=self.opts.iou_threshold,
                max_det=self.opts.max_det,
            )
            boxes = plan.boxes_to_source(dets.boxes)
            results.append(
                [
                    Detection(
                        label=labels[c] if labels and c < len(labels) else str(int(c)),
                        score=float(min(1.0, max(0.0, s))),
                        box=(
                            round(float(b[0]), 2),
                            round(float(b[1]), 2),
                            round(float(b[2]), 2),
                            round(float(b[3]), 2),
                        ),
                    )
                    for b, s, c in zip(boxes, dets.scores, dets.class_ids, strict=True)
                ]
            )
        return results


class ClassificationModel(_SingleSessionModel):
    """Image classification: resized in, top-k (label, probability) out."""

    default_size = 224

    def __init__(
        self,
        spec: ClassificationSpec,
        registry: ModelRegistry,
        settings: ExecutionSettings,
        budget: MemoryBudget | None = None,
    ) -> None:
        self.top_k = spec.top_k
        super().__init__(spec, registry, settings, budget)

    def pre_process(self, frames: list[FrameIn]) -> _Prepared:
        # an area filter (a large downscale to e.g. 224x224, where bilinear taps alias), so
        # not the bilinear kernel: packed frames are resized as they are and only the small
        # result is put in the model's channel order; YUV frames are converted first
        h, w = self.hw
        mean, std, scale, bgr = self._norm
        batch = np.empty((len(frames), 3, h, w), np.float32)
        for i, f in enumerate(frames):
            packed = f.pixels if f.fmt in ("rgb", "bgr") else kernels.to_rgb(f.pixels, f.fmt)
            small = cv2.resize(packed, (w, h), interpolation=cv2.INTER_AREA)
            batch[i] = normalise(small, mean, std, scale, bgr != f.is_bgr)
        return _Prepared(batch, [])

    def post_process(self, raw: np.ndarray, prepared: _Prepared) -> list[list[Detection]]:
        ranked = top_k(np.asarray(raw).reshape(raw.shape[0], -1), self.spec.labels, self.top_k)
        return [
            [Detection(label=label, score=min(1.0, max(0.0, p))) for label, p in row]
            for row in ranked
        ]
