"""Files root owns that a job's user may read: the output buffer and info.json.

A file the user owned could be turned against the daemon (a lease stalls
root's open(), a chmod exposes it, a truncate rewrites history), so these
stay root's, group the admin group, mode 0640, and the user is let in by a
POSIX ACL entry. The ACL is written as the kernel's xattr blob
(``linux/posix_acl_xattr.h``: a version word, then tag/perm/id entries in
tag order), which needs no library. Where the filesystem has no ACLs the
file stays root's all the same, and the user reads it through ``dispatch
attach`` only: handing it to the user would bring the lease back.
"""

import errno
import os
import struct

XATTR = "system.posix_acl_access"
_VERSION = 2                      # POSIX_ACL_XATTR_VERSION
_USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_UNDEFINED = 0xFFFFFFFF           # ACL_UNDEFINED_ID
_READ, _WRITE = 4, 2
_ENTRY = struct.Struct("<HHI")
_NO_ACL = (errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP))


def owner_and_reader(uid: int) -> bytes:
    """The ACL blob: the owner reads and writes, *uid*, the group and the mask read, others nothing."""
    entries = ((_USER_OBJ, _READ | _WRITE, _UNDEFINED), (_USER, _READ, uid),
               (_GROUP_OBJ, _READ, _UNDEFINED), (_MASK, _READ, _UNDEFINED), (_OTHER, 0, _UNDEFINED))
    return struct.pack("<I", _VERSION) + b"".join(_ENTRY.pack(*e) for e in entries)


def share_with(fd: int, uid: int, gid: int) -> bool:
    """Keep *fd*'s file root's (group *gid*, 0640) and let *uid* read it.

    Returns False when the filesystem has no ACLs (then only root and the
    group can read it). A daemon that is not root changes nothing: the file
    is already its user's.
    """
    if os.geteuid() != 0:
        os.fchmod(fd, 0o640)
        return True
    gid = -1 if gid is None else gid
    os.fchown(fd, 0, gid)
    os.fchmod(fd, 0o640)
    if uid == 0:
        return True
    try:
        os.setxattr(fd, XATTR, owner_and_reader(uid))
        return True
    except OSError as exc:
        if exc.errno not in _NO_ACL:
            raise
    return False
