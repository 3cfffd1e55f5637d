"""What ran: the record's ``software.executable``, the file the job's child exec'd, hashed once per version.

The child names the file it opened and exec'd (``child.parse_exe_report``);
:class:`Identifying`, which the Recorder inherits, hashes it in a side task
that runs as the job's user (root never opens a path the user controls),
idle in the job's own allocation, and checks each part's identity against
the file the job was started from. A ``#!`` script's interpreter, or an
interpreter's script (``python3 run.py``), is a part too. Hashes are kept in
a small cache per user, keyed by a file's identity (:data:`IDENTITY`), so a
version is read once. Standard library only (hashlib only on a cache miss).
"""

import os
import resource

from . import bounds, sides

try:
    from shepherd.base import identity, records, sysread
    from shepherd.base.cgroup import join as join_cgroup
except ImportError:  # run as a file: the base is a top-level package
    from base import identity, records, sysread  # type: ignore[no-redef]
    from base.cgroup import join as join_cgroup  # type: ignore[no-redef]

HASH_CAP = 1 << 30           # a file larger than this is not hashed (its size is still recorded)
HASH_CACHE = ".exe-hashes"   # beside the jobs' directories: one root-only file of known hashes per user
HASH_CACHE_ENTRIES = 64      # (file identity, sha256) pairs kept per user, the newest first
IDENTITY = ("dev", "ino", "size", "mtime_ns", "ctime_ns")   # what names one version of one file
# argv[0]s (less a version: python3.12) whose first file argument is the program that runs: its script
INTERPRETERS = frozenset(("python", "pypy", "perl", "ruby", "php", "lua", "luajit", "tclsh", "julia", "node",
                          "Rscript", "sh", "bash", "dash", "zsh", "ksh", "mksh", "csh", "tcsh", "fish"))
NO_DIR = "/proc/self/no-job-dir"   # a job directory no file can be in (procfs): the warm-up's, with no cache
_ALL_CPUS = 8192             # CPU ids a mask may name (child._ALL_CPUS)
_PUBLIC = ("path", "realpath", "size", "sha256")   # what the record's value (and so diff and digest) holds


def _identity(st: os.stat_result) -> dict:
    return {"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns}


def _key(found) -> tuple:
    """A version of a file: (dev, ino, size, mtime_ns, ctime_ns) of a stat or an identity dict.
    A write changes ctime, which no user can set back."""
    if isinstance(found, dict):
        return tuple(int(found[k]) for k in IDENTITY)
    return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)


def _script_argument(args: list) -> str | None:
    """An interpreter's script: its first argument, past options, that is a regular file (relative to
    the job's directory). None for code given inline (``-c``, ``-e``) or a module (``-m``)."""
    for arg in args:
        if arg in ("-c", "-e", "-m", "-E"):
            return None
        if arg.startswith("-") and arg != "-":
            continue
        try:
            if os.stat(arg).st_mode & 0o170000 == 0o100000:
                return arg
        except (OSError, ValueError):
            pass
    return None


def _executable_field(side: dict, source: str) -> dict:
    """The field from the side task's parts: the value compares by names and sha256; each part's identity,
    where its hash came from and how it was checked are beside it (no version of a file is another setup)."""
    exe = side.get("executable") or {}
    value: dict = {k: bounds.cap(exe[k]) if isinstance(exe[k], str) else exe[k] for k in _PUBLIC if k in exe}
    extra: dict = {"identity": {}}
    for name in ("interpreter", "script"):
        part = side.get(name)
        if isinstance(part, dict):
            value[name] = {k: bounds.cap(part[k]) if isinstance(part[k], str) else part[k]
                           for k in (*_PUBLIC, "error") if k in part}
    for name in ("executable", "interpreter", "script"):
        part = side.get(name)
        if isinstance(part, dict) and isinstance(part.get("identity"), dict):
            how = {k: bounds.cap(str(part[k])) for k in ("hash_from", "checked_by") if k in part}
            extra["identity"][name] = dict(part["identity"], **how)
    for key in ("hasher", "cache_error"):
        if key in side:
            extra[key] = side[key]
    if "sha256" not in exe:
        why = bounds.cap(str(exe.get("error") or "not identified"))
        return dict(sysread.field(None, source, why), **value, **extra)
    return dict(sysread.field(value, source), **extra)


