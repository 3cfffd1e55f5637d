"""hpc-batchd: the root daemon that queues jobs and starts their shepherds.

Start-up refuses rather than runs half-configured (exit 78, EX_CONFIG, which
the unit's RestartPreventExitStatus= turns into a clean stop): each refusal
names what is missing and the flag that opts out of it. SIGHUP re-execs the
daemon in place (state is on disk after every change, the listening socket
and the state lock are handed across); running jobs are not its children
(their shepherds are init's) and are re-adopted from their pidfiles.
"""

import dataclasses
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import NoReturn

from docopt import DocoptExit, docopt

from .. import __version__, bounds, defaults
from ..core import resources
from ..core.cut import one_line
from ..core.durations import DurationError, parse_duration
from ..core.scheduler import POLICIES
from ..core.sizes import SizeError, parse_size
from ..usage import _WORD
from . import access, cgroups, devdir, devmask, discovery, handoff, launcher, metrics_file, reload_args, sdnotify
from .benchmode import housekeeping, shepherdcpus
from .engine import Engine
from .hooks import Hooks
from .jobrecord import ThresholdError, parse_thresholds
from .server import Server, hold_signals
from .store import StateError, Store

USAGE = f"""hpc-batchd: the hpc-batch daemon (run by systemd as root).

Usage:
  hpc-batchd [options]
  hpc-batchd (-h | --help)
  hpc-batchd --version

Options:
  --max-lifetime DURATION  Kill jobs running longer than this; also the default
                           and ceiling of --max-time [default: {defaults.MAX_LIFETIME}]
  --reserve-cpu N          CPUs held back for the OS (rounded up to whole
                           cores, as for jobs) [default: {defaults.RESERVE_CPU}]
  --cpu-unit UNIT          core: a job gets every thread of whole cores, and
                           no two jobs share a core; thread: single threads
                           are packed, siblings may go to other jobs
                           [default: {defaults.CPU_UNIT}]
  --housekeeping-cpus LIST
                           CPUs (a list: 0,1 or 0-3) where the daemon and the
                           shepherds run and interrupts are steered; benchmark
                           jobs never get a thread of their cores. auto: those
                           of --reserve-cpu, else the lowest CPU's core; none:
                           no such CPUs [default: {defaults.HOUSEKEEPING_CPUS}]
  --cpufreq POLICY         What a benchmark job's start does to the frequency
                           of its CPUs: record (read it into the job's record)
                           or enforce (also governor performance and minimum
                           frequency = maximum on the job's own cpufreq
                           policies; undone when it ends)
                           [default: {defaults.CPUFREQ}]
  --allow-turbo-off        With --cpufreq enforce, turn turbo off for a
                           benchmark job: per-policy boost always, the
                           machine-wide switch only while no other job runs.
  --irqbalance-ban         When irqbalance runs, tell it (its control socket)
                           to keep IRQs off benchmark jobs' CPUs while they
                           run; without it irqbalance is only detected and
                           the job's record says it may undo the IRQ moves.
  --records MODE           all: every job gets a reproducibility record
                           (dispatch show --record); none: no record
                           [default: {defaults.RECORDS}]
  --record-thresholds LIST Change the record's verdict thresholds:
                           NAME=VALUE,... (names in docs/record.md).
  --reserve-mem GB         Memory (GiB) held back for the OS [default: {defaults.RESERVE_MEM_GB}]
  --min-job-mem GB         Floor of an assigned memory budget [default: {defaults.MIN_JOB_MEM_GB}]
  --keep-finished N        Finished jobs remembered per user [default: {defaults.KEEP_FINISHED}]
  --list-is-public         Let everyone use dispatch list --all.
  --admin-group GROUP      Members may list, attach to and kill any job
                           [default: {defaults.ADMIN_GROUP}]
  --socket PATH            Unix socket to listen on [default: {defaults.SOCKET}]
  --state-dir DIR          Job state and metadata [default: {defaults.STATE_DIR}]
  --dev-dir DIR            Where job inspection entries appear [default: {defaults.DEV_DIR}]
  --schedule POLICY        fifo-strict, easy-backfill or strict-backfill
                           [default: {defaults.SCHEDULE}]
  --no-cgroups             Development mode: CPU affinity only, no memory limit,
                           no NUMA confinement.
  --no-dev-dir             Skip the per-job entries under --dev-dir.
  --no-gpu-mask            Do not hide GPUs a job was not given (its cgroup's
                           device program); CUDA_VISIBLE_DEVICES only.
  --max-queued-per-user N  Jobs one user may hold queued or waiting [default: {defaults.MAX_QUEUED_PER_USER}]
  --max-job-size SIZE      Largest command plus --env environment of one job
                           [default: {defaults.MAX_JOB_SIZE}]
  --max-connections-per-user N
                           Open connections one user may hold
                           [default: {defaults.MAX_CONNECTIONS_PER_USER}]
  --max-reply-bytes-per-user SIZE
                           Reply bytes one user's connections may leave
                           unread in the daemon before it reads no more of
                           that user's requests
                           [default: {defaults.MAX_REPLY_BYTES_PER_USER}]
  --max-pids N             pids.max of every job's cgroup; 0 for no limit
                           [default: {defaults.MAX_PIDS}]
  --max-output-buffer SIZE Output kept for attach in the state dir; the rest
                           goes straight to the job's log file
                           [default: {defaults.MAX_OUTPUT_BUFFER}]
  --history-per-user SIZE  Finished jobs and their records kept per user in
                           <state-dir>/history.db, compressed; a user's oldest
                           go first [default: {defaults.HISTORY_PER_USER}]
  --history-days N         Days a finished job stays in the history
                           [default: {defaults.HISTORY_DAYS}]
  --undelivered-max SIZE   Outputs whose delivery failed, kept in all
                           [default: {defaults.UNDELIVERED_MAX}]
  --undelivered-per-user SIZE
                           One user's share of those [default: {defaults.UNDELIVERED_PER_USER}]
  --undelivered-max-age DURATION
                           Drop an undelivered output this old
                           [default: {defaults.UNDELIVERED_MAX_AGE}]
  --state-reserve SIZE     Free space kept on the state directory's filesystem
                           (plus the journal's size): submits are refused below it
                           [default: {defaults.STATE_RESERVE}]
  --metrics-file PATH      Keep a Prometheus text file (*.prom) current at PATH,
                           for node_exporter's textfile collector; needs
                           hpc-batch[metrics]. Default: none (no metrics).
  --metrics-group GROUP    Group that may read the metrics file (0640), e.g.
                           node_exporter's. Default: the directory's group.
  -h --help                Show this help.
  --version                Show the version.
"""

