"""The job whose first instruction is timed: it prints CLOCK_REALTIME in nanoseconds.

Preferably a tiny static C program built here, which reads the clock
before anything else it does; without a C compiler, ``date +%s%N``, whose
dynamic loading and locale set-up come before the clock is read (so the
figure is then a little longer than the real one).
"""

from __future__ import annotations

import os
import shutil
import subprocess

SOURCE = r"""
#include <stdio.h>
#include <time.h>

int main(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);  /* first: everything after is not timed */
    printf("%lld%09ld\n", (long long)now.tv_sec, now.tv_nsec);
    return 0;
}
"""


def build(directory: str) -> tuple[list[str], str]:
    """(argv of the probe, one line saying what it is)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:
        src, exe = os.path.join(directory, "stamp.c"), os.path.join(directory, "stamp")
        with open(src, "w") as f:
            f.write(SOURCE)
        for flags in (["-static"], []):  # static if libc.a is there: no loader before main
            r = subprocess.run([cc, "-O2", *flags, "-o", exe, src], stdin=subprocess.DEVNULL, capture_output=True)
            if r.returncode == 0:
                os.chmod(exe, 0o755)
                how = "static" if flags else "dynamically linked"
                return [exe], f"a {how} C program that prints clock_gettime(CLOCK_REALTIME) first thing"
    date = shutil.which("date") or "/bin/date"
    return [date, "+%s%N"], "`date +%s%N` (no C compiler here; its start-up is inside the figure)"


def read_stamp(text: str) -> int:
    """The nanosecond stamp a probe printed."""
    word = text.strip()
    if not word.isdigit():
        raise RuntimeError(f"the probe printed {text!r}, not a time in ns")
    return int(word)
