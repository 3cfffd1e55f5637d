"""Sizes as people type them: ``84`` (in a default unit), ``1.5``, ``512M``, ``64G``, ``2T``.

One parser for every size the client and the daemon accept (``--max-mem``,
``--reserve-mem``, ``--min-job-mem``, ``--max-job-size``,
``--max-output-buffer``), so they all take the same forms; and one formatter,
shepherd/base/sizes.py's, which writes them back in the same form.
"""

from shepherd.base.sizes import GiB as GiB
from shepherd.base.sizes import KiB, TiB
from shepherd.base.sizes import MiB as MiB
from shepherd.base.sizes import format_size as format_size  # the one formatter (the shepherd's too: see there)

from ..bounds import MAX_MEM, shown

# K, KB and KiB alike are 1024 bytes: memory is counted in powers of two (a "16 GB" DIMM holds
# 16 GiB), and refusing 64GB would only refuse what people mean. A B alone is no unit here: 512B
# read as 512 GiB would be a trap.
_SIZE = r"([0-9]+(?:\.[0-9]+)?)\s*(?:([KMGT])(?:i?B)?)?"
UNITS = {"K": KiB, "M": MiB, "G": GiB, "T": TiB}
# The units in words, for --help texts and messages.
UNIT_FORMS = "K, M, G or T (KiB to TiB; KB and KiB mean the same)"


class SizeError(ValueError):
    """A size that is not a number with an optional K/M/G/T unit."""


def parse_size(text: str, default_unit: str = "G", allow_zero: bool = False) -> int:
    """*text* in bytes; a bare number is in *default_unit* (``"G"``, ``"M"``, ...)."""
    import re  # here, not at the top: the client's start-up does not pay for re unless it parses a size
    m = re.fullmatch(_SIZE, text.strip(), re.IGNORECASE)
    if not m:
        raise SizeError(f"{shown(text)}: expected a number in {default_unit}iB, or with a unit {UNIT_FORMS}, "
                        f"e.g. 84, 512M or 64G")
    unit = (m.group(2) or default_unit).upper()
    number = float(m.group(1))
    if number * UNITS[unit] > MAX_MEM:   # (a float: a thousand digits are inf, never an int)
        raise SizeError(f"{shown(text)}: larger than any machine's memory or disk (at most 1 EiB; "
                        f"a bare number is in {default_unit}iB)")
    value = int(number * UNITS[unit])
    if value < 0 or (value == 0 and not allow_zero):
        raise SizeError(f"{shown(text)}: must be more than zero")
    return value


def format_mem(n: int | None) -> str:
    """A size for a listing: :func:`format_size`, or ``-`` for none."""
    return "-" if n is None else format_size(n)
