"""Per-job inspection entries: ``<dev-dir>/jobs/<id>`` -> the job's directory.

The entry (a symlink) has the admin group as group owner, and belongs to
root unless ``--list-is-public``, when it belongs to the submitting user (as
the spec has it, so ``ls -l`` shows whose it is). Nothing reads a symlink's
owner (Linux ignores a symlink's own permissions, and ``jobs/`` is not a
sticky world-writable directory, where ``protected_symlinks`` would), so
with listing private an id probed by another user says nothing of whose
job it is. The files it exposes (``info.json``, ``output``) stay root's
(group admin, 0640) with an ACL letting the user read them: the user and
admins can read them, nobody else can, and the user cannot lease, chmod or
truncate what the daemon itself reads. ``jobs/`` is 0711, so no one lists
other users' job ids, unless ``--list-is-public`` (0755). Entries exist
while a job is queued or running.
"""

import json
import os

from shepherd.base import acl, records


class DevDirError(OSError):
    """--dev-dir cannot be created or used."""


class DevDir:
    """The ``--dev-dir`` tree, or a no-op when disabled (--no-dev-dir)."""

    def __init__(self, root: str | None, admin_gid: int, public: bool = False):
        self.root = root
        self.jobs = os.path.join(root, "jobs") if root else None
        self.admin_gid = admin_gid
        self.public = public
        self.jobs_mode = 0o755 if public else 0o711

    def setup(self) -> None:
        """Create ``<root>/jobs``; raise DevDirError if that is impossible."""
        if not self.root:
            return
        assert self.jobs is not None  # set whenever root is
        try:
            os.makedirs(self.jobs, mode=self.jobs_mode, exist_ok=True)
            for d, mode in ((self.root, 0o755), (self.jobs, self.jobs_mode)):
                if os.path.islink(d) or not os.path.isdir(d):
                    raise DevDirError(f"{d} is not a directory")
                os.chmod(d, mode)
        except DevDirError:
            raise
        except OSError as exc:
            raise DevDirError(f"cannot create --dev-dir {self.root}: {exc.strerror}") from None

    def add(self, job_id: int, uid: int, target: str) -> None:
        """Create (or replace) the entry for a job."""
        if not self.jobs:
            return
        link = os.path.join(self.jobs, str(job_id))
        try:
            try:
                os.unlink(link)
            except FileNotFoundError:
                pass
            os.symlink(target, link)
            if os.geteuid() == 0:
                os.lchown(link, uid if self.public else 0, self.admin_gid)
        except OSError:
            pass  # inspection is a convenience; a job never fails over it

    def remove(self, job_id: int) -> None:
        """Drop a job's entry."""
        if not self.jobs:
            return
        try:
            os.unlink(os.path.join(self.jobs, str(job_id)))
        except OSError:
            pass

    def prune(self, keep) -> None:
        """Remove entries of jobs not in *keep* (left over from a crash)."""
        if not self.jobs:
            return
        for name in os.listdir(self.jobs):
            if name.isdigit() and int(name) not in keep:
                self.remove(int(name))


def write_user_file(path: str, data: bytes, uid: int, gid: int) -> None:
    """Replace a root-owned file the job's owner and the admin group may read."""
    records.write_atomic(path, data, 0o640, durable=False, prepare=lambda fd: acl.share_with(fd, uid, gid))


def write_info(job_dir: str, info: dict, uid: int, gid: int) -> None:
    """(Re)write ``info.json``: metadata only, never the environment."""
    write_user_file(os.path.join(job_dir, records.INFO), json.dumps(info, indent=1).encode(), uid, gid)


def create_output(job_dir: str, uid: int, gid: int) -> None:
    """Create the empty output buffer so attach and the dev entry see it from submit on."""
    path = os.path.join(job_dir, records.OUTPUT)
    if not os.path.exists(path):
        write_user_file(path, b"", uid, gid)
