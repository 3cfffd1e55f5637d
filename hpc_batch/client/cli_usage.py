"""The text of every ``dispatch`` usage (docopt reads the Usage and Options sections).

The exit statuses are written out here and checked against ``messages.REFUSALS``
and ``jobs.WAIT_STATUS`` by tests/unit/test_doc_facts.py (importing the job record
here would cost every ``dispatch`` start).
"""

from ..defaults import SOCKET, SOCKET_ENV, STATUS_INTERVAL, STATUS_INTERVAL_RANGE

USAGE = f"""dispatch: submit and manage hpc-batch jobs.

Usage:
  dispatch new [options] [--] <command>...
  dispatch new [options] --commands FILE
  dispatch list [--all] [--finished] [--json] [--format COLS] [--no-header] [<job>...]
  dispatch attach <job>
  dispatch log [-f] <job>
  dispatch kill <job>...
  dispatch wait [--json] <job>...
  dispatch show [--json] [--record] <job>
  dispatch record diff [--json] <a> <b>
  dispatch status [--json | --map]
  dispatch status --watch [--interval SECONDS]
  dispatch history [options] [<job>...]
  dispatch report [options] [<job>...]
  dispatch job <job> max-time (get | set <duration> | add <duration>)
  dispatch (-h | --help)
  dispatch --version

Commands:
  new      Queue a job; everything after "--" is its command line.
  list     Show queued and running jobs (--finished: recent ones too).
  attach   Follow a running job's output.
  log      A job's output so far (-f: and as it comes, until it ends).
  kill     Kill a running job, or cancel a queued one.
  wait     Wait for jobs to end; exit with how they ended.
  show     Everything about one job (--record: its reproducibility record).
  record   Compare two jobs' records: dispatch record diff A B.
  status   The machine at a glance: CPUs, memory and GPUs per NUMA node, the queue,
           and on a terminal a map of which job holds each CPU and GPU.
  history  Your finished jobs, as far back as the daemon keeps them.
  report   A series of runs side by side: times, verdicts, spread, a plot.
  job      Read a job's max time; admins can set it or add to it.

A <job> is its id, or the --name it was given (your newest job of that name,
admins too), or USER:NAME for another user's (admins), or an array element
as ARRAY_INDEX (6_3: the element of array 6 with index 3; an array's id is its
first job's); list, show, kill and wait also take a whole array, ARRAY_* (6_*),
and list, kill and wait a range of ids, FIRST-LAST (a bulk submit's).
Run 'dispatch <command> --help' for a command's options. The daemon's socket
is ${SOCKET_ENV}, or {SOCKET}.

Exit status: 0 success; 1 refused (the message says why); 2 usage; 3 no such
job; 4 not yours (or admins only); 5 invalid request; 6 can never fit here;
7 too many queued jobs; 8 job too large; 9 the daemon is busy, try again; 10
the job has already ended; 66 a record cannot be read (record diff); 69 the
daemon is unreachable; 70 a bug in the daemon. dispatch wait (and new --wait) exit with the job's own exit code,
128+N for a job killed by signal N, or 240 killed, 241 timeout, 242 oom,
243 error, 244 cancelled, 245 dependency-failed, 246 lost.
"""

