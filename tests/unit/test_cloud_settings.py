"""Cloud settings: a file written for an earlier release still loads, a typo or settings that
contradict each other still do not."""

from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from edgefleet.cloud.settings import CloudSettings


def test_a_retired_setting_is_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    # given a models section written for the per-model thread pools
    with caplog.at_level(logging.WARNING, logger="edgefleet.cloud.settings"):
        settings = CloudSettings(models={"workers_per_model": 4, "timeout_s": 7})
    # then the rest of the section applies and the operator is told to remove it
    assert settings.models.timeout_s == 7
    assert "workers_per_model is retired" in caplog.text


def test_a_misspelt_setting_is_still_refused() -> None:
    with pytest.raises(ValidationError, match="workers_per_modle"):
        CloudSettings(models={"workers_per_modle": 4})


def test_one_image_must_fit_in_the_decode_budget() -> None:
    with pytest.raises(ValidationError, match="max_decode_bytes must not exceed"):
        CloudSettings(images={"max_decode_bytes": 2**30, "decode_budget_bytes": 2**29})
