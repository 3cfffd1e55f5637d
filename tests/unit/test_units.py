"""Durations and sizes as people type them (pure parsers, tables)."""

import pytest

from hpc_batch.core.durations import DurationError, format_clock, format_duration, parse_duration
from hpc_batch.core.sizes import SizeError, parse_size


@pytest.mark.parametrize("text,seconds", [
    ("3600", 3600), ("45m", 2700), ("2h", 7200), ("1h30m", 5400), ("1d", 86400), ("90s", 90),
    ("1d2h3m4s", 93784), (" 10s ", 10), ("1", 1),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0s", "-5", "1x", "2h1d", "1h1h", "h", "1.5h", "1 h", "s10", "１０", "１h"])
def test_bad_durations(text):
    with pytest.raises(DurationError):
        parse_duration(text)


@pytest.mark.parametrize("seconds,text", [(86400, "1d"), (5400, "1h30m"), (45, "45s"), (0, "0s"), (-3, "0s")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds,text", [(0, "0:00:00"), (65, "0:01:05"), (90061, "25:01:01"), (-1, "0:00:00")])
def test_format_clock(seconds, text):
    assert format_clock(seconds) == text


@pytest.mark.parametrize("text,unit,value", [
    ("84", "G", 84 << 30), ("1.5", "G", 3 << 29), ("512M", "G", 512 << 20), ("64G", "M", 64 << 30),
    ("2GiB", "G", 2 << 30), ("1T", "G", 1 << 40), ("256", "M", 256 << 20), ("4k", "M", 4096),
    ("0.25", "G", 1 << 28),
])
def test_sizes(text, unit, value):
    assert parse_size(text, unit) == value


@pytest.mark.parametrize("text", ["", "lots", "-1", "1X", "1.2.3", "G", "1 GB extra", "１G"])
def test_bad_sizes(text):
    with pytest.raises(SizeError):
        parse_size(text)


def test_zero_size_only_where_allowed():
    with pytest.raises(SizeError):
        parse_size("0")
    assert parse_size("0", allow_zero=True) == 0
