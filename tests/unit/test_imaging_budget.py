"""The process's decode budget (#32, finding 3): reserved before a decoder allocates,
released after, the result's bytes held while the array lives; what can never fit is
refused at once, what must wait waits a bounded time."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

from edgefleet.shared.errors import ImageRejected, PayloadTooLarge
from edgefleet.shared.imaging import ImageLimits, decode_image, encode_png
from edgefleet.shared.imaging.budget import DecodeBudget, DecodeBudgetBusy
from edgefleet.shared.imaging.decode import decode_bytes
from edgefleet.shared.imaging.headers import PixelLayout, pixel_layout
from tests.support.bombs import jpeg_declaring, rgba16_png
from tests.support.waiting import eventually

MB = 1 << 20


def test_a_reservation_is_released_on_exit() -> None:
    budget = DecodeBudget(100 * MB)
    with budget.reserve(60 * MB):
        assert budget.reserved == 60 * MB
        with budget.reserve(40 * MB):
            assert budget.reserved == 100 * MB
    assert budget.reserved == 0


def test_what_can_never_fit_is_refused_at_once_as_too_large() -> None:
    budget = DecodeBudget(100 * MB, wait_s=300)
    with pytest.raises(PayloadTooLarge, match="whole decode budget"):
        budget.reserve(100 * MB + 1)
    assert budget.reserved == 0 and budget.waiting == 0


def test_a_reservation_that_does_not_fit_waits_then_is_refused_as_retryable() -> None:
    budget = DecodeBudget(100 * MB, wait_s=0.05, retry_after_s=3)
    with budget.reserve(80 * MB), pytest.raises(DecodeBudgetBusy) as refused:
        budget.reserve(30 * MB)
    assert refused.value.http_status == 503 and refused.value.retry_after_s == 3
    assert budget.reserved == 0 and budget.waiting == 0


def test_a_waiting_reservation_is_granted_when_another_is_released() -> None:
    budget = DecodeBudget(100 * MB, wait_s=60)
    first = budget.reserve(80 * MB)
    granted = threading.Event()

    def second() -> None:
        with budget.reserve(30 * MB):
            granted.set()

    waiter = threading.Thread(target=second)
    waiter.start()
    eventually(lambda: budget.waiting == 1, 10, "the second reservation waiting")
    assert not granted.is_set()
    first.release()
    waiter.join(10)
    assert granted.is_set() and budget.reserved == 0


def test_held_bytes_come_back_when_the_array_and_its_views_are_freed() -> None:
    budget = DecodeBudget(100 * MB)
    with budget.reserve(50 * MB) as reservation:
        array = reservation.hold(np.zeros((1024, 1024, 3), np.uint8), 3 * MB)
    assert budget.reserved == 3 * MB  # the rest went back on exit
    view = array[10:20]
    del array
    gc.collect()
    assert budget.reserved == 3 * MB  # a view keeps the pixels, so the bytes stay reserved
    del view
    gc.collect()
    assert budget.reserved == 0


def test_headers_give_channels_and_sample_depth() -> None:
    assert pixel_layout(jpeg_declaring(16384, 2441)) == PixelLayout(16384, 2441, 3, 1)
    assert pixel_layout(rgba16_png(64, 32)) == PixelLayout(64, 32, 4, 2)
    assert pixel_layout(encode_png(np.zeros((8, 4, 3), np.uint8))) == PixelLayout(4, 8, 3, 1)


def test_a_declared_dimension_bomb_is_refused_by_the_bytes_it_would_allocate() -> None:
    # given a 631-byte JPEG that declares 40 MP (under the pixel limit) and a 16-bit RGBA
    # PNG of 20 MP: small files, hundreds of MB decoded
    limits = ImageLimits(max_pixels=40_000_000, max_decode_bytes=256 * MB)
    budget = DecodeBudget(512 * MB, wait_s=60)
    for bomb in (jpeg_declaring(16384, 2441), rgba16_png(5000, 4000)):
        assert len(bomb) < 512 * 1024
        # when decoded, then refused from the header, before any allocation or wait
        with pytest.raises(PayloadTooLarge, match="decoding takes"):
            decode_image(bomb, limits=limits, budget=budget)
    assert budget.reserved == 0 and budget.waiting == 0


def test_a_decode_reserves_its_cost_and_holds_the_result_while_it_lives() -> None:
    data = rgba16_png(600, 400)
    cost = decode_bytes(pixel_layout(data))
    # a budget one byte short of the cost refuses it: the decode asks for all of it
    with pytest.raises(PayloadTooLarge, match="whole decode budget"):
        decode_image(data, budget=DecodeBudget(cost - 1))
    budget = DecodeBudget(cost)
    rgb = decode_image(data, budget=budget)
    assert budget.reserved == rgb.nbytes == 600 * 400 * 3
    del rgb
    gc.collect()
    assert budget.reserved == 0


def test_a_decode_that_fails_gives_its_reservation_back() -> None:
    budget = DecodeBudget(64 * MB)
    corrupt = bytearray(rgba16_png(300, 200))
    idat = corrupt.find(b"IDAT")
    corrupt[idat + 4 : idat + 40] = bytes(36)
    with pytest.raises(ImageRejected):
        decode_image(bytes(corrupt), budget=budget)
    assert budget.reserved == 0


def test_a_decode_waits_for_the_budget_then_is_refused() -> None:
    budget = DecodeBudget(8 * MB, wait_s=0.05)
    with budget.reserve(8 * MB), pytest.raises(DecodeBudgetBusy):
        decode_image(rgba16_png(300, 200), budget=budget)
    assert budget.reserved == 0
