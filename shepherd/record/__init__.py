"""The job's reproducibility record: what it ran on, and whether the machine stayed quiet.

The shepherd builds it in three steps, so that nothing slow lies between the
submit and the job's first instruction, and nothing wakes while it runs:

1. :meth:`Recorder.before_start`, just before the job is forked: the start
   snapshot of the sentinels (interrupts, throttling, swap, pressure, CPU
   time on the job's node and L3). Cheap: plain reads of /proc and /sys.
2. :meth:`Recorder.after_start`, once the job runs: the static sections
   (kernel, CPU, frequency, memory, the cgroup as read back), the software,
   and two side tasks in child processes with a deadline: the executable's
   hash, read *as the user* (root never opens a path the user controls), and
   the GPU query (nvidia-smi). The record is written incomplete
   (``"complete": false``), so ``dispatch show --record`` has it while the job
   runs and a lost shepherd still leaves it; a job that has already ended by
   then (a ``true``) skips that write, its complete record following at once.
3. :meth:`Recorder.at_end`, after the job's leader is reaped and before its
   cgroup goes: the end snapshot, the deltas, the verdict, the digest; the
   record is written complete, and its verdict and digest go to exit.json.

``record.json`` is root's, mode 0640 with an ACL entry for the job's user (like
the output buffer), and at most :data:`MAX_BYTES`: bulky parts are dropped, and
named in ``"cut"``, to keep it so. Standard library only.

The package's parts: collect (the static sections), sentinels (the
snapshots), gpuquery (nvidia-smi), verdict (quiet or noisy), figures and
figurefile (the job's own figures). It imports the base, never the
supervisor; the package's face is this module, as json's is its
``__init__``.
"""

import errno
import os
import resource
import select
import signal
import time

from . import collect, figurefile, figures, gpuquery, sentinels, verdict

# The small digests (launch spec, environment, the record's own) take CPython's built-in sha256:
# hashlib would map OpenSSL's libcrypto (3.4 MiB resident here) into the fork server and so into
# every shepherd's share of memory. An executable's hash, a cache miss of up to HASH_CAP, still
# takes hashlib (OpenSSL's is several times faster there), imported only when one is read.
try:
    from _sha256 import sha256  # built in (3.11)
except ImportError:
    try:
        from _sha2 import sha256  # type: ignore[no-redef]   # 3.12 on
    except ImportError:
        from hashlib import sha256  # type: ignore[no-redef]

try:
    from shepherd.base import acl, identity, records, sysread
    from shepherd.base.cgroup import join as join_cgroup
    from shepherd.base.jsoncodec import dumps_canonical
except ImportError:  # run as a file: the base is a top-level package
    from base import acl, identity, records, sysread  # type: ignore[no-redef]
    from base.cgroup import join as join_cgroup  # type: ignore[no-redef]
    from base.jsoncodec import dumps_canonical  # type: ignore[no-redef]

MAX_BYTES = 256 << 10        # a record's size bound
STRING_CAP = 1024            # characters kept of one user-controlled string (an argument, a path, a key)
LIST_CAP = 512               # arguments or environment keys kept
HASH_CAP = 1 << 30           # a file larger than this is not hashed (its size is still recorded)
HASH_CACHE = ".exe-hashes"   # beside the jobs' directories: one root-only file of known hashes per user
HASH_CACHE_ENTRIES = 64      # (file identity, sha256) pairs kept per user, the newest first
IDENTITY = ("dev", "ino", "size", "mtime_ns", "ctime_ns")   # what names one version of one file
# argv[0]s (less a version: python3.12) whose first file argument is the program that runs: its script
INTERPRETERS = frozenset(("python", "pypy", "perl", "ruby", "php", "lua", "luajit", "tclsh", "julia", "node",
                          "Rscript", "sh", "bash", "dash", "zsh", "ksh", "mksh", "csh", "tcsh", "fish"))
