"""bench/benchkit/cpushare.py: the CPU a drained job costs, read from /proc, and by whom.

The fixtures are /proc files in the kernel's own layout (proc(5)): /proc/stat as this 2-CPU
development host wrote it (2026-12-07), with its counters changed, and /proc/PID/stat lines of
the forms the kernel writes, one with a command name holding spaces and parentheses.
"""

import pytest

from bench.benchkit import cpushare

STAT = """\
cpu  {u} 20 {s} 5000 30 {irq} {soft} 7 0 0
cpu0 {u0} 10 {s0} 2500 15 {irq} {soft} 4 0 0
cpu1 {u1} 10 {s1} 2500 15 0 0 3 0 0
intr 123456 0 9 0 0
ctxt 987654
btime 1765090000
processes 4242
procs_running 1
procs_blocked 0
softirq 55 0 1 2 3 4 5 6 7 8 9
"""


def stat(u0, s0, u1, s1, irq=0, soft=0):
    return STAT.format(u=u0 + u1, s=s0 + s1, u0=u0, s0=s0, u1=u1, s1=s1, irq=irq, soft=soft)


def task(comm, utime, stime, cutime=0, cstime=0):
    """A /proc/PID/stat line: pid (comm) state, then fields 4 to 52."""
    fields = ["S", "1", "1", "1", "0", "-1", "4194560", "100", "0", "0", "0",
              str(utime), str(stime), str(cutime), str(cstime), "20", "0", "3", "0", "5000"] + ["0"] * 32
    return f"4242 ({comm}) " + " ".join(fields) + "\n"


def test_busy_ticks_add_user_nice_system_irq_and_softirq_of_each_cpu_line_only():
    got = cpushare.busy_ticks(stat(100, 40, 60, 20, irq=3, soft=2))
    assert got == {"cpu": 160 + 20 + 60 + 3 + 2, "cpu0": 100 + 10 + 40 + 3 + 2, "cpu1": 60 + 10 + 20}


def test_task_ticks_skip_a_command_name_with_spaces_and_parentheses():
    assert cpushare.task_ticks(task("hpc-batchd", 11, 22, 33, 44)) == (11, 22, 33, 44)
    assert cpushare.task_ticks(task("a) b (c) d", 5, 6, 7, 8)) == (5, 6, 7, 8)


def _tree(root, machine, daemon=None, main=None, server=None):
    (root / "stat").write_text(machine)
    if daemon is not None:
        (root / "10" / "task" / "10").mkdir(parents=True, exist_ok=True)
        (root / "10" / "stat").write_text(daemon)
        (root / "10" / "task" / "10" / "stat").write_text(main)
    if server is not None:
        (root / "11").mkdir(exist_ok=True)
        (root / "11" / "stat").write_text(server)


def test_a_drain_is_shared_out_by_part_and_the_rest_is_everything_else(tmp_path):
    ticks = 1 / cpushare.TICK    # ticks in a second
    _tree(tmp_path, stat(0, 0, 0, 0), task("hpc-batchd", 100, 50), task("hpc-batchd", 60, 30),
          task("python3", 5, 5, 1000, 500))
    before = cpushare.read(10, 11, proc=str(tmp_path))
    # 100 jobs: the machine busy 2 s (1.5 s of it on cpu0); the daemon 0.5 s, 0.3 of it its main
    # thread; the server 0.02 s itself and 1.2 s in the shepherds it reaped.
    _tree(tmp_path, stat(int(1.0 * ticks), int(0.5 * ticks), int(0.25 * ticks), int(0.25 * ticks)),
          task("hpc-batchd", 100 + int(0.3 * ticks), 50 + int(0.2 * ticks)),
          task("hpc-batchd", 60 + int(0.2 * ticks), 30 + int(0.1 * ticks)),
          task("python3", 5 + int(0.01 * ticks), 5 + int(0.01 * ticks),
               1000 + int(1.0 * ticks), 500 + int(0.2 * ticks)))
    got = cpushare.per_job(before, cpushare.read(10, 11, proc=str(tmp_path)), 100)
    assert got.total == pytest.approx(0.02) and got.busiest == ("cpu0", pytest.approx(0.015))
    assert got.parts == pytest.approx({cpushare.MAIN: 0.003, cpushare.THREADS: 0.002, cpushare.SERVER: 0.0002,
                                       cpushare.SHEPHERDS: 0.012, cpushare.REST: 0.0028})
    text = cpushare.describe([got, got])
    assert text.startswith("CPU a job (median of 2): 20.00 ms busy in all, 15.00 of them on cpu0; ")
    assert "the daemon's main thread 3.00, its other threads 2.00, its fork server 0.20, " \
           "the shepherds and their jobs 12.00, everything else 2.80" in text


def test_without_a_daemon_only_the_machine_is_read_and_said(tmp_path):
    _tree(tmp_path, stat(0, 0, 0, 0))
    before = cpushare.read(proc=str(tmp_path))
    _tree(tmp_path, stat(10, 0, 30, 0))
    got = cpushare.per_job(before, cpushare.read(proc=str(tmp_path)), 2)
    assert got.parts == {} and got.busiest[0] == "cpu1"
    text = cpushare.describe([got])
    assert "on cpu1 (from /proc" in text and "thread" not in text
    assert cpushare.describe([]) == ""


def test_a_daemon_gone_between_the_readings_leaves_its_parts_out(tmp_path):
    _tree(tmp_path, stat(0, 0, 0, 0), task("hpc-batchd", 1, 1), task("hpc-batchd", 1, 1), task("python3", 1, 1))
    before = cpushare.read(10, 11, proc=str(tmp_path))
    (tmp_path / "11" / "stat").unlink()
    got = cpushare.per_job(before, cpushare.read(10, 11, proc=str(tmp_path)), 1)
    assert set(got.parts) == {cpushare.MAIN, cpushare.THREADS, cpushare.REST}
