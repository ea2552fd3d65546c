"""Routing rules: which cloud model answers a case, with which timeout and priority.

Rules come from a YAML file and are evaluated in order on the case metadata; the first
match wins, else the default route. The file is re-read when its mtime/size change
(checked at most every `poll_s`); a file that does not parse or validate is rejected,
logged and counted, and the previous rules stay in force.

```yaml
default: {model: ppocr6-cloud, timeout_s: 20, priority: 0}
rules:
  - name: tiny-crops-by-rules
    when: {size_max: 2048}
    route: {model: rules, priority: 1}
  - name: unsure-gate-cams
    when: {device: "gate-*", reason: [unsure, disagreement], edge_score_max: 0.6}
    route: {model: ppocr6-cloud, timeout_s: 10, priority: 5}
```
"""

from __future__ import annotations

import fnmatch
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import yaml
from prometheus_client import Counter, Gauge
from pydantic import Field, ValidationError

from edgefleet.shared.config import Closed
from edgefleet.shared.errors import ConfigError
from edgefleet.shared.messages import EscalationCase, EscalationReason

log = logging.getLogger(__name__)

RULE_RELOADS = Counter("ef_cloud_rules_reloads_total", "Routing rule file reloads", ["outcome"])
RULES_ACTIVE = Gauge("ef_cloud_rules_active", "Routing rules in force")
ROUTED = Counter("ef_cloud_routed_total", "Cases routed, by route", ["route"])

RULES = "rules"  # model name of the rule-based level
BUSY = "busy"


class Match(Closed):
    """Conditions on case metadata; all given ones must hold (none given = always)."""

    device: str | list[str] | None = Field(None, description="device id glob(s)")
    stream: str | list[str] | None = Field(None, description="stream id glob(s)")
    reason: list[EscalationReason] | None = None
    model: str | list[str] | None = Field(None, description="edge model name glob(s)")
    edge_score_min: float | None = Field(None, ge=0, le=1, description="edge score at least")
    edge_score_max: float | None = Field(None, ge=0, le=1, description="edge score at most")
    size_min: int | None = Field(None, ge=0, description="image bytes at least")
    size_max: int | None = Field(None, ge=0, description="image bytes at most")


class RouteSpec(Closed):
    model: str = Field(description="cloud model name, or `rules` for the rule-based answer")
    timeout_s: float | None = Field(None, gt=0, le=600, description="none = models.timeout_s")
    priority: int = Field(0, ge=-100, le=100, description="higher runs first when queued")
    fallback: bool = Field(True, description="fall back to lighter model / rules / busy")


class Rule(Closed):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    when: Match = Field(default_factory=Match)
    route: RouteSpec


class RuleFile(Closed):
    default: RouteSpec | None = None
    rules: list[Rule] = Field(default_factory=list, max_length=1000)


@dataclass(frozen=True)
class Route:
    """The decision for one case."""

    name: str
    model: str
    timeout_s: float
    priority: int
    fallback: bool


def edge_score(case: EscalationCase) -> float:
    """The edge's confidence: its least sure line, 0 when it had no answer."""
    return min((d.score for d in case.edge_result), default=0.0)


def _globs(value: str | list[str] | None, candidate: str) -> bool:
    if value is None:
        return True
    patterns = [value] if isinstance(value, str) else value
    return any(fnmatch.fnmatchcase(candidate, p) for p in patterns)


def matches(match: Match, case: EscalationCase, size: int) -> bool:
    score = edge_score(case)
    return (
        _globs(match.device, case.device_id)
        and _globs(match.stream, case.stream_id)
        and _globs(match.model, case.model.name)
        and (match.reason is None or case.reason in match.reason)
        and (match.edge_score_min is None or score >= match.edge_score_min)
        and (match.edge_score_max is None or score <= match.edge_score_max)
        and (match.size_min is None or size >= match.size_min)
        and (match.size_max is None or size <= match.size_max)
    )


def parse_rules(
    text: str, source: str = "<rules>", models: Collection[str] | None = None
) -> RuleFile:
    """Parse and validate a rules file; with `models`, every route must name one of them
    (or `rules`/`busy`), so a typo is refused instead of failing every case it routes."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    try:
        parsed = RuleFile.model_validate(raw or {})
    except ValidationError as exc:
        raise ConfigError(f"{source}: invalid routing rules: {exc}") from None
    if models is not None:
        known = {*models, RULES, BUSY}
        routes = [("default", parsed.default)] if parsed.default else []
        routes += [(rule.name, rule.route) for rule in parsed.rules]
        unknown = [f"{name} -> {spec.model!r}" for name, spec in routes if spec.model not in known]
        if unknown:
            raise ConfigError(
                f"{source}: routes name models that are not served: {', '.join(unknown)}",
                hint=f"use one of {', '.join(sorted(known))} (models.served lists the models)",
            )
    return parsed


class Router:
    """Evaluates the rules in order; reloads the file when it changes."""

    def __init__(
        self,
        default: RouteSpec,
        *,
        path: Path | None = None,
        poll_s: float = 1.0,
        default_timeout_s: float = 20.0,
        models: Collection[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._builtin_default = default
        self._models = None if models is None else tuple(models)
        self.default_timeout_s = default_timeout_s
        self.path = Path(path) if path else None
        self._poll_s = poll_s
        self._clock = clock
        self._lock = threading.Lock()
        self._rules = RuleFile()
        self._stamp: tuple[int, int, int] | None = None
        self._next_check = 0.0
        self.last_error: str | None = None
        if self.path is not None:
            # At start a bad file is a configuration error: refuse to start on it.
            self._rules = parse_rules(self._read(), str(self.path), self._models)
            self._stamp = self._stat()
            self._next_check = clock() + poll_s
        RULES_ACTIVE.set(len(self._rules.rules))

    def _read(self) -> str:
        assert self.path is not None
        try:
            return self.path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read routing rules {self.path}: {exc.strerror}") from None

    def _stat(self) -> tuple[int, int, int] | None:
        assert self.path is not None
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def maybe_reload(self) -> None:
        """Re-read the file if it changed; keep the old rules if the new file is bad."""
        if self.path is None:
            return
        now = self._clock()
        with self._lock:
            if now < self._next_check:
                return
            self._next_check = now + self._poll_s
            stamp = self._stat()
            if stamp is None or stamp == self._stamp:
                return
            self._stamp = stamp
            try:
                rules = parse_rules(self._read(), str(self.path), self._models)
            except ConfigError as exc:
                self.last_error = exc.message
                RULE_RELOADS.labels("rejected").inc()
                log.error("routing rules rejected, keeping the previous ones: %s", exc.message)
                return
            self._rules = rules
            self.last_error = None
            RULE_RELOADS.labels("applied").inc()
            RULES_ACTIVE.set(len(rules.rules))
            log.info("routing rules reloaded", extra={"rules": len(rules.rules)})

    def route(self, case: EscalationCase, size: int) -> Route:
        self.maybe_reload()
        rules = self._rules
        for rule in rules.rules:
            if matches(rule.when, case, size):
                ROUTED.labels(rule.name).inc()
                return self._route(rule.name, rule.route, rules)
        ROUTED.labels("default").inc()
        return self._route("default", rules.default or self._builtin_default, rules)

    def _route(self, name: str, spec: RouteSpec, rules: RuleFile) -> Route:
        """A rule without a timeout takes the file's default one, then the settings' one."""
        file_default = rules.default.timeout_s if rules.default else None
        return Route(
            name=name,
            model=spec.model,
            timeout_s=spec.timeout_s or file_default or self.default_timeout_s,
            priority=spec.priority,
            fallback=spec.fallback,
        )