_ALL_CPUS = 8192             # CPU ids a mask may name (main._ALL_CPUS)
SIDE_LIMIT = 30.0            # seconds the side tasks (hash, GPU query) may take after the start
END_GPU_LIMIT = 5.0          # seconds the GPUs' end reading may take
REAP_WAIT = 0.5              # seconds the job's end waits for a finished side task's exit status
END_WAIT = 10.0              # seconds a job's end waits for side tasks still running (within SIDE_LIMIT)
# Parts dropped, in this order, while a record is over MAX_BYTES: the raw snapshots first (their
# deltas stay), then the largest static lists, and last the job's own figures' values (each name
# keeps its unit, count and last value): they are the results the record is about. "*": every key.
_CUTS = (("sentinels", "start", "interrupts"), ("sentinels", "end", "interrupts"),
         ("sentinels", "start"), ("sentinels", "end"), ("cpu", "vulnerabilities"), ("cpu", "caches"),
         ("software", "environment", "values"), ("software", "environment", "keys"),
         ("software", "argv"), ("sentinels", "delta", "interrupts"), ("metrics", "value", "names", "*", "values"))


def cap(text: str, limit: int = STRING_CAP) -> str:
    """A user-controlled string, at most *limit* characters (JSON escapes the rest of its harm)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


# What the daemon (launchspec.environment) and the shepherd (the figures' file) set for each job: they
# differ between any two jobs, so the environment's digest without them says whether two jobs were
# submitted with the same one.
FIGURES_ENV = figures.ENV    # the job's own figures' file (shepherd/record/figurefile.py)
PER_JOB_VARS = ("HPC_BATCH_JOB_ID", "HPC_BATCH_ARRAY_INDEX", "HPC_BATCH_ARRAY_JOB_ID", "CUDA_VISIBLE_DEVICES",
                figures.ENV)


def env_block(env: dict) -> bytes:
    """The environment as the sorted ``KEY=VALUE\\0`` block its digest and size are taken of."""
    return b"".join(f"{k}={env[k]}".encode("utf-8", "surrogateescape") + b"\0" for k in sorted(env))


def software(spec: records.LaunchSpec, env_values: bool) -> dict:
    """argv, cwd, libc, rlimits and the environment (values only when the user asked)."""
    env = spec.env or {}
    block = env_block(env)
    keys = sorted(env)
    out = {
        "argv": sysread.field([cap(a) for a in spec.argv[:LIST_CAP]], "launch spec"),
        "argc": sysread.field(len(spec.argv), "launch spec"),
        "cwd": sysread.field(cap(spec.cwd), "launch spec"),
        "libc": _libc(),
        "rlimits": _rlimits(),
        "environment": {
            "keys": sysread.field([cap(k) for k in keys[:LIST_CAP]], "launch spec"),
            "count": sysread.field(len(keys), "launch spec"),
            "sha256": sysread.field(sha256(block).hexdigest(), "launch spec"),
            "bytes": sysread.field(len(block), "launch spec"),
            "submitted_sha256": sysread.field(
                sha256(env_block({k: v for k, v in env.items() if k not in PER_JOB_VARS})).hexdigest(),
                "launch spec, less " + ", ".join(PER_JOB_VARS)),
        },
    }
    if env_values:
        out["environment"]["values"] = sysread.field({cap(k): cap(env[k]) for k in keys[:LIST_CAP]},
                                                     "launch spec (--record-env)")
    return out


def _libc() -> dict:
    try:
        return sysread.field(os.confstr("CS_GNU_LIBC_VERSION"), "confstr(_CS_GNU_LIBC_VERSION)")
    except (OSError, ValueError) as exc:
        return sysread.field(None, "confstr(_CS_GNU_LIBC_VERSION)", sysread.error_text(exc))


def _rlimits() -> dict:
    """The shepherd's limits, which the job inherits unchanged."""
    out = {}
    for name in sorted(n for n in dir(resource) if n.startswith("RLIMIT_")):
        try:
            soft, hard = resource.getrlimit(getattr(resource, name))
        except (OSError, ValueError):
            continue
        out[name[7:].lower()] = [None if soft == resource.RLIM_INFINITY else soft,
                                 None if hard == resource.RLIM_INFINITY else hard]
    return sysread.field(out, "getrlimit(2) (null: unlimited)")


