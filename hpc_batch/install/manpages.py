"""The manual pages: packaged under hpc_batch/data/man, installed where man finds them.

They go under /usr/local/share/man (Paths.man_dir), which man-db searches
whatever PATH says, so ``man dispatch`` works in any shell, not only in a
login shell that has the bin dir on PATH. The rules are the shell
completion's: a page carries MARKER on its first line; one already there
without it (or a link, or not a plain file) is someone else's and is left
alone, by installs and by --uninstall alike; a missing packaged page is
only a note, never a failed install.

Standard library only, as the rest of the installer (it must run when the
package is broken).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from .common import read_head

# A roff comment: invisible in the page, found by is_ours and by uninstall.sh.
MARKER = '.\\" hpc-batch: manual page, installed by hpc-batch-install'
PAGES = ("dispatch.1", "hpc-batchd.8", "hpc-batch-install.8", "hpc-batch-shepherd.8")
DATA = ("hpc_batch", "data", "man")


def destination(man_dir: Path, page: str) -> Path:
    """Where ``page`` (``name.section``) is installed: ``man_dir/man<section>/page``."""
    return man_dir / f"man{page.rsplit('.', 1)[1]}" / page


def is_marked(text: str) -> bool:
    """Whether a page whose text is ``text`` carries the installer's marker on its first line."""
    return text.split("\n", 1)[0] == MARKER


def is_ours(path: Path) -> bool:
    """Whether ``path`` is a plain file (not a link) that hpc-batch-install wrote."""
    head = read_head(path)
    return head is not None and is_marked(head)


def find(sources: Iterable[Path], page: str) -> Path | None:
    """The first packaged copy of ``page`` among the data directories ``sources``."""
    for directory in sources:
        if (directory / page).is_file():
            return directory / page
    return None


def install(sources: list[Path], man_dir: Path, note: Callable[[str], None],
            write: Callable[[Path, str, int], None]) -> None:
    """Write each packaged page (mode 0644) under ``man_dir``, leaving anyone else's alone."""
    written = []
    for page in PAGES:
        dest = destination(man_dir, page)
        source = find(sources, page)
        try:
            text = source.read_text() if source else ""
        except (OSError, UnicodeDecodeError):
            text = ""
        if source is None:
            note(f"no packaged manual page {page}; {dest} not written")
        elif not is_marked(text):
            note(f"{source} does not start with the line {MARKER!r}; {dest} not written")
        elif os.path.lexists(dest) and not is_ours(dest):
            note(f"left {dest} alone: it was not written by hpc-batch-install")
        else:
            try:
                write(dest, text, 0o644)
            except OSError as exc:  # a read-only /usr/local, say
                note(f"could not write {dest}: {exc.strerror or exc}")
                continue
            written.append(page)
    if written:
        note(f"wrote the manual pages {', '.join(written)} under {man_dir}")


def remove(man_dir: Path, note: Callable[[str], None]) -> None:
    """Remove the pages this installer wrote; leave anyone else's."""
    for page in PAGES:
        dest = destination(man_dir, page)
        if not os.path.lexists(dest):
            continue
        if not is_ours(dest):
            note(f"left {dest} alone: it was not written by hpc-batch-install")
            continue
        try:
            dest.unlink()
        except OSError as exc:
            note(f"could not remove {dest}: {exc.strerror or exc}")
            continue
        note(f"removed {dest}")
