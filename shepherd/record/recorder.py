"""One job's record, from the shepherd's first look to the job's end: :class:`Recorder`.

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
the output buffer), and at most ``bounds.MAX_BYTES``. :func:`warm_up` runs
this code in the fork server before it forks any shepherd. Standard library only.
"""

import errno
import os
import resource
import time

from . import bounds, collect, executable, figurefile, figures, gpuquery, sentinels, sides, software, verdict

try:
    from shepherd.base import acl, records, sysread
except ImportError:  # run as a file: the base is a top-level package
    from base import acl, records, sysread  # type: ignore[no-redef]

FIGURES_ENV = figures.ENV    # what make_figures_file sets in the job's environment (figures.py)
WARM_ROUNDS = 12     # calls that leave a function specialised by 3.11's adaptive interpreter (8 and a few)


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
        rec = Recorder(executable.NO_DIR, spec)
        rec.before_start()
        rec.static_sections()
        bounds.bounded(rec.complete(usage))
        figures.parse(b"warm 1.5 s\n# a comment\nwarm x\n")


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


class Recorder(executable.Identifying, sides.SideTasks):
    """One job's record, from the shepherd's first look to the end (see the module's text).

    What ran is :class:`executable.Identifying`'s; the side tasks' children
    (the hash, the GPU queries) are :class:`sides.SideTasks`'.
    """

    def __init__(self, job_dir: str, spec: records.LaunchSpec, fork=os.fork, groups: list[int] | None = None):
        # The mixins' attributes (fork, groups, record, sides, ...) are described where they are declared.
        self.fork = fork
        self.groups = groups
        self.job_dir = job_dir
        self.spec = spec
        self.conf = spec.record or {}
        self.src = sysread.Source(self.conf.get("root") or "/")
        self.cpus = list(self.conf.get("cpus") or [])
        self.cgroup = spec.cgroup
        self.record = {"schema": collect.SCHEMA, "job": spec.id, "complete": False}
        self.start_snap: dict | None = None
        self.sides = {}
        self.side_deadline = None
        self.figures_file: tuple[str, str | None] | None = None   # the figures' file: (path, why it was not made)
        self.executable = None
        self.launched = None
        self.known = {}

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
        exec'd and what it said of a failed exec (``child.parse_exe_report``).
        The record is written incomplete here only while *running()* holds: a
        job that has already ended gets its complete record at once (at_end).
        """
        # The side tasks first: they run while the sections are read, and fork a smaller process.
        self.side_deadline = time.monotonic() + sides.SIDE_LIMIT
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
                ("software", lambda: software.software(self.spec, bool(conf.get("env_values"))))):
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

    # -- the GPUs: nvidia-smi in side tasks, at the start and at the end ----------------------
    def _gpu_ids(self) -> list[str]:
        return [g.get("uuid") or str(g.get("index")) for g in self.conf["gpus"]]

    def _gpu_start(self) -> dict:
        """In a child: the GPUs' static facts and start state, their CUDA version and topology rows."""
        smi, ids = self.conf["nvidia_smi"], self._gpu_ids()
        rc, out = sides.run([smi, "topo", "-m"])
        uuids = {g["index"]: g["uuid"] for g in self.conf["gpus"] if g.get("uuid")}
        return {"rows": gpuquery.query(sides.run, smi, ids), "cuda": gpuquery.cuda_version(sides.run, smi, ids),
                "topo": gpuquery.topo_rows(out, uuids) if rc == 0 else {}}

    def _gpu_finish(self) -> dict:
        """In a child: the GPUs' end state (temperature, clock event reasons)."""
        return {"rows": gpuquery.query(sides.run, self.conf["nvidia_smi"], self._gpu_ids(), gpuquery.DYNAMIC_FIELDS)}

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

    def _gpu_end(self) -> dict | None:
        self._spawn_side("gpu_end", self._gpu_finish)
        if "gpu_end" not in self.sides:
            return None
        self._await_sides(time.monotonic() + sides.END_GPU_LIMIT)
        return self._side_json("gpu_end")

    # -- 3. at the end --------------------------------------------------------------------------
    def at_end(self, usage) -> dict:
        """The end snapshot, deltas and verdict; writes the complete record. Returns
        ``{"verdict": word, "digest": "sha256:..."}`` for the exit record."""
        self._await_end()
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

    # -- the file ----------------------------------------------------------------------------------
    def write(self) -> bytes:
        """Replace record.json (root's, 0640, readable by the job's user); returns what was written."""
        data = bounds.bounded(self.record)
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
