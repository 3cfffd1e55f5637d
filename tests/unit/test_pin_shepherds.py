"""The shepherds' cgroup given no housekeeping CPUs (``--housekeeping-cpus none``) is told so: the
write reaches the file. The system tier's housekeeping loop found shepherds left on the last
daemon's CPUs when an empty list was written as nothing at all (no write(2)); the kernel's side
(an empty cpuset.cpus inherits the parent's) is shown there, in the guest."""

import os

from hpc_batch.daemon import cgroups


def _written(tmp_path, cpus) -> bytes:
    os.makedirs(tmp_path / cgroups.SHEPHERDS, exist_ok=True)
    target = tmp_path / cgroups.SHEPHERDS / "cpuset.cpus"
    os.mkfifo(target)   # stands in for the cgroup file: what is read is what was written
    pid = os.fork()
    if pid == 0:
        try:
            cgroups.pin_shepherds(str(tmp_path), cpus)
        finally:
            os._exit(0)
    with open(target, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return data


def test_no_housekeeping_cpus_is_written_as_a_line_the_kernel_reads_as_empty(tmp_path):
    assert _written(tmp_path, ()) == b"\n"


def test_housekeeping_cpus_are_written_as_a_list(tmp_path):
    assert _written(tmp_path, (2, 3)) == b"2-3"