def digest(record: dict) -> str:
    """``sha256:<hex>`` of the record without its digest, keys sorted, compact."""
    body = {k: v for k, v in record.items() if k != "digest"}
    return "sha256:" + sha256(dumps_canonical(body).encode()).hexdigest()


def bounded(record: dict, limit: int = MAX_BYTES) -> bytes:
    """The record's JSON, with parts dropped (and named in ``cut``) until it fits *limit*."""
    record["digest"] = digest(record)
    data = records.dumps(record).encode()
    for path in _CUTS:
        if len(data) <= limit:
            break
        parents: list = [record]
        for key in path[:-1]:
            parents = [c for p in parents if isinstance(p, dict)
                       for c in (p.values() if key == "*" else [p.get(key)])]
        parents = [p for p in parents if isinstance(p, dict) and path[-1] in p]
        if not parents:
            continue
        for parent in parents:
            del parent[path[-1]]
        record.setdefault("cut", []).append(".".join(path))
        record["digest"] = digest(record)
        data = records.dumps(record).encode()
    if len(data) > limit:   # nothing left to drop: keep what identifies the run
        judged = record["verdict"] if isinstance(record.get("verdict"), dict) else {}
        keep = ("schema", "job", "complete", "cut")
        record = {k: record[k] for k in keep if k in record}
        record["verdict"] = {"verdict": judged.get("verdict", "unknown"),
                             "reasons": [cap(str(r)) for r in (judged.get("reasons") or [])[:LIST_CAP // 8]],
                             "causes": [cap(str(c)) for c in (judged.get("causes") or [])[:LIST_CAP // 8]]}
        record.setdefault("cut", []).append("everything else (over the size bound)")
        record["digest"] = digest(record)
        data = records.dumps(record).encode()
    return data


WARM_ROUNDS = 12     # calls that leave a function specialised by 3.11's adaptive interpreter (8 and a few)
_NO_DIR = "/proc/self/no-job-dir"   # a job directory no file can be in (procfs)


def warm_up(spec: records.LaunchSpec, rounds: int = WARM_ROUNDS) -> None:
    """Run the record's own code *rounds* times: reads of /proc and /sys; no file, no child.

    Called by the fork server before it forks anything: each shepherd then
    shares these functions already specialised by the interpreter (3.11
    rewrites a function's bytecode after its first calls) and the facts
    fixed for the boot already read (``collect._per_boot``), instead of
    doing both again in pages of its own.
    """
    usage = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(rounds):
        rec = Recorder(_NO_DIR, spec)
        rec.before_start()
        rec.static_sections()
        bounded(rec.complete(usage))
        figures.parse(b"warm 1.5 s\n# a comment\nwarm x\n")


def _run(argv: list[str], timeout: float = SIDE_LIMIT / 3) -> tuple[int, str]:
    """In a side task's child: run *argv* (nvidia-smi) with a deadline; ``(status, output)``, -1 if it did not run.

    The output is stdout and stderr together; the status is the exit code, or
    minus the signal that ended it. Spawned with posix_spawn rather than the
    subprocess module, which (with threading, selectors and the rest it loads)
    would be loaded in the fork server for this alone: a megabyte more that
    every shepherd it forks maps.
    """
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        try:
            pid = os.posix_spawnp(argv[0], argv, os.environ, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
                                  file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                                                (os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_DUP2, w, 2)])
        finally:
            os.close(w)
    except OSError as exc:
        os.close(r)
        return -1, f"cannot run {argv[0]}: {sysread.error_text(exc)}"
    chunks, kept = [], 0
    give_up = time.monotonic() + timeout
    poller = select.poll()
    poller.register(r, select.POLLIN)
    try:
        while True:
            left = give_up - time.monotonic()
            if left <= 0 or not poller.poll(int(left * 1000) + 1):
                if time.monotonic() < give_up:
                    continue
                os.kill(pid, signal.SIGKILL)   # our unreaped child: its pid is still ours
                os.waitpid(pid, 0)
                return -1, f"{argv[0]} took longer than {int(timeout)}s"
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            if kept <= 4 * MAX_BYTES:   # (decoded and cut to MAX_BYTES characters below)
                chunks.append(chunk)
                kept += len(chunk)
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode("utf-8", "replace")[:MAX_BYTES]


class _Side:
    """A child process whose stdout (JSON or text) the record waits for, within a deadline."""

    def __init__(self, name: str, pid: int, fd: int, patient: bool = False):
        self.name, self.pid, self.fd = name, pid, fd
        self.patient = patient   # idle and in the job's own allocation: it may take as long as the job
        self.chunks: list[bytes] = []
        self.done = False
        self.status: int | None = None

    def read(self) -> bool:
        """Take what the pipe holds; True once it reached EOF (the child is then reaped)."""
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return False
            except OSError:
                chunk = b""
            if not chunk or sum(map(len, self.chunks)) > MAX_BYTES:
                self.finish()
                return True
            self.chunks.append(chunk)

    def finish(self, kill: bool = False) -> None:
        if self.done:
            return
        if kill:   # our unreaped child: its pid is still ours
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.close(self.fd)
        self.done = True
        self.reap(0.0)   # no waiting here: this runs in the shepherd's loop while the job runs

    def reap(self, within: float) -> None:
        """Collect the child's status once it has exited, waiting up to *within* seconds.

        The wait is a poll on the child's pidfd, so it ends the moment the child
        does (a child that closed its pipe is usually still exiting). A child
        stuck in the kernel (a hung filesystem) must not hold the shepherd: it
        is left (its pid stays ours, a zombie, until we exit).
        """
        if self.status is not None:
            return
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if not pid and within > 0:
            try:   # our unreaped child: its pid cannot have been reused
                pidfd = os.pidfd_open(self.pid)
            except OSError:
                pidfd = None
            if pidfd is not None:
                try:
                    poller = select.poll()
                    poller.register(pidfd, select.POLLIN)
                    poller.poll(int(within * 1000) + 1)
                finally:
                    os.close(pidfd)
                pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid:
            self.status = status

    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", "replace")


def quiet_field(job_dir: str) -> dict:
    """What a benchmark job's start did (the daemon's quiet.json ``record``), or null with why.

    Not the file's ``writes``: those are the daemon's undo list, which says
    nothing of refusals nor of where the kernel delivers each IRQ now.
    """
    data = records.read_json(os.path.join(job_dir, "quiet.json"))
    if data is None:
        return sysread.field(None, "quiet.json", "not a benchmark job, or nothing was changed")
    rec = data.get("record") if isinstance(data, dict) else None
    if not isinstance(rec, dict):
        return sysread.field(None, "quiet.json", "it holds no record of what the start did (the start "
                                                    "failed midway, or an older hpc-batch wrote it)")
    return sysread.field(rec, "quiet.json")


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


_PUBLIC = ("path", "realpath", "size", "sha256")   # what the record's value (and so diff and digest) holds


def _executable_field(side: dict, source: str) -> dict:
    """The field from the side task's parts: the value compares by names and sha256; each part's identity,
    where its hash came from and how it was checked are beside it (no version of a file is another setup)."""
    exe = side.get("executable") or {}
    value: dict = {k: cap(exe[k]) if isinstance(exe[k], str) else exe[k] for k in _PUBLIC if k in exe}
    extra: dict = {"identity": {}}
    for name in ("interpreter", "script"):
        part = side.get(name)
        if isinstance(part, dict):
            value[name] = {k: cap(part[k]) if isinstance(part[k], str) else part[k]
                           for k in (*_PUBLIC, "error") if k in part}
    for name in ("executable", "interpreter", "script"):
        part = side.get(name)
        if isinstance(part, dict) and isinstance(part.get("identity"), dict):
            how = {k: cap(str(part[k])) for k in ("hash_from", "checked_by") if k in part}
            extra["identity"][name] = dict(part["identity"], **how)
    for key in ("hasher", "cache_error"):
        if key in side:
            extra[key] = side[key]
    if "sha256" not in exe:
        why = cap(str(exe.get("error") or "not identified"))
        return dict(sysread.field(None, source, why), **value, **extra)
    return dict(sysread.field(value, source), **extra)


class Recorder:
    """One job's record, from the shepherd's first look to the end (see the module's text)."""

    def __init__(self, job_dir: str, spec: records.LaunchSpec, fork=os.fork, groups: list[int] | None = None):
        self.fork = fork    # the shepherd's, which holds its stop signals back from the child
        self.groups = groups   # the user's groups, looked up once by the shepherd (identity.groups_of)
        self.job_dir = job_dir
        self.spec = spec
        self.conf = spec.record or {}
        self.src = sysread.Source(self.conf.get("root") or "/")
        self.cpus = list(self.conf.get("cpus") or [])
        self.cgroup = spec.cgroup
        self.record: dict = {"schema": collect.SCHEMA, "job": spec.id, "complete": False}
        self.start_snap: dict | None = None
        self.sides: dict[str, _Side] = {}
        self.side_deadline: float | None = None
        self.figures_file: tuple[str, str | None] | None = None   # the figures' file: (path, why it was not made)
        self.executable: dict | None = None   # the executable's field, when known without a side task
        self.launched: dict | None = None     # the file the job's child exec'd (main.parse_exe_report)
        self.known: dict = {}                 # this user's cached hashes: identity tuple -> sha256

    # -- 1. before the fork -----------------------------------------------------------------
    def make_figures_file(self, env: dict) -> None:
        """The job's file for its own figures, named in *env* (the job's) when it could be made."""
        try:
            path, why = figurefile.create(self.spec.id, self.spec.uid, self.spec.gid)
        except Exception as exc:   # never the job's start
            path, why = figurefile.DIRECTORY, f"cannot create it ({sysread.error_text(exc)})"
        self.figures_file = (path, why)
        if why is None:
            env[figures.ENV] = path

    def drop_figures_file(self) -> None:
        """The job was never forked: its file goes."""
        if self.figures_file is not None and self.figures_file[1] is None:
            figurefile.remove(self.figures_file[0])
        self.figures_file = None

    def before_start(self) -> None:
        """The sentinels' start snapshot (the only part between the submit and the job's start)."""
        try:
            self.start_snap = sentinels.snapshot(self.src, self.cpus, self.conf.get("node_cpus") or self.cpus,
                                                 self.conf.get("l3_cpus") or self.cpus, self.cgroup,
                                                 self.conf.get("held_idle") or ())
        except Exception as exc:   # a record must never cost the job its start
            self.start_snap = {"error": sysread.error_text(exc)}

    # -- 2. while the job runs ---------------------------------------------------------------
    def after_start(self, running=lambda: True, pid: int | None = None, launched: dict | None = None,
                    failed: bytes = b"") -> list[int]:
        """The static sections and the side tasks; returns the side tasks' fds to watch.

        *pid*, *launched* and *failed* are the job's leader, the file its child
        exec'd and what it said of a failed exec (``main.parse_exe_report``).
        The record is written incomplete here only while *running()* holds: a
        job that has already ended gets its complete record at once (at_end).
        """
        # The side tasks first: they run while the sections are read, and fork a smaller process.
        self.side_deadline = time.monotonic() + SIDE_LIMIT
        self._start_executable(pid, launched, failed)
        if self.conf.get("gpus") and self.conf.get("nvidia_smi"):
            self._spawn_side("gpu", self._gpu_start)
        self.static_sections()
        if running():
            self.write()
        return [side.fd for side in self.sides.values()]

    def static_sections(self) -> None:
        """The sections read once, after the start: collector, kernel, CPU, frequency, memory,
        software, the allocation and the machine (reads of /proc and /sys only)."""
        rec, src, conf = self.record, self.src, self.conf
        for name, make in (
                ("collector", lambda: collect.collector(src, int(self.spec.id or 0), conf.get("version", "?"),
                                                        conf.get("commit"))),
                ("kernel", lambda: collect.kernel(src)),
                ("cpu", lambda: collect.cpu(src)),
                ("frequency", lambda: collect.frequency(src, self.cpus)),
                ("memory", lambda: collect.memory(src, list(conf.get("mems") or []))),
                ("software", lambda: software(self.spec, bool(conf.get("env_values"))))):
            try:
                rec[name] = make()
            except Exception as exc:
                rec[name] = {"error": sysread.error_text(exc)}
        try:
            read_back = collect.read_back(src, self.cgroup)
        except Exception as exc:
            read_back = {"error": sysread.error_text(exc)}
        rec["allocation"] = {"requested": conf.get("requested") or {}, "read_back": read_back}
        rec["machine"] = dict(conf.get("machine") or {}, quiet=self._quiet())
        rec["gpu"] = []

    def _quiet(self) -> dict:
        return quiet_field(self.job_dir)

    def on_readable(self, fd: int) -> bool:
        """A side task's pipe is readable; True once that task is done (stop watching *fd*)."""
        for side in self.sides.values():
            if side.fd == fd and not side.done:
                return side.read()
        return True

    def deadline(self) -> float | None:
        """When the side tasks are cut short (monotonic), while any that may be runs."""
        return self.side_deadline if any(not s.done and not s.patient for s in self.sides.values()) else None

    def cut_short(self) -> list[int]:
        """The side tasks' time is up: kill the ones still running (not a patient one); their fds."""
        cut = [s for s in self.sides.values() if not s.done and not s.patient]
        for side in cut:
            side.finish(kill=True)
        return [side.fd for side in cut]

    def _gpu_ids(self) -> list[str]:
        return [g.get("uuid") or str(g.get("index")) for g in self.conf["gpus"]]

    def _gpu_start(self) -> dict:
        """In a child: the GPUs' static facts and start state, their CUDA version and topology rows."""
        smi, ids = self.conf["nvidia_smi"], self._gpu_ids()
        rc, out = _run([smi, "topo", "-m"])
        uuids = {g["index"]: g["uuid"] for g in self.conf["gpus"] if g.get("uuid")}
        return {"rows": gpuquery.query(_run, smi, ids), "cuda": gpuquery.cuda_version(_run, smi, ids),
                "topo": gpuquery.topo_rows(out, uuids) if rc == 0 else {}}

    def _gpu_finish(self) -> dict:
        """In a child: the GPUs' end state (temperature, clock event reasons)."""
        return {"rows": gpuquery.query(_run, self.conf["nvidia_smi"], self._gpu_ids(), gpuquery.DYNAMIC_FIELDS)}

    def _gpu_section(self, start: dict | None, end: dict | None) -> list:
        gpus = self.conf.get("gpus") or []
        if start is None:
            why = (self.record.get("side_errors") or {}).get("gpu") or "the GPU query failed"
            rows = gpuquery.unavailable(self._gpu_ids(), why)
            start = {"rows": [dict(r, uuid=sysread.field(g.get("uuid"), "the daemon (nvidia-smi -L)"))
                              for r, g in zip(rows, gpus)]}
        topo = dict(start.get("topo") or {})
        for g in gpus:   # the daemon's reading of topo -m, where this one failed
            if g.get("uuid") and g["uuid"] not in topo and g.get("topo"):
                row = g["topo"]
                topo[g["uuid"]] = " ".join(f"{k}={v}" for k, v in sorted((row.get("links") or {}).items())) + \
                    f" NUMA Affinity={row.get('numa')}"
        return gpuquery.section(start.get("rows") or [], topo, (end or {}).get("rows") or [], start.get("cuda"))

    def _spawn_side(self, name: str, fn, patient: bool = False) -> None:
        r, w = os.pipe2(os.O_CLOEXEC)
        try:
            pid = self.fork()
        except OSError as exc:
            os.close(r)
            os.close(w)
            self.record.setdefault("side_errors", {})[name] = f"cannot fork ({sysread.error_text(exc)})"
            return
        if pid == 0:
            code = 1
            try:
                signal.set_wakeup_fd(-1)
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
                    signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, ())
                os.dup2(w, 1)
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, 0)
                os.dup2(null, 2)
                os.closerange(3, 1 << 16)
                try:
                    out = fn()
                except Exception as exc:
                    out = {"error": sysread.error_text(exc)}
                os.write(1, records.dumps(out).encode())
                code = 0
            except BaseException:
                pass
            os._exit(code)
        os.close(w)
        os.set_blocking(r, False)
        self.sides[name] = _Side(name, pid, r, patient)

    # -- what ran: the executable, its interpreter or script, hashed once per version ------------
    def _start_executable(self, pid: int | None, launched: dict | None, failed: bytes) -> None:
        """Name the file the job's child exec'd; hash it in a side task unless this user's cache has it.

        The file is the one the child opened and exec'd (``main._exec``), never one found again on
        the PATH: an exec that failed ran nothing, and the record says so.
        """
        source = "the executable, read as the user"
        self.launched = launched
        where = {"path": cap(self._abs(launched["path"]))} if launched else {}
        if failed:
            why = failed.decode("utf-8", "replace").strip()
            self.executable = dict(sysread.field(None, "the job's start", cap(f"it did not run: {why}")), **where)
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
        import hashlib  # a cache miss only (see sha256 above)
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

    # -- the cache: root's, per user --------------------------------------------------------------
    def _cache_path(self) -> str | None:
        """This user's cache file: hashes a job of theirs read, never one another user's job could
        have planted (a file on their own FUSE mount lies only to its owner)."""
        if not isinstance(self.spec.uid, int) or self.job_dir == _NO_DIR:
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


    # -- 3. at the end --------------------------------------------------------------------------
    def at_end(self, usage) -> dict:
        """The end snapshot, deltas and verdict; writes the complete record. Returns
        ``{"verdict": word, "digest": "sha256:..."}`` for the exit record."""
        patient = any(not s.done and s.patient for s in self.sides.values())
        self._await_sides(time.monotonic() + END_WAIT if patient
                          else min(self.side_deadline or 0.0, time.monotonic() + END_WAIT))
        rec = self.complete(usage)
        data = self.write()
        return {"verdict": rec["verdict"].get("verdict", "unknown"), "digest": rec.get("digest"),
                "bytes": len(data)}

    def complete(self, usage) -> dict:
        """The record's end in memory: side task results, the end snapshot, deltas, verdict."""
        rec = self.record
        rec["software"] = rec.get("software") or {}
        rec["software"]["executable"] = self._executable_field()
        gpu_start = self._side_json("gpu")
        gpu_end = self._gpu_end() if self.conf.get("gpus") and self.conf.get("nvidia_smi") else None
        own = {"nivcsw": usage.ru_nivcsw, "nvcsw": usage.ru_nvcsw,   # the job's usage, for a job without a cgroup
               "usage_usec": int((usage.ru_utime + usage.ru_stime) * 1e6)} if usage is not None else None
        try:
            end = sentinels.snapshot(self.src, self.cpus, self.conf.get("node_cpus") or self.cpus,
                                     self.conf.get("l3_cpus") or self.cpus, self.cgroup,
                                     self.conf.get("held_idle") or ())
        except Exception as exc:
            end = {"error": sysread.error_text(exc)}
        try:
            rec["gpu"] = self._gpu_section(gpu_start, gpu_end) if self.conf.get("gpus") else []
        except Exception as exc:
            rec["gpu"] = [{"error": sysread.error_text(exc)}]
        start = self.start_snap or {"error": "no start snapshot"}
        try:
            delta = sentinels.delta(start, end, own)
        except Exception as exc:
            delta = {"error": sysread.error_text(exc)}
        rec["sentinels"] = {"start": start, "end": end, "delta": delta}
        try:
            rec["verdict"] = verdict.judge(delta, self.conf.get("thresholds"), rec["gpu"])
        except Exception as exc:
            rec["verdict"] = {"verdict": "unknown", "reasons": [f"no verdict: {sysread.error_text(exc)}"],
                              "causes": [verdict.UNKNOWN + "verdict"]}
        if self.figures_file is not None:   # (after the end snapshot, which it must not delay)
            rec["metrics"] = self._figures()
        rec["complete"] = True
        return rec

    def _figures(self) -> dict:
        """The job's own figures as a field (docs/record.md, "The job's own figures")."""
        assert self.figures_file is not None
        path, why = self.figures_file
        if why is not None:
            return sysread.field(None, path, f"{why}: {figures.ENV} was not set")
        try:
            return figurefile.read(path, self.spec.uid)
        except Exception as exc:   # the record must never cost the job anything
            return sysread.field(None, path, sysread.error_text(exc))

    def _await_sides(self, until: float) -> None:
        poller = select.poll()
        live = {s.fd: s for s in self.sides.values() if not s.done}
        for fd in live:
            poller.register(fd, select.POLLIN)
        while live:
            left = until - time.monotonic()
            if left <= 0:
                break
            for fd, _ in poller.poll(int(left * 1000) + 1):
                if live[fd].read():
                    poller.unregister(fd)
                    del live[fd]
        for side in live.values():
            side.finish(kill=True)
            side.chunks.append(b"")
            self.record.setdefault("side_errors", {})[side.name] = (
                f"not done {int(END_WAIT)}s after the job's end" if side.patient
                else f"took longer than {int(SIDE_LIMIT)}s")

    def _reaped(self, name: str):
        """The side task *name* (None if never spawned), its exit status collected once it is done."""
        side = self.sides.get(name)
        if side is not None and side.done:
            side.reap(REAP_WAIT)
        return side

    def _side_json(self, name: str) -> dict | None:
        side = self._reaped(name)
        if side is None or not side.done or side.status != 0:
            return None
        try:
            value = records.loads(side.text())
        except ValueError:
            return None
        return value if isinstance(value, dict) and "error" not in value else None

    def _side_result(self, name: str, source: str) -> dict:
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
            return dict(sysread.field(None, source, cap(str(value["error"]))),
                        **{k: cap(v) if isinstance(v, str) else v for k, v in value.items() if k != "error"})
        return sysread.field({k: cap(v) if isinstance(v, str) else v for k, v in value.items()}, source)

    def _gpu_end(self) -> dict | None:
        self._spawn_side("gpu_end", self._gpu_finish)
        if "gpu_end" not in self.sides:
            return None
        self._await_sides(time.monotonic() + END_GPU_LIMIT)
        return self._side_json("gpu_end")

    # -- the file ----------------------------------------------------------------------------------
    def write(self) -> bytes:
        """Replace record.json (root's, 0640, readable by the job's user); returns what was written."""
        data = bounded(self.record)
        uid, gid = self.spec.uid, self.spec.admin_gid

        def share(fd: int) -> None:
            if isinstance(uid, int):
                acl.share_with(fd, uid, gid if isinstance(gid, int) else -1)
        try:
            records.write_atomic(os.path.join(self.job_dir, records.RECORD), data, 0o640, durable=False,
                                 prepare=share)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            self.record["write_error"] = sysread.error_text(exc)   # a full disk costs the record, never the job
        return data