log = logging.getLogger("hpc-batchd")
INHERIT_ENV = "HPC_BATCH_INHERIT_FDS"


class ConfigError(Exception):
    """A flag value that cannot be used; exit 2 (usage) or 78 (refusal)."""

    def __init__(self, message: str, status: int = defaults.EX_CONFIG):
        super().__init__(message)
        self.status = status


@dataclass
class Config:
    """The daemon's settings, validated."""

    socket: str
    state_dir: str
    dev_dir: str | None
    max_lifetime: int
    reserve_cpu: int
    reserve_mem: int
    min_job_mem: int
    keep_finished: int
    list_is_public: bool
    admin_group: str
    schedule: str
    cgroups: bool
    max_queued_per_user: int = defaults.MAX_QUEUED_PER_USER
    max_job_size: int = parse_size(defaults.MAX_JOB_SIZE, "M")
    max_connections_per_user: int = defaults.MAX_CONNECTIONS_PER_USER
    max_reply_bytes_per_user: int = parse_size(defaults.MAX_REPLY_BYTES_PER_USER, "M")
    max_pids: int = defaults.MAX_PIDS
    max_output_buffer: int = parse_size(defaults.MAX_OUTPUT_BUFFER, "M")
    state_reserve: int = parse_size(defaults.STATE_RESERVE, "M")
    gpu_mask: bool = True           # --no-gpu-mask turns it off
    mask_gpus: bool = False         # in force: asked for, and possible (cgroups, GPUs present)
    cgroup_root: str = defaults.CGROUP_ROOT
    admin_gid: int | None = None
    user_name: str = ""
    metrics_file: str | None = None   # --metrics-file, absolute and checked (metrics_file.check)
    metrics_gid: int = -1             # the metrics file's group (--metrics-group, or its directory's)
    # The flags' defaults, for a Config made without parse_args (tests): one definition, in defaults.py.
    history_per_user: int = parse_size(defaults.HISTORY_PER_USER, "M")
    history_days: int = defaults.HISTORY_DAYS
    undelivered_max: int = parse_size(defaults.UNDELIVERED_MAX, "M")
    undelivered_per_user: int = parse_size(defaults.UNDELIVERED_PER_USER, "M")
    undelivered_max_age: int = parse_duration(defaults.UNDELIVERED_MAX_AGE)
    cpu_unit: str = defaults.CPU_UNIT
    housekeeping_flag: tuple[int, ...] | str = defaults.HOUSEKEEPING_CPUS   # --housekeeping-cpus, parsed
    # The housekeeping CPUs in force (filled by build()): the daemon, fork server and shepherds run
    # there, steered interrupts go there, benchmark jobs never get their cores. Also Limits.housekeeping.
    housekeeping: tuple[int, ...] = ()
    cpufreq: str = defaults.CPUFREQ
    allow_turbo_off: bool = False
    irqbalance_ban: bool = False
    records: str = defaults.RECORDS
    record_thresholds: dict = field(default_factory=dict)   # --record-thresholds, checked