NEW_USAGE = """Queue a job. Everything after "--" is its command line; leading NAME=VALUE
words become its environment, as env(1) reads them.

Bulk: with --array the command runs once per index, each its own job with
HPC_BATCH_ARRAY_INDEX set (and HPC_BATCH_ARRAY_JOB_ID, the first job's id);
with --commands FILE each line of FILE (or of stdin, for "-") is its own job,
run by /bin/sh (HPC_BATCH_ARRAY_INDEX is its number, from 1). Either is one
request; the jobs get consecutive ids, which list, kill and wait take as a
range (FIRST-LAST). The first id is the array's: 6_3 names its element with
index 3 and 6_* all of it, in list, show, kill and wait. Every other option
applies to each job.

Usage:
  dispatch new [options] [--] <command>...
  dispatch new [options] --commands FILE
  dispatch new (-h | --help)

Options:
  --cpu N           CPUs, all from one NUMA node (default 1; with --exclusive, all),
                    rounded up to whole cores: the job gets every thread of
                    its cores and shares none with another job (unless the
                    daemon runs with --cpu-unit thread).
  --gpu-cores N     GPUs; the job sees them in CUDA_VISIBLE_DEVICES [default: 0].
  --gpu-link CLASS  Wait for GPUs linked at worst by CLASS: NV for any NVLink,
                    NV4 for 4 NVLinks or more, PIX, PXB, PHB, NODE or SYS.
  --max-mem GB      Hard memory budget in GiB, or with a unit K, M, G or T
                    (512M, 64G; KB and KiB mean K: powers of 2), at least 16M.
                    Default: the share of a NUMA node the CPUs it holds represent.
  --max-time D      Kill the job after this long: 3600, 45m, 2h, 1h30m, 1d.
                    Default and ceiling: the daemon's --max-lifetime.
  --exclusive       Run alone on the machine (waits until it is idle).
  --numa-local      Both of the next two.
  --numa-local-mem  Wait for one NUMA node that fits the whole budget rather
                    than spreading it over nodes.
  --numa-local-gpu  Take CPUs only on the NUMA node the job's GPUs hang off.
  --benchmark MODE  Benchmark mode: warn (what a bare --benchmark means) or
                    strict. The job's --cpu N counts physical cores: its
                    cpuset holds ONE thread of each, and their other threads
                    are held idle (no job runs there). Cores touching the
                    daemon's housekeeping CPUs are never given. Memory stays
                    on the job's NUMA node (as with --numa-local-mem) and
                    swap is off. warn runs the job on what is free and
                    records every way the machine fell short (show lists
                    them); strict waits instead: for cores whose every
                    thread can be held, and while the machine swaps or a
                    thermal throttle counter rises.
  --whole-l3        With --benchmark: hold every CPU sharing a last-level
                    cache (L3) with the job's, so no other job runs there;
                    strict waits for caches no other job uses.
  --aslr MODE       off: run the job without address space randomisation
                    (personality ADDR_NO_RANDOMIZE) [default: on].
  --thp MODE        off: no transparent huge pages for the job
                    (prctl PR_SET_THP_DISABLE) [default: on].
  --record PATH     Also write the job's reproducibility record (what it ran
                    on, and whether the machine stayed quiet) to PATH, as
                    you, when it ends: a file, or a directory for
                    record.<id>.json in it. dispatch show --record has it
                    either way.
  --record-env      Put the environment's values in the record (by default
                    only its keys and digest: values can hold secrets).
  --notify FORMS    Tell you when the job ends: tty (a line on each terminal
                    you are logged in on, as write(1) does; not with mesg n),
                    cmd (run --notify-command), or tty,cmd.
  --notify-command CMD
                    Run CMD (by /bin/sh, as you, in this directory) when the
                    job ends, with HPC_BATCH_JOB_ID, _NAME, _RESULT, _EXIT,
                    _CODE, _OUTPUT and _WALL set; killed after 30s, output
                    discarded. Implies --notify cmd.
  --env             Forward this environment instead of a clean one.
  --output PATH     Directory or file for the log [default: ./output.<id>.log].
  --no-output       Discard the output when the job ends.
  --name NAME       A name to list it by and to use in kill, wait and show.
  --after JOBS      Start only once these jobs (ids or names, comma-separated)
                    have ended, however they ended.
  --after-ok JOBS   Start only if these jobs all exit 0; otherwise end as
                    dependency-failed, saying which did not. One that has
                    already ended otherwise is refused at submit (exit 10).
  --array SPEC      One job per index: 1-100, 0-98:2 (every 2nd), 1,4,9;
                    append %N to run at most N of them at once (1-1000%8).
  --commands FILE   One job per line of FILE, or of stdin if FILE is "-", each
                    run by /bin/sh; blank lines and # comment lines are skipped.
  --wait            Wait for the job (all of them) to end, and exit as
                    dispatch wait does.
  --parsable        Print only the job's id, for scripts (as sbatch --parsable);
                    a bulk's as FIRST-LAST, which list, kill and wait take.
  --json            Print one JSON document instead of the summary line.
  -h --help         Show this help.
"""

LIST_USAGE = """List jobs. On a terminal, a table: a header, aligned columns, the command cut
to the terminal's width (--format picks the columns).

Piped, each job is one line of words (the format scripts read, unchanged):
<username> <id> <command> <start> <uptime> <max-time> <mem> <exclusive> <cpus> <gpus>,
the command preceded by [name] when the job has one; with --finished also, for
jobs that ran, cpu <time> peak <memory> [verdict], then <state> <exit> [(note)].

With jobs named (ids, names, FIRST-LAST ranges, array elements 6_3 or whole
arrays 6_*), only those; one that is
not listed gets a line on stderr saying why (no such job, exit 3; ended,
without --finished, exit 10; another user's, without --all, exit 4).

Usage:
  dispatch list [--all] [--finished] [--json] [--format COLS] [--no-header] [<job>...]
  dispatch list (-h | --help)

Options:
  --all        Every user's jobs (admins, or everyone with --list-is-public).
  --finished   Include recently finished jobs and their exit status.
  --json       One JSON document: {"jobs": [...]} (field names in docs/json.md).
  -o COLS, --format COLS  The table's columns, comma-separated, in any mode (a pipe
               too): user, id, array, name, command, start, uptime, max-time,
               mem, exclusive, cpus, gpus, cpu, peak, verdict, state, exit, note.
  --no-header  The table without its header line, also when piped.
  -h --help    Show this help.
"""

