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
"""

import errno
import hashlib
import os
import resource
import select
import signal
import time

try:
    from shepherd import acl, collect, figurefile, figures, gpuquery, identity, records, sentinels, sysread, verdict
    from shepherd.jsoncodec import dumps_canonical
except ImportError:  # run as a file: siblings are top-level modules
    import acl  # type: ignore[no-redef]
    import collect  # type: ignore[no-redef]
    import figurefile  # type: ignore[no-redef]
    import figures  # type: ignore[no-redef]
    import gpuquery  # type: ignore[no-redef]
    import identity  # type: ignore[no-redef]
    import records  # type: ignore[no-redef]
    import sentinels  # type: ignore[no-redef]
    import sysread  # type: ignore[no-redef]
    import verdict  # type: ignore[no-redef]
    from jsoncodec import dumps_canonical  # type: ignore[no-redef]

MAX_BYTES = 256 << 10        # a record's size bound
STRING_CAP = 1024            # characters kept of one user-controlled string (an argument, a path, a key)
LIST_CAP = 512               # arguments or environment keys kept
HASH_CAP = 1 << 30           # an executable larger than this is not hashed (its size is still recorded)
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


# What the daemon (engine._job_env) and the shepherd (the figures' file) set for each job: they
# differ between any two jobs, so the environment's digest without them says whether two jobs were
# submitted with the same one.
FIGURES_ENV = figures.ENV    # the job's own figures' file (shepherd/figurefile.py)
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
            "sha256": sysread.field(hashlib.sha256(block).hexdigest(), "launch spec"),
            "bytes": sysread.field(len(block), "launch spec"),
            "submitted_sha256": sysread.field(
                hashlib.sha256(env_block({k: v for k, v in env.items() if k not in PER_JOB_VARS})).hexdigest(),
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
    return "sha256:" + hashlib.sha256(dumps_canonical(body).encode()).hexdigest()


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

    def __init__(self, name: str, pid: int, fd: int):
        self.name, self.pid, self.fd = name, pid, fd
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
    def after_start(self, running=lambda: True) -> list[int]:
        """The static sections and the side tasks; returns the side tasks' fds to watch.

        The record is written incomplete here only while *running()* holds: a
        job that has already ended gets its complete record at once (at_end).
        """
        # The side tasks first: they run while the sections are read, and fork a smaller process.
        self.side_deadline = time.monotonic() + SIDE_LIMIT
        self._spawn_side("executable", self._hash_executable)
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
        """When the side tasks are cut short (monotonic), while any runs."""
        return self.side_deadline if any(not s.done for s in self.sides.values()) else None

    def cut_short(self) -> None:
        """The side tasks' time is up: kill the ones still running."""
        for side in self.sides.values():
            side.finish(kill=True)

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

    def _spawn_side(self, name: str, fn) -> None:
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
        self.sides[name] = _Side(name, pid, r)

    def _hash_executable(self) -> dict:
        """In a child, as the job's user: resolve argv[0] as execvpe does, and hash that file."""
        spec = self.spec
        identity.become(spec.user, spec.uid, spec.gid, self.groups)
        os.chdir(spec.cwd)
        name = spec.argv[0]
        path = None
        if "/" in name:
            path = name
        else:
            for d in ((spec.env or {}).get("PATH") or os.defpath).split(os.pathsep):
                candidate = os.path.join(d or ".", name)
                if os.access(candidate, os.X_OK) and os.path.isfile(candidate):
                    path = candidate
                    break
        if path is None:
            return {"error": f"{name!r} is not on the job's PATH"}
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        st = os.fstat(fd)
        out = {"path": os.path.abspath(path), "realpath": os.path.realpath(path), "size": st.st_size}
        if st.st_mode & 0o170000 != 0o100000:   # S_ISREG without importing stat
            return dict(out, error="not a regular file")
        if st.st_size > HASH_CAP:
            return dict(out, error=f"larger than {HASH_CAP >> 20} MiB: not hashed")
        h = hashlib.sha256()
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            h.update(chunk)
        return dict(out, sha256=h.hexdigest())

    # -- 3. at the end --------------------------------------------------------------------------
    def at_end(self, usage) -> dict:
        """The end snapshot, deltas and verdict; writes the complete record. Returns
        ``{"verdict": word, "digest": "sha256:..."}`` for the exit record."""
        self._await_sides(min(self.side_deadline or 0.0, time.monotonic() + END_WAIT))
        rec = self.complete(usage)
        data = self.write()
        return {"verdict": rec["verdict"].get("verdict", "unknown"), "digest": rec.get("digest"),
                "bytes": len(data)}

    def complete(self, usage) -> dict:
        """The record's end in memory: side task results, the end snapshot, deltas, verdict."""
        rec = self.record
        rec["software"] = rec.get("software") or {}
        rec["software"]["executable"] = self._side_result("executable", "the executable, read as the user")
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
            self.record.setdefault("side_errors", {})[side.name] = f"took longer than {int(SIDE_LIMIT)}s"

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