class Identifying(sides.SideTasks):
    """The Recorder's part that names and hashes what ran, its interpreter or script, once per version."""

    # The Recorder's (set in its __init__).
    spec: records.LaunchSpec
    job_dir: str
    groups: list[int] | None   # the user's groups, looked up once by the shepherd (identity.groups_of)
    executable: dict | None    # the executable's field, when known without a side task
    launched: dict | None      # the file the job's child exec'd (child.parse_exe_report)
    known: dict                # this user's cached hashes: identity tuple -> sha256

    def _start_executable(self, pid: int | None, launched: dict | None, failed: bytes) -> None:
        """Name the file the job's child exec'd; hash it in a side task unless this user's cache has it.

        The file is the one the child opened and exec'd (``child._exec``), never one found again on
        the PATH: an exec that failed ran nothing, and the record says so.
        """
        source = "the executable, read as the user"
        self.launched = launched
        where = {"path": bounds.cap(self._abs(launched["path"]))} if launched else {}
        if failed:
            why = failed.decode("utf-8", "replace").strip()
            self.executable = dict(sysread.field(None, "the job's start", bounds.cap(f"it did not run: {why}")),
                                   **where)
            return
        if launched is None:
            self.executable = sysread.field(None, "the job's start", "its start did not say which file it ran")
            return
        if launched["kind"] == "unreadable":
            self.executable = dict(sysread.field(None, source, "its user cannot read it: what ran is not identified"),
                                   **where)
            return
        self.known = self._cache_load()
        sha = self.known.get(_key(launched))
        if sha is not None and launched["kind"] != "script" and not self._interpreted():
            part = dict(path=self._abs(launched["path"]), realpath=launched["realpath"], size=launched["size"],
                        sha256=sha,
                        identity={k: launched[k] for k in IDENTITY}, hash_from="cache",
                        checked_by="the descriptor it was executed from" if launched["kind"] == "binary-fd"
                        else "its path, as it was started")
            self.executable = _executable_field({"executable": part}, source)
            return
        self._spawn_side("executable", lambda: self._identify(pid, launched), patient=True)

    def _abs(self, path: str) -> str:
        return os.path.normpath(os.path.join(self.spec.cwd, path))

    def _interpreted(self) -> bool:
        """Whether argv[0] is an interpreter (``python3 run.py``): its script is recorded too."""
        return os.path.basename(self.spec.argv[0]).rstrip("0123456789.") in INTERPRETERS

    def _identify(self, pid: int | None, launched: dict) -> dict:
        """In a child: into the job's allocation at idle priority, then as the job's user, identify and
        hash what ran (each part's identity checked against the file the job was started from)."""
        hasher = self._confine()
        spec = self.spec
        identity.become(spec.user, spec.uid, spec.gid, self.groups)
        os.chdir(spec.cwd)
        out: dict = {}
        exe, fd = self._identify_executable(pid, launched)
        out["executable"] = exe
        if launched["kind"] == "script":
            out["interpreter"] = self._identify_interpreter(pid, fd)
        elif self._interpreted():
            script = _script_argument(spec.argv[1:9])
            if script is not None:
                out["script"] = self._identify_path(script, None)[0]
        if fd is not None:
            os.close(fd)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        hasher["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 3)
        out["hasher"] = hasher
        return out

    def _confine(self) -> dict:
        """The hasher's placement (still root): the job's cgroup and CPUs, SCHED_IDLE, which with no
        I/O priority of its own is also the idle I/O class (the kernel's task_nice_ioclass)."""
        spec = self.spec
        out: dict = {}
        if spec.cgroup:
            try:
                join_cgroup(spec.cgroup)
                os.sched_setaffinity(0, range(_ALL_CPUS))   # the shepherd's mask would survive the move
                out["cgroup"] = "the job's"
            except OSError as exc:
                out["cgroup"] = f"not joined: {sysread.error_text(exc)}"
        if spec.cpus:
            try:
                os.sched_setaffinity(0, spec.cpus)
            except OSError as exc:
                out["cpus_error"] = sysread.error_text(exc)
        out["cpus"] = sorted(os.sched_getaffinity(0))
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            out["policy"] = "SCHED_IDLE"
        except OSError as exc:
            out["policy"] = f"not idle: {sysread.error_text(exc)}"
        return out

    def _identify_executable(self, pid: int | None, launched: dict) -> tuple[dict, int | None]:
        """The exec'd file's part, and its descriptor (a script's: its interpreter is read from it)."""
        want = _key(launched)
        path = launched["path"]
        ran = "the job's /proc/<pid>/exe was not read"
        if launched["kind"] != "script" and pid:
            try:   # what the kernel runs now, if the job still runs it; an identity check covers a reused pid
                fd = os.open(f"/proc/{pid}/exe", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                fd = None
            if fd is not None:
                if _key(os.fstat(fd)) == want:
                    part = self._hash_part(fd, path, launched["realpath"], f"/proc/{pid}/exe")
                    return part, fd
                os.close(fd)
            if launched["kind"] == "binary":   # by path (an older kernel): the job's own exe is the only proof
                ran = "the job had ended" if fd is None else "the job had exec'd another file, or was replaced"
        part, fd = self._identify_path(path, want)
        if launched["kind"] == "binary" and "sha256" in part:
            part["checked_by"] = f"its path, the file it was started from ({ran}: not confirmed by /proc)"
        elif launched["kind"] == "binary-fd" and "sha256" in part:
            part["checked_by"] = "the descriptor it was executed from (the same identity at its path)"
        return part, fd

    def _identify_path(self, path: str, want: tuple | None) -> tuple[dict, int | None]:
        """Open *path* as the user and hash it; when *want* is given it must be that version of it."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as exc:
            return {"path": os.path.abspath(path), "error": sysread.error_text(exc)}, None
        st = os.fstat(fd)
        if want is not None and _key(st) != want:
            os.close(fd)
            return {"path": os.path.abspath(path), "identity": _identity(st),
                    "error": "another file is at its path now (replaced since the job started): not hashed"}, None
        return self._hash_part(fd, path, os.readlink(f"/proc/self/fd/{fd}"), "its path"), fd

    def _hash_part(self, fd: int, path: str, realpath: str | None, checked_by: str) -> dict:
        """One part: its names, identity and sha256 (from the cache, else read), or why not."""
        st = os.fstat(fd)
        out = {"path": os.path.abspath(path), "realpath": realpath, "size": st.st_size, "identity": _identity(st),
               "checked_by": checked_by}
        if st.st_mode & 0o170000 != 0o100000:   # S_ISREG without importing stat
            return dict(out, error="not a regular file")
        sha = self.known.get(_key(st))
        if sha is not None:
            return dict(out, sha256=sha, hash_from="cache")
        if st.st_size > HASH_CAP:
            return dict(out, error=f"larger than {HASH_CAP >> 20} MiB: not hashed")
        import hashlib  # a cache miss only (see bounds.sha256)
        h = hashlib.sha256()
        offset = 0
        while True:
            chunk = os.pread(fd, 1 << 20, offset)
            if not chunk:
                break
            h.update(chunk)
            offset += len(chunk)
        if _key(os.fstat(fd)) != _key(st):   # written meanwhile: the digest is of no one version
            return dict(out, error="it changed while it was read: not hashed")
        return dict(out, sha256=h.hexdigest(), hash_from="read")

    def _identify_interpreter(self, pid: int | None, fd: int | None) -> dict:
        """A ``#!`` script's interpreter, as the kernel finds it from the script's first line."""
        if fd is None:
            return {"error": "the script was not read"}
        line = os.pread(fd, 256, 0)[2:].split(b"\n", 1)[0].lstrip(b" \t")   # 256: the kernel's BINPRM_BUF_SIZE
        name = os.fsdecode(line.replace(b"\t", b" ").split(b" ", 1)[0])
        if not name:
            return {"error": "its #! line names no interpreter"}
        part, ifd = self._identify_path(name, None)
        if ifd is None:
            return part
        try:
            if pid and _key(os.stat(f"/proc/{pid}/exe")) == _key(os.fstat(ifd)):
                part["checked_by"] = f"/proc/{pid}/exe"
        except OSError:
            pass   # the job has ended: the path is all there is
        os.close(ifd)
        return part

    def _executable_field(self) -> dict:
        """``software.executable``: known at the start, or the side task's, the cache kept up to date."""
        if self.executable is not None:
            return self.executable
        side = self._side_json_any("executable")
        source = "the executable, read as the user"
        if side is None:
            return self._side_result("executable", source)
        found = {}
        for part in side.values():
            if isinstance(part, dict) and part.get("hash_from") == "read" and isinstance(part.get("identity"), dict):
                found[_key(part["identity"])] = part["sha256"]
        if found:
            try:
                self._cache_store(found)
            except (OSError, ValueError) as exc:   # a cache is never worth a record
                side["cache_error"] = sysread.error_text(exc)
        return _executable_field(side, source)

    def _side_json_any(self, name: str) -> dict | None:
        """The side task's JSON, an error too (None if it gave none)."""
        side = self._reaped(name)
        if side is None or not side.done or (self.record.get("side_errors") or {}).get(name):
            return None
        try:
            value = records.loads(side.text())
        except ValueError:
            return None
        return value if isinstance(value, dict) and isinstance(value.get("executable"), dict) else None

    def _side_result(self, name: str, source: str) -> dict:
        """The side task's field when it gave no parts: null and why, or what it said, capped."""
        side = self._reaped(name)
        why = (self.record.get("side_errors") or {}).get(name)
        if side is None or why:
            return sysread.field(None, source, why or "not read")
        try:
            value = records.loads(side.text())
        except ValueError:
            value = None
        if not isinstance(value, dict):
            return sysread.field(None, source, f"the reader failed (status {side.status})")
        if value.get("error") and "sha256" not in value:
            return dict(sysread.field(None, source, bounds.cap(str(value["error"]))),
                        **{k: bounds.cap(v) if isinstance(v, str) else v for k, v in value.items() if k != "error"})
        return sysread.field({k: bounds.cap(v) if isinstance(v, str) else v for k, v in value.items()}, source)

    # -- the cache: root's, per user --------------------------------------------------------------
    def _cache_path(self) -> str | None:
        """This user's cache file: hashes a job of theirs read, never one another user's job could
        have planted (a file on their own FUSE mount lies only to its owner)."""
        if not isinstance(self.spec.uid, int) or self.job_dir == NO_DIR:
            return None
        return os.path.join(os.path.dirname(self.job_dir), HASH_CACHE, str(self.spec.uid))

    def _cache_load(self) -> dict:
        path = self._cache_path()
        if path is None:
            return {}
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return {}
        try:
            data = sysread.read_upto(fd, HASH_CACHE_ENTRIES * 160)
        finally:
            os.close(fd)
        out = {}
        for line in data.decode("ascii", "replace").splitlines():
            words = line.split()
            if len(words) == 6 and all(w.isdigit() for w in words[:5]) and len(words[5]) == 64:
                out[tuple(map(int, words[:5]))] = words[5]
        return out

    def _cache_store(self, found: dict) -> None:
        """Add *found* (identity tuple -> sha256) to this user's cache, the newest first, bounded."""
        path = self._cache_path()
        if path is None:
            return
        merged = dict(found)
        for key, sha in self._cache_load().items():   # again: other jobs of theirs may have added some
            if len(merged) >= HASH_CACHE_ENTRIES:
                break
            merged.setdefault(key, sha)
        os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
        data = "".join(" ".join(map(str, key)) + f" {sha}\n" for key, sha in merged.items())
        records.write_atomic(path, data.encode(), 0o600, durable=False)
