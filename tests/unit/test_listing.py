"""dispatch list formatting (pure)."""

import time

import pytest

from hpc_batch.client.listing import format_mem, format_row, format_start, one_line

NOW = time.mktime((2026, 11, 30, 15, 0, 0, 0, 0, -1))


def job(**kw):
    base = {"id": 7, "user": "alice", "command": "sleep 30", "state": "running", "started": NOW - 65,
            "ended": None, "max_time": 5400, "mem": 32 << 30, "spread": False, "exclusive": False,
            "exit": None, "result": None, "mem_assigned": True, "output_error": None}
    base.update(kw)
    return base


@pytest.mark.parametrize("n,text", [(32 << 30, "32G"), (3 << 29, "1.5G"), (512 << 20, "512M"), (3 << 19, "2M"),
                                    (None, "-")])
def test_format_mem(n, text):
    assert format_mem(n) == text


def test_running_row():
    assert format_row(job(), NOW, False) == "alice 7 sleep 30 14:58:55 0:01:05 1h30m 32G no - -"


def test_queued_row_and_spread_and_exclusive():
    row = format_row(job(state="queued", started=None, spread=True, exclusive=True), NOW, False)
    assert row == "alice 7 sleep 30 - queued 1h30m 32G+ yes - -"


def test_finished_rows():
    done = job(state="finished", ended=NOW - 5, exit="3", result={"kind": "exited", "code": 3})
    assert format_row(done, NOW, True).endswith(" 0:01:00 1h30m 32G no - - finished 3")
    done["stats"] = {"cpu_time": 12.34, "peak_mem": 210 << 20}
    assert format_row(done, NOW, True).endswith(" no - - cpu 12.3s peak 210M finished 3")
    oom = job(state="finished", ended=NOW, exit="oom", result={"kind": "oom"}, mem_assigned=False)
    assert "finished oom (budget requested with --max-mem was 32G)" in format_row(oom, NOW, True)
    oom["mem_assigned"] = True
    assert "assigned by default" in format_row(oom, NOW, True)


@pytest.mark.parametrize("label,column", [(None, "-"), ("2", "2"), ("2:NV12", "2:NV12"), ("4:SYS!", "4:SYS!")])
def test_gpu_column(label, column):
    assert format_row(job(gpu_label=label), NOW, False).split()[-1] == column


@pytest.mark.parametrize("fields,column", [
    ({}, "-"),                                                                  # queued: holds nothing yet
    ({"cpus": [2, 3], "held_cpus": [2, 3], "cores": [[2], [3]]}, "2/2c"),      # one thread per core
    ({"cpus": [1, 5, 2, 6], "held_cpus": [1, 2, 5, 6], "cores": [[1, 5], [2, 6]]}, "4/2c"),   # both threads of 2
    ({"cpus": [0, 1]}, "2/2c"),                                                 # a record without cores
])
def test_cpu_column(fields, column):
    assert format_row(job(**fields), NOW, False).split()[-2] == column


def test_show_names_the_cores_and_their_threads():
    from hpc_batch.client.listing import format_show
    lines = format_show(job(cpus=[1, 2, 41, 42], cores=[[1, 41], [2, 42]]), NOW)
    assert "cpus: 1,2,41,42" in lines and "cores: 2 (1+41,2+42; 2 threads each)" in lines
    hybrid = format_show(job(cpus=[0, 1, 16], cores=[[0, 1], [16]]), NOW)
    assert "cores: 2 (0+1,16; 1/2 threads each)" in hybrid


@pytest.mark.parametrize("text", ["line\nhpc-batchd: forged", "\x1b[2Jclear", "rtl\u202eevil", "bad\udcffbyte",
                                  "bell\a"])
def test_control_and_format_characters_are_escaped(text):
    out = one_line(text)
    assert out.isprintable() and "\\" in out


def test_old_start_shows_date():
    assert format_start(NOW - 3 * 86400, NOW) == "2026-11-27 15:00"


def test_multiline_command_stays_on_one_row():
    row = format_row(job(command="python3 -c 'a = 1\nb\t= 2'"), NOW, False)
    assert "\n" not in row and "\\n" in row and "\\t" in row
    assert one_line("plain") == "plain"


def test_waiting_and_named_rows():
    row = format_row(job(state="waiting", started=None, name="prep"), NOW, False)
    assert row == "alice 7 [prep]sleep 30 - waiting 1h30m 32G no - -"
    gone = job(state="finished", started=None, exit="cancelled", result={"kind": "cancelled", "note": "by alice"})
    assert format_row(gone, NOW, True).endswith(" - - 1h30m 32G no - - finished cancelled (by alice)")


def test_show_lines():
    from hpc_batch.client.listing import format_show
    shown = job(state="queued", started=None, position=2, why="behind job 6", cwd="/home/alice", cpus=None,
                after=[3], after_ok=True)
    lines = format_show(shown, NOW)
    assert "state: queued" in lines and "place in queue: 2" in lines and "waiting because: behind job 6" in lines
    assert "after: 3 (only if they exit 0)" in lines and "memory budget: 32G (assigned by default)" in lines
    assert not any(line.startswith("started:") for line in lines)
