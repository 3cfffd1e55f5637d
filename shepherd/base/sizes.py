"""Byte counts in words: ``32G``, ``1.5G``, ``512M``, ``4K``, ``100 bytes``.

The one size formatter of the project. It lives here, not in hpc_batch, because
the shepherd may import only the standard library and its own directory (it
runs with -E -s -S, and names the output buffer's bound in its notes), while
hpc_batch may import shepherd/ (its stdlib-only base, as for records and the
JSON codec): ``hpc_batch.core.sizes`` re-exports it for the client and daemon.
The form is the one sizes are typed in (``--max-mem 1.5G``), so a message can
be pasted back as a flag.
"""

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40


def format_size(n: int) -> str:
    """*n* bytes in the largest unit it reaches: ``64G``, ``1.5G``; below a GiB rounded to whole units.

    Gigabytes keep a decimal (a memory budget of 1.5G is a choice); megabytes
    and kilobytes are rounded (``77M`` of peak memory), which keeps the
    listing's columns short.
    """
    if n >= GiB:
        unit, size = ("T", TiB) if n >= TiB else ("G", GiB)
        return f"{n // size}{unit}" if n % size == 0 else f"{n / size:.1f}{unit}"
    for unit, size in (("M", MiB), ("K", KiB)):
        if n >= size:
            return f"{round(n / size)}{unit}"
    return f"{n} bytes"