ATTACH_USAGE = """Follow a job's output until it ends, then print its final state. A job that
has already ended: what attach had not shown of its output (from the log it
was delivered to, or the buffer the daemon kept when delivery failed).

Usage:
  dispatch attach <job>
  dispatch attach (-h | --help)

Options:
  -h --help    Show this help.
"""

LOG_USAGE = """Print a job's output so far, and exit 0. The output goes to stdout; a line
about the job to stderr: that it has no output yet (queued or waiting), or,
for a finished job, how it ended and where its output is (its log file's
path; or, when delivery failed, the buffer the daemon kept, which is printed).

With -f, follow it as tail -f does: what is there, then the output as it
comes, until the job ends (a queued job: until it starts, then so on). Ends
with the job's end line on stderr and the exit status dispatch wait gives:
the job's own exit code, 128+N for a signal, or 240 killed, 241 timeout,
242 oom, 243 error, 244 cancelled, 245 dependency-failed, 246 lost.
Ctrl-C stops following (exit 130); the job keeps running.

Usage:
  dispatch log [-f] <job>
  dispatch log (-h | --help)

Options:
  -f --follow  Follow the output until the job ends.
  -h --help    Show this help.
"""

KILL_USAGE = """Kill a running job (state killed) or cancel a queued or waiting one (cancelled).
A FIRST-LAST range (a bulk submit's ids) or a whole array, 6_*, kills each of
them; jobs in it that have already ended are skipped. 6_3 is one element.

Usage:
  dispatch kill <job>...
  dispatch kill (-h | --help)

Options:
  -h --help    Show this help.
"""

WAIT_USAGE = """Wait until the jobs have ended. Exits with the job's exit code (for several
jobs, the first in the order given that did not exit 0), 128+N for a signal,
or 240 killed, 241 timeout, 242 oom, 243 error, 244 cancelled, 245
dependency-failed, 246 lost. Survives a daemon reload or restart.

A FIRST-LAST range stands for each job in it (a bulk submit's ids), a whole
array (6_*) for each of its elements, and 6_3 for one element.

Usage:
  dispatch wait [--json] <job>...
  dispatch wait (-h | --help)

Options:
  --json       One JSON document: {"jobs": [...], "exit": N}.
  -h --help    Show this help.
"""

SHOW_USAGE = """Everything about one job: command, user, name, state, why it waits and its
place in the queue, CPUs, NUMA nodes, GPUs, memory budget, max time and
deadline, cgroup, output, start and end, result, CPU time and peak memory;
for a --benchmark job the CPUs it holds idle and every way the machine fell
short; whether ASLR and transparent huge pages were on; for an array's
element, its ARRAY_INDEX (6_3), the array's size and its %N cap.

A whole array, ARRAY_* (6_*): its ids, size, %N cap and how many of its
jobs are in each state (list 6_* lists them).

With --record, the job's reproducibility record instead: the machine, kernel,
CPU, frequency, memory, allocation, GPUs and software it ran with, what
happened on its CPUs while it ran, and the verdict (clean, noisy or
unknown). See docs/record.md.

Usage:
  dispatch show [--json] [--record] <job>
  dispatch show (-h | --help)

Options:
  --json       One JSON document (field names in docs/json.md).
  --record     The job's reproducibility record (partial while it runs).
  -h --help    Show this help.
"""

RECORD_USAGE = """Compare two reproducibility records and print only what differs, section by
section: can the two jobs' numbers be compared? A and B are job ids or
names (their records are asked of the daemon) or record files (written by
dispatch new --record, or saved from dispatch show --record --json): a file
is a path with a '/' or ending in .json (./5 for a file named 5; a bare 5 is
job 5, whatever the current directory holds).
Exits 0 when the setups match, 1 when they differ, 66 when a record cannot
be read (a missing file, one that is not a record, a job with none), 3 or 4
for a job that is not found or not yours.

Usage:
  dispatch record diff [--json] <a> <b>
  dispatch record (-h | --help)

Options:
  --json       One JSON document: {"comparable": ..., "differences": [...]}.
  -h --help    Show this help.
"""