def _size(flag: str, text: str, unit: str = "G", minimum: int = 0) -> int:
    try:
        value = parse_size(text, unit, allow_zero=True)
    except SizeError as exc:
        raise ConfigError(f"{flag} {exc}", 2) from None
    if value < minimum:
        raise ConfigError(f"{flag} {text!r}: must be at least {minimum} bytes", 2)
    return value


def _count(flag: str, text: str, minimum: int = 0, maximum: int = 1 << 31) -> int:
    if not (text.isascii() and text.isdigit()) or not minimum <= int(text) <= maximum:
        raise ConfigError(f"{flag} {text!r}: expected a whole number from {minimum} to {maximum}", 2)
    return int(text)


def parse_args(argv) -> Config:
    """Parse and validate hpc-batchd's arguments (raises ConfigError or exits for --help)."""
    try:
        a = docopt(USAGE, argv=list(argv), version=f"hpc-batchd {__version__}")
    except DocoptExit as exc:
        m = _WORD.search(str(exc))
        raise ConfigError(f"unexpected argument {m.group(1)!r}" if m else "missing or invalid arguments", 2) from None
    try:
        lifetime = parse_duration(a["--max-lifetime"])
    except DurationError as exc:
        raise ConfigError(f"--max-lifetime: {exc}", 2) from None
    if lifetime > bounds.MAX_SECONDS:
        raise ConfigError(f"--max-lifetime {a['--max-lifetime']!r}: at most a century", 2)
    if a["--cpu-unit"] not in defaults.CPU_UNITS:
        raise ConfigError(f"--cpu-unit {a['--cpu-unit']!r}: choose {' or '.join(defaults.CPU_UNITS)}", 2)
    if a["--cpufreq"] not in defaults.CPUFREQ_POLICIES:
        raise ConfigError(f"--cpufreq {a['--cpufreq']!r}: choose {' or '.join(defaults.CPUFREQ_POLICIES)}", 2)
    if a["--allow-turbo-off"] and a["--cpufreq"] != "enforce":
        raise ConfigError("--allow-turbo-off needs --cpufreq enforce", 2)
    if a["--records"] not in defaults.RECORDS_MODES:
        raise ConfigError(f"--records {a['--records']!r}: choose {' or '.join(defaults.RECORDS_MODES)}", 2)
    try:
        thresholds = parse_thresholds([w.strip() for w in (a["--record-thresholds"] or "").split(",") if w.strip()])
    except ThresholdError as exc:
        raise ConfigError(str(exc), 2) from None
    if a["--schedule"] not in POLICIES:
        raise ConfigError(f"--schedule {a['--schedule']!r}: choose one of {', '.join(POLICIES)}", 2)
    metrics = _metrics_file(a["--metrics-file"], a["--metrics-group"])
    try:
        hk_flag = housekeeping.parse_flag(a["--housekeeping-cpus"])
    except ValueError as exc:
        raise ConfigError(str(exc) if "housekeeping" in str(exc) else f"--housekeeping-cpus: {exc}", 2) from None
    return Config(
        socket=os.path.abspath(a["--socket"]),
        state_dir=os.path.abspath(a["--state-dir"]),
        dev_dir=None if a["--no-dev-dir"] else os.path.abspath(a["--dev-dir"]),
        max_lifetime=lifetime,
        reserve_cpu=_count("--reserve-cpu", a["--reserve-cpu"]),
        reserve_mem=_size("--reserve-mem", a["--reserve-mem"]),
        min_job_mem=_size("--min-job-mem", a["--min-job-mem"]),
        keep_finished=_count("--keep-finished", a["--keep-finished"]),
        max_queued_per_user=_count("--max-queued-per-user", a["--max-queued-per-user"], 1),
        max_job_size=_size("--max-job-size", a["--max-job-size"], "M", 4096),
        max_connections_per_user=_count("--max-connections-per-user", a["--max-connections-per-user"], 1, 1 << 20),
        max_reply_bytes_per_user=_size("--max-reply-bytes-per-user", a["--max-reply-bytes-per-user"], "M", 4096),
        max_pids=_count("--max-pids", a["--max-pids"]),
        max_output_buffer=_size("--max-output-buffer", a["--max-output-buffer"], "M", 4096),
        state_reserve=_size("--state-reserve", a["--state-reserve"], "M"),
        list_is_public=bool(a["--list-is-public"]),
        admin_group=a["--admin-group"],
        schedule=a["--schedule"],
        cgroups=not a["--no-cgroups"],
        gpu_mask=not a["--no-gpu-mask"],
        history_per_user=_size("--history-per-user", a["--history-per-user"], "M", 64 << 10),
        history_days=_count("--history-days", a["--history-days"], 1, 36500),
        undelivered_max=_size("--undelivered-max", a["--undelivered-max"], "M"),
        undelivered_per_user=_size("--undelivered-per-user", a["--undelivered-per-user"], "M"),
        undelivered_max_age=_duration("--undelivered-max-age", a["--undelivered-max-age"]),
        metrics_file=metrics[0],
        metrics_gid=metrics[1],
        cpu_unit=a["--cpu-unit"],
        cpufreq=a["--cpufreq"],
        allow_turbo_off=bool(a["--allow-turbo-off"]),
        irqbalance_ban=bool(a["--irqbalance-ban"]),
        housekeeping_flag=hk_flag,
        records=a["--records"],
        record_thresholds=thresholds,
    )


