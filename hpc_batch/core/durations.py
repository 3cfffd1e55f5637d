"""Durations as users type them: ``3600``, ``45m``, ``2h``, ``1h30m``, ``1d``."""

from ..bounds import MAX_SECONDS, shown

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_PART = r"([0-9]+)([dhms])"


class DurationError(ValueError):
    """A duration string that is not one of the accepted forms."""


def parse_duration(text: str) -> int:
    """Return *text* as whole seconds (plain seconds or d/h/m/s parts, largest first)."""
    s = text.strip()
    if sum(c.isdigit() for c in s.lstrip("0")) > _MOST_DIGITS:   # (int() of thousands of digits is refused, slowly)
        raise DurationError(_too_long(text))
    if s.isascii() and s.isdigit():
        value = int(s)
    else:
        import re  # here, not at the top: dispatch new formats durations on every submit without parsing one
        pos, value, last = 0, 0, None
        for m in re.finditer(_PART, s):
            if m.start() != pos:
                break
            unit = m.group(2)
            order = "dhms".index(unit)
            if last is not None and order <= last:
                raise DurationError(_message(text))
            last = order
            value += int(m.group(1)) * _UNITS[unit]
            pos = m.end()
        if pos != len(s) or pos == 0:
            raise DurationError(_message(text))
    if value <= 0:
        raise DurationError(f"duration {shown(text)} must be longer than zero seconds")
    if value > MAX_SECONDS:
        raise DurationError(_too_long(text))
    return value


_MOST_DIGITS = 24   # far past MAX_SECONDS in any unit, and its parts together


def _too_long(text: str) -> str:
    return f"duration {shown(text)} is longer than the {MAX_SECONDS // (365 * 86400)} years any job may be given"


def _message(text: str) -> str:
    return (f"invalid duration {shown(text)}: use seconds (3600) or d/h/m/s parts "
            f"largest first (45m, 2h, 1h30m, 1d)")


def format_duration(seconds: float) -> str:
    """Compact form used in listings: ``1d``, ``2h``, ``1h30m``, ``45s``."""
    total = int(seconds)
    if total <= 0:
        return "0s"
    parts = []
    for unit, size in _UNITS.items():
        if total >= size:
            parts.append(f"{total // size}{unit}")
            total %= size
    return "".join(parts)


def format_clock(seconds: float) -> str:
    """Elapsed time as ``H:MM:SS`` (hours grow past 24), for uptime columns."""
    total = max(0, int(seconds))
    return f"{total // 3600}:{total % 3600 // 60:02d}:{total % 60:02d}"
