"""One definition of every default the client, daemon and shepherd share.

Everything that names a path, a flag default or a limit reads it from here,
so the CLI's help text, the daemon's argument parser and the docs (docs/admin.md, the man pages) agree.
"""

SOCKET = "/run/hpc-batch/hpc-batch.sock"
STATE_DIR = "/var/lib/hpc-batch"
DEV_DIR = "/dev/hpc-batch"
CGROUP_ROOT = "/sys/fs/cgroup/hpc-batch"
SOCKET_ENV = "HPC_BATCH_SOCKET"

MAX_LIFETIME = "1d"
RESERVE_CPU = 2
RESERVE_MEM_GB = 2
MIN_JOB_MEM_GB = 2
KEEP_FINISHED = 50
ADMIN_GROUP = "wheel"
SCHEDULE = "fifo-strict"
# The unit --cpu and --reserve-cpu are handed out in: "core" (every thread of whole physical
# cores, so no two jobs share a core) or "thread" (single threads, packed as before).
CPU_UNIT = "core"
CPU_UNITS = ("core", "thread")
# What a benchmark job's start does to the CPU frequency of its CPUs: "record" reads and records
# it, "enforce" also sets governor performance and minimum = maximum frequency (undone at its end).
CPUFREQ = "record"
CPUFREQ_POLICIES = ("record", "enforce")
# --records: which jobs get a reproducibility record (shepherd/record/).
RECORDS = "all"
RECORDS_MODES = ("all", "none")
# CPUs for the daemon, its shepherds and steered interrupts, never given to benchmark jobs:
# "auto" (the --reserve-cpu CPUs, else the lowest CPU's core), "none", or a CPU list.
HOUSEKEEPING_CPUS = "auto"

# Per-user bounds (daemon flags): nothing one user does may exhaust the daemon.
MAX_QUEUED_PER_USER = 1000
MAX_JOB_SIZE = "1M"          # a job's command plus its --env, as the user sent them
MAX_CONNECTIONS_PER_USER = 64
MAX_REPLY_BYTES_PER_USER = "32M"   # reply bytes one user's connections may leave unread in the daemon
MAX_PIDS = 8192              # pids.max of each job's cgroup (0: no limit)
MAX_OUTPUT_BUFFER = "256M"   # output kept in the state dir for attach; the rest goes straight to the log
HISTORY_PER_USER = "64M"     # one user's finished jobs and their records in the history archive (compressed)
HISTORY_DAYS = 365           # days a finished job stays in the history archive
UNDELIVERED_MAX = "4G"       # all of <state-dir>/undelivered/ (outputs whose delivery failed)
UNDELIVERED_PER_USER = "1G"  # one user's share of it
UNDELIVERED_MAX_AGE = "30d"  # an undelivered output older than this is dropped
UNDELIVERED_MAX_FILES = 10000  # files in undelivered/ at most (not a flag: the bytes are the bound that matters)
METRICS_GROUP = ""           # group that reads --metrics-file (0640); empty: the metrics directory's group
# Free space the state filesystem keeps, beyond the journal's own size, before submits are refused:
# room for the records, exit records and history of the jobs already taken to end, and for compaction.
STATE_RESERVE = "64M"

# Seconds between two readings of the swap and throttle counters while a --benchmark=strict job
# waits: "rising" means they rose between two readings this far apart.
BENCH_PROBE_INTERVAL = 1.0

# The shepherd's own limits (the grace between SIGTERM and SIGKILL, the time a delivery may
# take, how long a fork that fails for want of pids is retried) are the launch spec's
# defaults: shepherd/base/records.py's LaunchSpec, since the shepherd cannot import this package.
# A job its shepherd could not fork goes back to the queue, retried every START_RETRY seconds.
START_RETRY = 2.0

# dispatch status --watch: seconds between redraws (watch(1)'s default), and the range --interval takes
# (a floor, so a roomful of watchers does not keep the root daemon busy).
STATUS_INTERVAL = "2"
STATUS_INTERVAL_RANGE = (0.5, 3600.0)

# Seconds a recovering daemon waits before it decides an unstarted shepherd never ran.
SHEPHERD_START_GRACE = 2.0

# Admin groups, in order of preference: the installer picks the first that
# exists, and the daemon suggests those that do when --admin-group names none.
ADMIN_GROUP_CANDIDATES = ("wheel", "sudo", "adm")

# The PATH of the clean environment a job gets without --env (the rest: launchspec.environment).
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

# sysexits.h EX_CONFIG: refusal to start half-configured.
EX_CONFIG = 78
