"""daemon/joboutput.py: a log page's span, and the buffer opened only as a root daemon may open it."""

import os
import threading

import pytest

from hpc_batch.core.jobs import FINISHED, Job, Result, move
from hpc_batch.daemon import joboutput
from hpc_batch.wire.protocol import LOG_PAGE_BYTES


@pytest.mark.parametrize("offset,until,size,page,expected", [
    (0, 10, 10, 4, (4, 4)),        # a first page of three
    (8, 10, 10, 4, (2, None)),     # the last
    (0, 10, 10, 100, (10, None)),  # all in one
    (0, 0, 0, 4, (0, None)),       # nothing yet
    (0, 5, 10, 4, (4, 4)),         # the buffer grew after the first page: only up to until
    (4, 5, 10, 4, (1, None)),
    (4, 10, 6, 4, (2, None)),      # shorter than until: what there is
    (12, 10, 10, 4, (0, None)),    # an offset past the end asks for nothing
])
def test_page_span(offset, until, size, page, expected):
    assert joboutput.page_span(offset, until, size, page) == expected


def test_pages_cover_the_output_once_in_order():
    size, page, offset, seen = 10 * LOG_PAGE_BYTES + 3, LOG_PAGE_BYTES, 0, []
    while True:
        count, more = joboutput.page_span(offset, size, size, page)
        assert count <= page
        seen.append((offset, count))
        if more is None:
            break
        assert more == offset + count
        offset = more
    assert sum(c for _, c in seen) == size and len(seen) == 11


def _job(state: str = "running", output_error: str | None = None) -> Job:
    job = Job(id=7, uid=1000, gid=100, user="alice", argv=["true"], cwd="/tmp", submitted=1.0, max_time=60,
              budget={"mem": 1 << 30}, state="queued", request={}, output="/tmp/output.7.log")
    if state != "queued":
        move(job, "running", 2.0, alloc={"cpus": [0], "mem_by_node": [[0, 1 << 30]], "gpus": [], "exclusive": False})
    if state == FINISHED:
        job.output_error = output_error
        move(job, FINISHED, 3.0, Result("exited", code=0))
    return job


def test_a_running_jobs_page_carries_its_output_and_where_it_ends(tmp_path):
    (tmp_path / "output").write_bytes(b"hello \xff\n")
    page = joboutput.log_page(_job(), str(tmp_path), 0, None, 1 << 20)
    assert page["data"].encode("utf-8", "surrogateescape") == b"hello \xff\n"
    assert (page["offset"], page["until"], page["more"], page["size"], page["end"]) == (8, 8, None, 8, None)
    later = joboutput.log_page(_job(), str(tmp_path), 6, 7, 1 << 20)
    assert (later["data"], later["offset"], later["more"]) == ("\udcff", 7, None)


def test_a_queued_job_has_no_output_and_a_finished_one_its_end(tmp_path):
    page = joboutput.log_page(_job("queued"), str(tmp_path), 0, None, 1 << 20)
    assert (page["data"], page["more"], page["state"], page["end"]) == ("", None, "queued", None)
    (tmp_path / "output").write_text("not read: delivered\n")
    done = joboutput.log_page(_job(FINISHED), str(tmp_path), 0, None, 1 << 20)
    assert done["data"] == "" and done["end"]["output"] == "/tmp/output.7.log" and done["end"]["wait_status"] == 0


def test_a_finished_jobs_kept_buffer_is_read(tmp_path):
    (tmp_path / "output").write_text("kept\n")
    job = _job(FINISHED, output_error="cannot write there; the output is kept at ...")
    assert joboutput.has_kept_buffer(job, str(tmp_path))
    page = joboutput.log_page(job, str(tmp_path), 0, None, 1 << 20)
    assert page["data"] == "kept\n" and page["end"]["output_error"].startswith("cannot write")
    assert not joboutput.has_kept_buffer(_job(FINISHED), str(tmp_path))


def test_open_buffer_refuses_a_link_and_never_blocks_on_a_fifo(tmp_path):
    real = tmp_path / "real"
    real.write_text("x")
    link = tmp_path / "link"
    link.symlink_to(real)
    assert joboutput.open_buffer(str(link)) is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result: list = []
    t = threading.Thread(target=lambda: result.append(joboutput.open_buffer(str(fifo))), daemon=True)
    t.start()
    t.join(timeout=10)
    assert result == [None], "opening a FIFO must neither block nor be accepted"
    assert joboutput.open_buffer(str(tmp_path / "absent")) is None
    fd = joboutput.open_buffer(str(real))
    assert fd is not None
    os.close(fd)


def test_open_buffer_refuses_a_file_that_is_not_the_daemons(tmp_path, monkeypatch):
    other = tmp_path / "output"
    other.write_text("planted")
    # As if the daemon were another user than the file's owner (no root needed to chown it away).
    monkeypatch.setattr(joboutput.os, "geteuid", lambda: other.stat().st_uid + 1)
    assert joboutput.open_buffer(str(other)) is None