STATUS_USAGE = f"""The machine at a glance: per NUMA node the CPUs, memory and GPUs total /
reserved / in use / free; the policy; how many jobs run, queue and wait; the
head of the queue and why it waits. On a terminal, labelled and followed by the
machine map: each NUMA node, its last-level cache groups, their cores and
threads, each CPU with the job holding it (ID USER; busy for another user's
job you may not see), reserved, held idle for a benchmark job (~) or
housekeeping (H); then each GPU and its job. Piped, the plain lines scripts
read, unless --map. Colour only on a terminal, never with NO_COLOR set.

Usage:
  dispatch status [--json | --map]
  dispatch status --watch [--interval SECONDS]
  dispatch status (-h | --help)

Options:
  --json                One JSON document (field names in docs/json.md).
  --map                 The labelled view and the machine map, even when piped.
  --watch               Redraw the view in place, like watch(1); q or Ctrl-C quits.
  --interval SECONDS    Seconds between --watch redraws, {STATUS_INTERVAL_RANGE[0]:g} to {STATUS_INTERVAL_RANGE[1]:g}
                        [default: {STATUS_INTERVAL}].
  -h --help             Show this help.
"""

HISTORY_USAGE = """Your finished jobs, newest last, from the history the daemon keeps (for as long
as the admin's hpc-batchd --history-days and --history-per-user say; dispatch
list --finished shows only the most recent). Columns: id, name, array element (FIRST_INDEX), end time, wall
time, CPU time, exit, verdict, command. dispatch show, show --record and
record diff work on every job listed here.

With jobs named (ids or FIRST-LAST ranges), only those.

Usage:
  dispatch history [options] [<job>...]
  dispatch history (-h | --help)

Options:
  --name NAME       Jobs of this --name.
  --array ID        The jobs of the bulk submit whose first job is ID.
  --state RESULT    Jobs that ended so: exited, signalled, killed, timeout, oom,
                    error, cancelled, dependency-failed, lost; or failed
                    (anything but an exit 0).
  --verdict V       Jobs whose record says clean, noisy or unknown; none: no record.
  --since TIME      Jobs that ended at or after TIME: 2026-12-01, 2026-12-01T09:30,
                    or a duration ago (7d, 12h).
  --until TIME      Jobs that ended before TIME (same forms).
  --setup DIGEST    Jobs whose setup digest is DIGEST (sha256:..., or its first 8+
                    hex digits): runs that compare.
  --limit N         At most the newest N jobs [default: 100].
  --user USER       Another user's jobs (admins).
  --all             Every user's jobs (admins).
  --json            One JSON document: {"jobs": [...]} (fields in docs/json.md).
  -h --help         Show this help.
"""

REPORT_USAGE = """A series of runs side by side: one row per run (id, start, wall time, CPU time,
the verdict and its first cause, * where the setup differs from the first
run's), then the spread of all runs and of the clean ones apart (n, median,
IQR, min, max, coefficient of variation), the outliers (median +- 3 MAD),
whether the runs compare (their setup digests), how many were noisy and why,
and a plot: one mark per run, in order, o clean, x noisy, ? unknown.

Select the runs from your history: by ids or FIRST-LAST ranges, or with
the options --name, --array or --setup (together: all must hold).

Usage:
  dispatch report [options] [<job>...]
  dispatch report (-h | --help)

Options:
  --name NAME       Runs of this --name.
  --array ID        The runs of the bulk submit whose first job is ID.
  --setup DIGEST    Runs with this setup digest (sha256:..., or 8+ hex digits).
  --since TIME      Runs that ended at or after TIME (2026-12-01, or 7d ago).
  --until TIME      Runs that ended before TIME.
  --metric NAME     Summarise the job's own figure NAME (the lines it wrote to
                    $HPC_BATCH_METRICS_FILE) instead of wall time.
  --plot FILE       Also draw the series into FILE, an SVG image.
  --no-plot         No plot on the terminal.
  --limit N         At most the newest N runs [default: 1000].
  --user USER       Another user's runs (admins).
  --json            One JSON document (fields in docs/json.md).
  -h --help         Show this help.
"""

JOB_USAGE = """Read a job's max time, or (admins only) change it: set a new one, or add to it.
A running job's deadline moves with it (counted from when it started).

Usage:
  dispatch job <job> max-time get
  dispatch job <job> max-time set <duration>
  dispatch job <job> max-time add <duration>
  dispatch job (-h | --help)

Options:
  -h --help    Show this help.
"""

SUBCOMMANDS = {"new": NEW_USAGE, "list": LIST_USAGE, "attach": ATTACH_USAGE, "log": LOG_USAGE, "kill": KILL_USAGE,
               "wait": WAIT_USAGE, "show": SHOW_USAGE, "record": RECORD_USAGE, "status": STATUS_USAGE,
               "history": HISTORY_USAGE, "report": REPORT_USAGE, "job": JOB_USAGE}
