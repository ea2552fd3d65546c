"""`task: ocr`: a pipeline of a text detector, a recogniser and, optionally, an angle
classifier, each a manifest entry of its own."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from edgefleet.shared.config import Closed
from edgefleet.shared.models.spec import ModelSpec


class OcrOptions(Closed):
    """An OCR pipeline over detection, recognition and (optional) angle models."""

    det: str = Field(description="text detection model name")
    rec: str = Field(description="text recognition model name")
    cls: str | None = Field(None, description="angle classifier model name; none = off")
    det_max_side: int = Field(640, ge=64, le=4096, description="detector input longest side")
    det_fit: Literal["letterbox", "stretch"] = Field(
        "letterbox",
        description="detector input: letterbox (aspect kept, padded) or stretch (PP-OCR's rule: "
        "each side rounded to /32 and filled, no pad)",
    )
    det_zoom: float | None = Field(
        None,
        gt=1,
        le=4,
        description="detect again, this many times finer than the first pass, in each region "
        "where the first map stirs (above zoom_thresh): faint and small text the first pass "
        "misses or splits; the zoomed lines replace the first pass's there; none = off",
    )
    zoom_thresh: float = Field(
        0.005, gt=0, lt=1, description="first-map value that marks a region for the zoom"
    )
    zoom_sure: float = Field(
        0.9,
        gt=0,
        le=1,
        description="a region whose every line the first pass reads this surely is not zoomed",
    )
    det_thresh: float = Field(0.3, gt=0, lt=1, description="DB binarisation threshold")
    box_thresh: float = Field(0.5, gt=0, lt=1, description="minimum mean score of a text box")
    unclip_ratio: float = Field(1.6, gt=0, description="DB unclip ratio (box expansion)")
    max_candidates: int = Field(1000, ge=1, description="contours considered per image")
    max_lines: int | None = Field(
        None,
        ge=1,
        description="text lines read per image, the largest first (and no zoomed pass once "
        "an image has more): an image dense with text costs the model a bounded time, not "
        "one read per line it holds; the lines left are counted (ef_ocr_lines_unread_total) "
        "and noted on the cloud's verdict (`lines_unread`); none = every line",
    )
    rec_height: int = Field(48, ge=8, description="recogniser input height")
    rec_min_width: int = Field(320, ge=16, description="recogniser minimum input width")
    rec_max_width: int = Field(1600, ge=16, description="recogniser maximum input width")
    rec_batch: int = Field(16, ge=1, description="text lines per recogniser batch")
    cls_threshold: float = Field(0.9, gt=0, lt=1, description="flip a line when 180° is this sure")
    text_score: float = Field(
        0.5, ge=0, lt=1, description="drop lines whose surest read is scored below this"
    )
    tta: bool = Field(False, description="also read each line from a padded crop")
    enhance: bool = Field(
        False, description="also read each line contrast-stretched and sharpened (faint, blurred)"
    )
    word_kinds: float | None = Field(
        0.1,
        gt=0,
        le=1,
        description="a letter among digits or a digit among letters (the nearest characters "
        "of its word on both sides) is read as the likeliest character of their kind where "
        "the recogniser gives that one at least this; O and 0 (drawn alike) whatever it "
        "gives; none = off",
    )
    voters: list[str] = Field(
        default_factory=list,
        description="more text recognition models; every read of a line (each recogniser, "
        "each crop) votes for its text with its confidence, the heaviest text wins",
    )
    reread: str | None = Field(
        None,
        description="a text recognition model that reads again each line read less surely "
        "than reread_below (from the line's own quad); its read votes with the others; "
        "none = off",
    )
    reread_below: float = Field(
        0.9, gt=0, le=1, description="a line whose surest read is below this is read again"
    )


class OcrSpec(ModelSpec):
    task: Literal["ocr"]
    loader: ClassVar[str | None] = "edgefleet.shared.models.ocr:OcrModel"
    ocr: OcrOptions

    def components(self) -> list[str]:
        opts = self.ocr
        again = [opts.reread] if opts.reread else []
        return [opts.det, opts.rec, *([opts.cls] if opts.cls else []), *opts.voters, *again]
