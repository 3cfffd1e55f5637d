"""The drain baseline: Debian's task-spooler (its client is ``tsp``) on a private socket.

moreutils ships an unrelated ``ts``, so a candidate counts only if its help
names the spooler. When it is missing, the benchmark runs as root and
apt-get exists, Debian's package ``task-spooler`` is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

APT_TIMEOUT = 300.0  # seconds for each apt-get call; a dead mirror must not hang the run


def _probe() -> str | None:
    for name in ("tsp", "ts"):
        path = shutil.which(name)
        if not path:
            continue
        try:
            r = subprocess.run([path, "-h"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if "spooler" in (r.stdout + r.stderr).lower():
            return path
    return None


def find(install: bool) -> tuple[str | None, str]:
    """(path of the client or None, what happened: a version line or why it is missing)."""
    found = _probe()
    if found is None and install and os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "task-spooler"]
        try:
            r = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=APT_TIMEOUT)
            if r.returncode != 0:  # a fresh machine has no package lists yet
                subprocess.run(["apt-get", "update", "-q"], env=env, stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=APT_TIMEOUT)
                r = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                   timeout=APT_TIMEOUT)
            why = "" if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1]
        except subprocess.TimeoutExpired:
            why = f"apt-get took over {APT_TIMEOUT:.0f} s"
        found = _probe()
        if found is None:
            return None, f"task-spooler missing and apt-get install task-spooler failed: {why}"
    if found is None:
        how = "run as root to have it installed" if install else "not installing (--no-install)"
        return None, f"task-spooler (tsp) not installed; {how}"
    r = subprocess.run([found, "-V"], stdin=subprocess.DEVNULL, capture_output=True, text=True)
    version = ((r.stdout + r.stderr).strip().splitlines() or ["version unknown"])[0]
    return found, version


class Spooler:
    """A task-spooler server of our own: its socket and files in *directory*, *slots* jobs at once."""

    def __init__(self, client: str, directory: str, slots: int, max_jobs: int):
        os.makedirs(directory, exist_ok=True)
        self.client = client
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TS_SOCKET": os.path.join(directory, "socket"),
                    "TMPDIR": directory, "TS_MAXFINISHED": str(max_jobs + 10), "TS_SLOTS": str(slots)}
        self._run("-S", str(slots))  # starts the server with that many slots

    def _run(self, *args: str) -> str:
        r = subprocess.run([self.client, *args], env=self.env, stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, check=True)
        return r.stdout

    def busy(self) -> bool:
        """Whether any job is queued or running."""
        rows = (line.split() for line in self._run("-l").splitlines()[1:])
        return any(len(r) > 1 and r[1] in ("queued", "running", "allocating") for r in rows)

    def drain(self, argv: list[str], n: int) -> float:
        """Seconds from the first submit until *n* jobs of *argv*, submitted one client call each, are done."""
        self._run("-C")  # forget earlier runs' finished jobs
        t0 = time.perf_counter()
        ids = [self._run("-n", *argv).strip() for _ in range(n)]
        for job in ids[-2:]:  # the last two run last; -w returns when each is done
            subprocess.run([self.client, "-w", job], env=self.env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.perf_counter()
        while self.busy():  # an earlier job may still run: then the drain ends when it does
            time.sleep(0.01)
            end = time.perf_counter()
        return end - t0

    def stop(self) -> None:
        subprocess.run([self.client, "-K"], env=self.env, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
