"""quarantine/: records the daemon could not act on, set aside whole, each move noted for the log.

A record that cannot be read, or holds values no daemon could act on, is
moved here rather than taking the daemon down with it at every start.
"""

import os
import shutil
import time


class Quarantine:
    """The quarantine/ directory of a state directory; what it set aside goes into *notes*."""

    def __init__(self, directory: str, notes: list):
        self.dir = directory
        self.notes = notes

    def move(self, path: str, what: str, why, consequence: str) -> str | None:
        """Move *path* into quarantine/ and note it; returns where it went."""
        why = getattr(why, "strerror", None) or why
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        dest = os.path.join(self.dir, f"{os.path.basename(path)}.{int(time.time())}")
        try:
            os.rename(path, dest)
        except OSError as exc:
            self.notes.append(f"{what} at {path} cannot be used ({why}) nor moved aside ({exc.strerror}); "
                              f"{consequence}")
            return None
        self.notes.append(f"{what} could not be used ({why}) and was moved to {dest} for inspection; "
                          f"{consequence}")
        return dest

    def highest_id(self) -> int:
        """The largest job id among quarantined records (ids below the floor are never reused)."""
        top = 0
        try:
            names = os.listdir(self.dir)
        except OSError:
            return 0
        for name in names:
            head = name.split(".", 1)[0]
            if head.isdigit() and len(head) <= 20:
                top = max(top, int(head))
        return top

    def keep_journal(self, journal_path: str) -> None:
        """Keep a journal shown to have lost records for inspection; the snapshot replaces it."""
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        dest = os.path.join(self.dir, f"journal.{int(time.time())}")
        try:
            shutil.copyfile(journal_path, dest)
        except OSError as exc:
            self.notes.append(f"cannot keep a copy of the damaged journal ({exc.strerror})")
            return
        self.notes.append(f"the damaged journal was copied to {dest} for inspection")