def _duration(flag: str, text: str) -> int:
    try:
        return parse_duration(text)
    except DurationError as exc:
        raise ConfigError(f"{flag}: {exc}", 2) from None


def _metrics_file(path: str | None, group: str | None) -> tuple[str | None, int]:
    # Checked here, not in build(): a reload then keeps the old flags rather than exit over a bad path.
    if path is None:
        return None, -1
    try:
        return metrics_file.check(path, group or defaults.METRICS_GROUP)
    except metrics_file.MetricsError as exc:
        raise ConfigError(str(exc)) from None


def _inherited() -> dict:
    raw = os.environ.pop(INHERIT_ENV, "")
    out = {}
    for part in raw.split(","):
        name, _, fd = part.partition(":")
        if fd.isdigit():
            out[name] = int(fd)
    return out


def _listen(path: str, inherited: int | None) -> socket.socket:
    if inherited is not None:
        sock = socket.socket(fileno=inherited)
        sock.set_inheritable(False)
        return sock
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, mode=0o755, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the socket directory {parent}: {exc.strerror}") from None
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        raise ConfigError(f"another daemon is already listening on {path}; stop it or pass a different --socket")
    except (FileNotFoundError, ConnectionRefusedError):
        pass
    except OSError:
        pass
    finally:
        probe.close()
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, 0o666)  # every user submits; identity comes from SO_PEERCRED
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {path}: {exc.strerror}; pick another --socket") from None
    return sock


def _no_strays(keep: set) -> None:
    """Mark every descriptor the daemon inherited by accident close-on-exec.

    A daemon started from a shell (or a test) may hold that shell's pipes;
    none of them may reach a shepherd, and through it a job.
    """
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        if fd > 2 and fd not in keep:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass


def _gpu_masking(cfg: Config, machine) -> bool:
    """Whether each job's GPUs are enforced; refuses (ConfigError) when asked for and impossible."""
    if not machine.gpus:
        return False
    if not cfg.gpu_mask or not cfg.cgroups:
        log.info("GPU masking: off (%s): a job is held to its GPUs by CUDA_VISIBLE_DEVICES only",
                 "--no-gpu-mask" if not cfg.gpu_mask else "--no-cgroups")
        return False
    optout = "pass --no-gpu-mask to run with CUDA_VISIBLE_DEVICES as the only fence"
    unknown = [g for g in machine.gpus if g not in machine.gpu_minors]
    if unknown:
        raise ConfigError(f"refusing to start: cannot mask GPUs: the device minor of GPU "
                          f"{', '.join(map(str, unknown))} is unknown (nvidia-smi -q gave none); {optout}")
    why = devmask.probe(cfg.cgroup_root)
    if why:
        raise ConfigError(f"refusing to start: cannot mask GPUs ({why}); {optout}")
    log.info("GPU masking: on (a device program in each job's cgroup: a job opens only its own GPUs)")
    return True


def _housekeeping(cfg: Config, machine, limits, allowed: set):
    """Choose the housekeeping CPUs, log them, pin the daemon (and the shepherds' cgroup) there;
    returns ``limits`` with them."""
    reserved = resources.capacity(machine, limits).reserved_cpus
    try:
        cpus, why = housekeeping.choose(machine, reserved, cfg.housekeeping_flag)
    except ValueError as exc:
        raise ConfigError(f"refusing to start: {exc}") from None
    log.info("%s", housekeeping.describe(cpus, why))
    cfg.housekeeping = cpus
    try:
        housekeeping.pin(cpus, allowed)
    except OSError as exc:
        log.warning("cannot pin the daemon to its housekeeping CPUs (%s); it runs where it may", exc)
    if cfg.cgroups:
        try:
            stand_in = shepherdcpus.confine(cfg.cgroup_root, cpus)
        except OSError as exc:
            log.warning("cannot confine the shepherds' cgroup to the housekeeping CPUs (%s)", exc)
        else:
            if stand_in is not None:
                log.info("%s", shepherdcpus.describe(stand_in))
    return dataclasses.replace(limits, housekeeping=cpus)


def build(cfg: Config, inherited: dict):
    """Set everything up (or raise ConfigError) and return a ready Server."""
    tally = os.environ.pop(metrics_file.CARRY_ENV, "")   # the last daemon's counters, on a reload
    root = os.geteuid() == 0
    cfg.user_name = access.user_name(os.geteuid())
    try:
        cfg.admin_gid = access.resolve_admin_group(cfg.admin_group, defaults.ADMIN_GROUP_CANDIDATES)
    except access.AdminGroupError as exc:
        if root:
            raise ConfigError(str(exc)) from None
        log.warning("%s (ignored in user mode: only %s's own jobs are accepted)", exc, cfg.user_name)
    if cfg.cgroups:
        try:
            cgroups.check_available(cfg.cgroup_root)
            cgroups.setup(cfg.cgroup_root)
            if cfg.max_pids:
                cgroups.check_pids(cfg.cgroup_root)
        except cgroups.CgroupError as exc:
            raise ConfigError(f"refusing to start: {exc}") from None
    dev = devdir.DevDir(cfg.dev_dir, cfg.admin_gid if cfg.admin_gid is not None else -1, cfg.list_is_public)
    try:
        dev.setup()
    except devdir.DevDirError as exc:
        raise ConfigError(f"refusing to start: {exc}; pass --no-dev-dir to run without job entries") from None
    store = Store(cfg.state_dir)
    try:
        store.open(inherited.get("lock"))
    except StateError as exc:
        raise ConfigError(f"refusing to start: {exc}") from None
    allowed = housekeeping.allowed_cpus()
    machine, lines = discovery.discover(allowed_cpus=allowed)
    for line in lines:
        log.info("%s", line)
    cfg.mask_gpus = _gpu_masking(cfg, machine)
    limits = resources.Limits(reserve_cpu=cfg.reserve_cpu, reserve_mem=cfg.reserve_mem,
                              min_job_mem=cfg.min_job_mem, per_node_memory=cfg.cgroups,
                              whole_cores=cfg.cpu_unit == "core")
    log.info("%s", resources.describe_unit(machine, limits))
    limits = _housekeeping(cfg, machine, limits, allowed)
    listener = _listen(cfg.socket, inherited.get("listen"))
    hooks = Hooks()   # first: the engine and the server are each built whole around them
    engine = Engine(cfg, store, machine, limits, dev, hooks)
    server = Server(cfg, listener, engine, hooks)
    if cfg.metrics_file:
        server.metrics = metrics_file.MetricsFile(cfg.metrics_file, engine, tally, cfg.metrics_gid)
    server.start()
    try:
        notes = engine.recover()
    except StateError as exc:
        raise ConfigError(f"refusing to start: {exc}") from None
    for note in notes:
        log.info("%s", note)
    launcher.start_fork_server()
    engine.schedule(time.time())
    engine.end_turn(time.time())   # the recovered state, journalled afresh, and any starts
    mode = ("cgroups v2: jobs confined to their CPUs and NUMA nodes, memory budgeted per NUMA node"
            if cfg.cgroups else
            "--no-cgroups: CPU affinity only, no memory limit, one machine-wide memory pool")
    log.info("hpc-batchd %s ready on %s as %s (%s mode); %s; schedule %s", __version__, cfg.socket,
             cfg.user_name, "root" if root else "user", mode, cfg.schedule)
    return server, store


class _Escaping(logging.Formatter):
    """One log line per record whatever it quotes: a user's command cannot forge a line."""

    def formatMessage(self, record) -> str:
        return one_line(super().formatMessage(record))


def _last_turn(server) -> None:
    """Let the fork server go and commit everything, before an exit, a re-exec or a reload's hand-off."""
    launcher.stop_fork_server()   # the shepherds it forked are not its children: they run on
    server.engine.save_meta()
    server.engine.end_turn(time.time())


def _reload(server, store) -> NoReturn:
    """Re-exec this pid as the binary and flags installed now; a forked child answers meanwhile."""
    forked = None
    if server.quiesce_archive():   # no thread may hold a lock across a fork
        forked = handoff.fork()
    else:
        log.warning("reloading without a hand-off (the history archive's writer is still busy): "
                    "clients wait for the new image's start")
    if isinstance(forked, handoff.Child):
        forked.serve_until_released(server, lambda: _last_turn(server))
    sdnotify.reloading()
    exe, new_argv = reload_args.current_argv(parse_args, (ConfigError, SystemExit))
    fds = f"lock:{store.lock_fd},listen:{server.listener.fileno()}"
    tally = None
    if forked is None:
        server.close_clients()
        _last_turn(server)
        tally = server.metrics.tally.to_text() if server.metrics is not None else None
    elif handoff.understood_by(exe):
        fds += "," + forked.inherit()   # the child owns the state now: this image only execs
    else:
        tally = forked.take_over()   # the new image would never ask: the child lets go now
    if tally:
        os.environ[metrics_file.CARRY_ENV] = tally
    log.info("reloading: re-executing %s", " ".join(new_argv))
    os.set_inheritable(store.lock_fd, True)
    os.set_inheritable(server.listener.fileno(), True)
    os.environ[INHERIT_ENV] = fds
    sys.stderr.flush()
    hold_signals()   # the new image's default handlers would die of a SIGHUP before it has its own
    os.execv(exe, new_argv)


def main(argv=None) -> int:
    """Entry point of ``hpc-batchd``."""
    hold_signals()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Escaping("hpc-batchd: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    args = sys.argv[1:] if argv is None else argv
    try:
        cfg = parse_args(args)
    except ConfigError as exc:
        print(f"hpc-batchd: {exc}", file=sys.stderr)
        if exc.status == 2:
            print("usage: hpc-batchd [options]; see hpc-batchd --help", file=sys.stderr)
        return exc.status
    inherited = _inherited()
    old_image = inherited.pop("child", None)
    _no_strays(set(inherited.values()))
    if "handoff" in inherited and old_image is not None:
        tally = handoff.take_over(inherited.pop("handoff"), old_image)
        if tally:
            os.environ[metrics_file.CARRY_ENV] = tally
    try:
        server, store = build(cfg, inherited)
    except ConfigError as exc:
        log.error("%s", exc)
        return exc.status
    sdnotify.ready()
    if server.run() == "reload":
        _reload(server, store)
    server.close_clients()
    server.engine.finished.archive.stop()   # what it has not written yet is handed to it again at the next start
    sdnotify.stopping()
    _last_turn(server)
    try:
        os.unlink(cfg.socket)
    except OSError:
        pass
    log.info("stopped; running jobs continue under their shepherds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
