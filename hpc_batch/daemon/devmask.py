"""GPU device masking for job cgroups with the cgroup v2 device controller.

cgroup v2 has no ``devices.allow`` file: the device controller is a BPF
program of type BPF_PROG_TYPE_CGROUP_DEVICE attached to the cgroup, which
the kernel runs on every open() and mknod() of a device node by a process in
that cgroup (or below it). It returns 1 to allow and 0 to deny (EPERM).

This module builds that program as a handful of fixed eBPF instructions
(no compiler, no bcc, no libbpf), loads it with bpf(2) through ctypes and
attaches it to a job's cgroup. The policy only masks GPUs; it is not a
general device policy:

- character devices of major 195 (NVIDIA): minors 0..253 are GPU cards and
  only the minors given are allowed; 254 (nvidia-modeset) and 255
  (nvidiactl) are allowed only when ``control`` is true (the job was given at
  least one GPU); any other minor of major 195 is denied too (the driver
  registers exactly 0..255, so nothing real lives there);
- every other device is allowed: other majors, block devices, and
  nvidia-uvm / nvidia-caps, whose majors are dynamic (CUDA needs nvidia-uvm
  and it does not name a GPU).

The program is attached with BPF_F_ALLOW_MULTI, so programs attached to
parent cgroups still run (the effective answer is the AND of all of them),
and programs attached later below this one cannot override it. Once
attached, the program lives as long as the cgroup: ``apply`` closes its
descriptor, and a restart of the daemon neither removes nor repeats it.

For comparison, systemd (src/core/bpf-devices.c) and runc (the devicefilter
package, derived from crun's ebpf.c) build default-deny allow lists for a
whole device policy: a prologue loads the type, access, major and minor into
r2..r5, then one block of compares per allowed rule jumps to a common
"return 1", and the end returns 0. This program is the opposite shape: a
default-allow mask over one major, meant to be stacked on whatever policy is
already in force. Both pass "GPL" (systemd) or "Apache" (runc) as license.

Constants are checked against include/uapi/linux/bpf.h and
include/uapi/linux/bpf_common.h (torvalds/linux), and against the
linux-libc-dev 6.1 headers compiled with gcc: values, the bpf_attr offsets
for BPF_PROG_LOAD and BPF_PROG_ATTACH, the bpf_cgroup_dev_ctx layout and the
bpf_insn bit field order.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import secrets
import struct
import sys
import time
from collections.abc import Callable, Iterable

# --- bpf(2) commands: enum bpf_cmd, include/uapi/linux/bpf.h -----------------
BPF_PROG_LOAD = 5               # enum bpf_cmd: MAP_CREATE=0 .. MAP_GET_NEXT_KEY=4, PROG_LOAD=5
BPF_PROG_ATTACH = 8             # enum bpf_cmd: OBJ_PIN=6, OBJ_GET=7, PROG_ATTACH=8

# --- program and attach types, include/uapi/linux/bpf.h ----------------------
BPF_PROG_TYPE_CGROUP_DEVICE = 15  # enum bpf_prog_type, after SK_SKB=14 (Linux 4.15)
BPF_CGROUP_DEVICE = 6           # enum bpf_attach_type, after SK_SKB_STREAM_VERDICT=5
BPF_F_ALLOW_MULTI = 1 << 1      # #define BPF_F_ALLOW_MULTI (1U << 1); ALLOW_OVERRIDE is 1 << 0

# --- instruction encoding: include/uapi/linux/bpf_common.h and bpf.h ---------
BPF_LDX = 0x01                  # bpf_common.h: instruction class
BPF_ALU = 0x04                  # bpf_common.h: 32-bit ALU class
BPF_JMP = 0x05                  # bpf_common.h: jump class (64-bit compares in eBPF)
BPF_ALU64 = 0x07                # bpf.h: 64-bit ALU class
BPF_W = 0x00                    # bpf_common.h: 32-bit load size
BPF_MEM = 0x60                  # bpf_common.h: load mode
BPF_K = 0x00                    # bpf_common.h: source is the immediate
BPF_AND = 0x50                  # bpf_common.h: alu op
BPF_JEQ = 0x10                  # bpf_common.h: jmp op
BPF_JNE = 0x50                  # bpf.h: jmp op (eBPF only)
BPF_MOV = 0xB0                  # bpf.h: alu op (eBPF only)
BPF_EXIT = 0x90                 # bpf.h: jmp op (eBPF only)

OP_LDX_MEM_W = BPF_LDX | BPF_MEM | BPF_W     # 0x61: dst = *(u32 *)(src + off)
OP_AND32_K = BPF_ALU | BPF_AND | BPF_K       # 0x54: dst = (u32)dst & imm
OP_JEQ_K = BPF_JMP | BPF_JEQ | BPF_K         # 0x15: if dst == imm: pc += off
OP_JNE_K = BPF_JMP | BPF_JNE | BPF_K         # 0x55: if dst != imm: pc += off
OP_MOV64_K = BPF_ALU64 | BPF_MOV | BPF_K     # 0xb7: dst = imm
OP_EXIT = BPF_JMP | BPF_EXIT                 # 0x95: return r0

INSN = struct.Struct("<BBhi")   # struct bpf_insn: u8 code; u8 dst_reg:4, src_reg:4; s16 off; s32 imm

# --- the program's context: include/uapi/linux/bpf.h -------------------------
# struct bpf_cgroup_dev_ctx { __u32 access_type; __u32 major; __u32 minor; };
# access_type is (BPF_DEVCG_ACC_* << 16) | BPF_DEVCG_DEV_*.
CTX_ACCESS_TYPE = 0             # offsetof(struct bpf_cgroup_dev_ctx, access_type)
CTX_MAJOR = 4                   # offsetof(struct bpf_cgroup_dev_ctx, major)
CTX_MINOR = 8                   # offsetof(struct bpf_cgroup_dev_ctx, minor)
BPF_DEVCG_ACC_MKNOD = 1 << 0    # bpf.h: BPF_DEVCG_ACC_MKNOD (1ULL << 0)
BPF_DEVCG_ACC_READ = 1 << 1     # bpf.h: BPF_DEVCG_ACC_READ (1ULL << 1)
BPF_DEVCG_ACC_WRITE = 1 << 2    # bpf.h: BPF_DEVCG_ACC_WRITE (1ULL << 2)
BPF_DEVCG_DEV_BLOCK = 1 << 0    # bpf.h: BPF_DEVCG_DEV_BLOCK (1ULL << 0)
BPF_DEVCG_DEV_CHAR = 1 << 1     # bpf.h: BPF_DEVCG_DEV_CHAR (1ULL << 1)

# --- registers (eBPF calling convention: r1 = context, r0 = return value) ----
R0, R1, R2 = 0, 1, 2

# --- the NVIDIA device numbers ---------------------------------------------------
NVIDIA_MAJOR = 195              # /dev/nvidia0..N, /dev/nvidia-modeset, /dev/nvidiactl
NVIDIA_MODESET_MINOR = 254
NVIDIA_CTL_MINOR = 255
MAX_GPU_MINOR = 253             # minors 0..253 are GPU cards
MAX_MINORS = 256                # more than any job can be given; keeps every jump offset tiny

# bpf(2) system call numbers for the 64-bit little-endian machines supported:
# x86_64: arch/x86/entry/syscalls/syscall_64.tbl ("321 common bpf") and
#   /usr/include/x86_64-linux-gnu/asm/unistd_64.h;
# aarch64, riscv64, loongarch64: include/uapi/asm-generic/unistd.h
#   ("#define __NR_bpf 280"), scripts/syscall.tbl ("280 common bpf"); riscv and
#   loongarch's uapi asm/unistd.h include asm-generic/unistd.h;
# ppc64le: arch/powerpc/kernel/syscalls/syscall.tbl ("361 common bpf").
# s390x (351, arch/s390/kernel/syscalls/syscall.tbl) and big-endian ppc64 are
# refused: program() encodes instructions little-endian.
SYSCALL_BPF = {"x86_64": 321, "aarch64": 280, "riscv64": 280, "loongarch64": 280, "ppc64le": 361}

# Programs calling no helper need no particular license: the kernel copies the
# string (a valid pointer is required, else EFAULT) and only uses it to decide
# whether GPL-only helpers may be called (kernel/bpf/syscall.c bpf_prog_load:
# prog->gpl_compatible = license_is_gpl_compatible(license)). This program
# calls none; "GPL" is what systemd passes, and marks it as kernel-compatible
# in bpftool's listing.
LICENSE = b"GPL"
PROG_NAME = b"hpcb_devmask"     # BPF_OBJ_NAME_LEN is 16 with the NUL; [A-Za-z0-9_.] only

# union bpf_attr is 144 bytes in Linux 6.1 and grows with new fields (168 for
# BPF_PROG_LOAD alone in 6.17). The kernel reads min(size, its own sizeof)
# and requires any bytes past its sizeof to be zero (bpf_check_uarg_tail_zero),
# so a larger zeroed buffer is valid on every kernel, and a kernel that writes
# back past the fields we use (as Linux 6.17's BPF_PROG_QUERY did) writes into
# memory we own.
ATTR_SIZE = 256
LOG_SIZE = 256 * 1024           # verifier log on failure; the kernel wants >= 128 bytes
LOAD_ATTEMPTS = 5               # as libbpf: BPF_PROG_LOAD may fail with EAGAIN


class MaskError(OSError):
    """The device mask could not be loaded or attached; the message is one line."""

    def __init__(self, message: str, err: int | None = None, log: str = "") -> None:
        super().__init__(message)
        self.errno = err
        self.log = log          # the verifier's full log, when it said something


# --- the program ---------------------------------------------------------------------

def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    if not -(1 << 15) <= off < (1 << 15):
        raise ValueError(f"jump offset {off} does not fit in a bpf_insn (s16)")
    return INSN.pack(code, (src << 4) | dst, off, imm)


def _check_minors(minors: Iterable[int]) -> list[int]:
    given = list(minors)
    if len(given) > MAX_MINORS:
        raise ValueError(f"{len(given)} GPU minors given; at most {MAX_MINORS}")
    for m in given:
        if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m <= MAX_GPU_MINOR:
            raise ValueError(f"GPU minor {m!r} is not an integer in 0..{MAX_GPU_MINOR}")
    return sorted(set(given))


def program(minors: Iterable[int], control: bool) -> bytes:
    """The eBPF instructions (struct bpf_insn, little-endian) of the mask.

    Allows character devices 195:m for m in ``minors`` (each in 0..253),
    195:254 and 195:255 when ``control`` is true, denies every other 195:*
    character device and allows everything else, whatever the access
    (mknod, read, write). Pure: no system call.
    """
    allowed = _check_minors(minors)
    if control:
        allowed += [NVIDIA_MODESET_MINOR, NVIDIA_CTL_MINOR]
    # (code, dst, src, off, imm); off is a jump target (an index) until resolved
    body: list[tuple[int, int, int, int, int]] = [
        (OP_LDX_MEM_W, R2, R1, CTX_ACCESS_TYPE, 0),   # r2 = ctx->access_type
        (OP_AND32_K, R2, 0, 0, 0xFFFF),               # r2 = device type (low 16 bits)
    ]
    allow = len(body) + 4 + len(allowed) + 2           # index of "r0 = 1", after the jumps and the deny
    body += [
        (OP_JNE_K, R2, 0, allow, BPF_DEVCG_DEV_CHAR),   # not a character device: allow
        (OP_LDX_MEM_W, R2, R1, CTX_MAJOR, 0),           # r2 = ctx->major
        (OP_JNE_K, R2, 0, allow, NVIDIA_MAJOR),         # not NVIDIA's major: allow
        (OP_LDX_MEM_W, R2, R1, CTX_MINOR, 0),           # r2 = ctx->minor
    ]
    body += [(OP_JEQ_K, R2, 0, allow, m) for m in allowed]  # an allowed minor: allow
    body += [
        (OP_MOV64_K, R0, 0, 0, 0),                    # deny: r0 = 0
        (OP_EXIT, 0, 0, 0, 0),
        (OP_MOV64_K, R0, 0, 0, 1),                    # allow: r0 = 1
        (OP_EXIT, 0, 0, 0, 0),
    ]
    out = []
    for pc, (code, dst, src, off, imm) in enumerate(body):
        if code in (OP_JEQ_K, OP_JNE_K):
            off = off - (pc + 1)                      # jumps are relative to the next instruction
        out.append(_insn(code, dst, src, off, imm))
    return b"".join(out)


# --- bpf(2) through ctypes ------------------------------------------------------------

class _ProgLoadAttr(ctypes.Structure):
    # union bpf_attr, the anonymous struct used by BPF_PROG_LOAD (bpf.h), up to
    # expected_attach_type (Linux 4.17); offsets 0, 4, 8, 16, 24, 28, 32, 40, 44, 48, 64, 68.
    _fields_ = [
        ("prog_type", ctypes.c_uint32),
        ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64),              # __aligned_u64: pointer to struct bpf_insn[]
        ("license", ctypes.c_uint64),            # __aligned_u64: pointer to a C string
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64),            # __aligned_u64: pointer to char[log_size]
        ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_name", ctypes.c_char * 16),       # char prog_name[BPF_OBJ_NAME_LEN]
        ("prog_ifindex", ctypes.c_uint32),
        ("expected_attach_type", ctypes.c_uint32),
    ]


class _ProgAttachAttr(ctypes.Structure):
    # union bpf_attr, the anonymous struct used by BPF_PROG_ATTACH/DETACH (bpf.h);
    # offsets 0, 4, 8, 12. Later fields (replace_bpf_fd, relative_fd,
    # expected_revision) stay zero: "not used".
    _fields_ = [
        ("target_fd", ctypes.c_uint32),
        ("attach_bpf_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
    ]


class _BpfAttr(ctypes.Union):
    _fields_ = [
        ("load", _ProgLoadAttr),
        ("attach", _ProgAttachAttr),
        ("room", ctypes.c_uint8 * ATTR_SIZE),    # see ATTR_SIZE; ctypes zero-fills it
    ]


def syscall_number(machine: str | None = None, pointer_size: int | None = None,
                   byteorder: str | None = None) -> int:
    """bpf(2)'s number on this machine (or the one described); MaskError if unsupported."""
    machine = machine if machine is not None else platform.machine()
    pointer_size = pointer_size if pointer_size is not None else ctypes.sizeof(ctypes.c_void_p)
    byteorder = byteorder if byteorder is not None else sys.byteorder
    nr = SYSCALL_BPF.get(machine)
    if nr is None or pointer_size != 8 or byteorder != "little":
        raise MaskError(f"GPU device masking supports 64-bit little-endian {', '.join(sorted(SYSCALL_BPF))}; "
                        f"this is {machine or 'an unknown machine'} ({pointer_size * 8}-bit, {byteorder}-endian)")
    return nr


_libc: ctypes.CDLL | None = None


def _syscall() -> Callable[[int, int, int, int], int]:
    """libc's syscall(2), loaded once: long syscall(long number, ...)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    fn = _libc.syscall
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_ulong]
    return fn


def _bpf(cmd: int, attr: _BpfAttr) -> int:
    """bpf(cmd, &attr, sizeof attr); the result, or OSError with the errno."""
    nr = syscall_number()
    fn = _syscall()
    ctypes.set_errno(0)
    ret = fn(nr, cmd, ctypes.addressof(attr), ctypes.sizeof(attr))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(ret)


def _one_line(log: str, limit: int = 1500) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    text = " | ".join(lines[-12:])     # the verdict is at the end of the log
    return text if len(text) <= limit else "..." + text[-limit:]


def _load_attempt(code: bytes, log: ctypes.Array[ctypes.c_char] | None) -> int:
    insns = ctypes.create_string_buffer(code, len(code))
    license = ctypes.create_string_buffer(LICENSE)
    attr = _BpfAttr()
    attr.load.prog_type = BPF_PROG_TYPE_CGROUP_DEVICE
    attr.load.insn_cnt = len(code) // INSN.size
    attr.load.insns = ctypes.addressof(insns)
    attr.load.license = ctypes.addressof(license)
    attr.load.prog_name = PROG_NAME
    # expected_attach_type stays 0: the kernel does not check it for device
    # programs, and a non-zero value would be refused (E2BIG) by 4.15/4.16,
    # whose bpf_attr ends before it.
    if log is not None:
        attr.load.log_level = 1
        attr.load.log_size = len(log)
        attr.load.log_buf = ctypes.addressof(log)
    for attempt in range(LOAD_ATTEMPTS):
        try:
            return _bpf(BPF_PROG_LOAD, attr)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EINTR) or attempt == LOAD_ATTEMPTS - 1:
                raise
            time.sleep(0.01)
    raise AssertionError("unreachable")


def _load_reason(err: int, log: str) -> str:
    if log:
        return f"the kernel's verifier rejected the device mask ({os.strerror(err)}): {_one_line(log)}"
    if err == errno.ENOSYS:
        return "this kernel has no bpf(2) system call (CONFIG_BPF_SYSCALL is off)"
    if err == errno.EPERM:
        return ("bpf(BPF_PROG_LOAD) is not permitted: it needs root (CAP_BPF and CAP_SYS_ADMIN), no seccomp "
                "filter or lockdown blocking bpf(2), and before Linux 5.11 enough RLIMIT_MEMLOCK")
    if err == errno.EINVAL:
        return ("the kernel does not know BPF_PROG_TYPE_CGROUP_DEVICE programs "
                "(Linux 4.15 or later with CONFIG_CGROUP_BPF=y is needed)")
    if err == errno.E2BIG:
        return "the kernel refused the bpf(2) arguments (E2BIG): it predates the fields used, Linux 4.15"
    return f"bpf(BPF_PROG_LOAD) failed: {os.strerror(err)}"


def load(code: bytes) -> int:
    """Load ``code`` as a BPF_PROG_TYPE_CGROUP_DEVICE program; its descriptor (close-on-exec).

    The first attempt asks for no verifier log (a log too small for a long
    verification would fail a good program on older kernels); a rejected
    program is loaded again with the log, whose end goes into the MaskError.
    """
    if not code or len(code) % INSN.size:
        raise ValueError(f"{len(code)} bytes is not a whole number of eBPF instructions")
    try:
        return _load_attempt(code, None)
    except OSError as exc:
        first = exc.errno or 0
    if first not in (errno.EACCES, errno.EINVAL):
        raise MaskError(_load_reason(first, ""), first)
    buf = ctypes.create_string_buffer(LOG_SIZE)
    try:
        return _load_attempt(code, buf)
    except OSError as exc:
        err = exc.errno or first
    log = buf.value.decode("utf-8", "replace")
    raise MaskError(_load_reason(err, log), err, log)


def _attach_reason(path: str, err: int) -> str:
    if err == errno.EBADF:
        return f"{path} is not a cgroup v2 directory"
    if err == errno.EPERM:
        return (f"attaching a device program to {path} is not permitted: it needs root, and no ancestor "
                f"cgroup may hold one attached without BPF_F_ALLOW_MULTI")
    if err == errno.E2BIG:
        return f"{path} already has as many BPF programs attached as the kernel allows"
    if err == errno.EINVAL:
        return f"the kernel refused a BPF_CGROUP_DEVICE attachment to {path} (CONFIG_CGROUP_BPF?)"
    return f"bpf(BPF_PROG_ATTACH) to {path} failed: {os.strerror(err)}"


def attach(cgroup_path: str, prog_fd: int) -> None:
    """Attach a loaded device program to a cgroup v2 directory, with BPF_F_ALLOW_MULTI."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        cgroup_fd = os.open(cgroup_path, flags)
    except OSError as exc:
        # O_NOFOLLOW with O_DIRECTORY: a symbolic link fails with ELOOP or ENOTDIR
        link = exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(cgroup_path)
        why = "it is a symbolic link" if link else exc.strerror
        raise MaskError(f"cannot open the cgroup {cgroup_path}: {why or exc}", exc.errno) from None
    try:
        attr = _BpfAttr()
        attr.attach.target_fd = cgroup_fd
        attr.attach.attach_bpf_fd = prog_fd
        attr.attach.attach_type = BPF_CGROUP_DEVICE
        attr.attach.attach_flags = BPF_F_ALLOW_MULTI
        _bpf(BPF_PROG_ATTACH, attr)
    except MaskError:
        raise
    except OSError as exc:
        err = exc.errno or 0
        raise MaskError(_attach_reason(cgroup_path, err), err) from None
    finally:
        os.close(cgroup_fd)


def apply(cgroup_path: str, minors: Iterable[int], control: bool) -> None:
    """Mask the GPUs of a cgroup: allow ``minors`` (and 254/255 if ``control``).

    The program's descriptor is closed afterwards: the attachment holds the
    program for the life of the cgroup. ValueError for minors out of range,
    MaskError when the kernel refuses.
    """
    code = program(minors, control)
    prog_fd = load(code)
    try:
        attach(cgroup_path, prog_fd)
    finally:
        os.close(prog_fd)


def probe(cgroup_root: str) -> str | None:
    """None when GPU masking works under ``cgroup_root``, else a one-line reason.

    Creates a temporary child cgroup, applies a mask to it and removes it
    again (an attached program goes with its cgroup).
    """
    try:
        syscall_number()
    except MaskError as exc:
        return str(exc)
    if not os.path.isfile(os.path.join(cgroup_root, "cgroup.controllers")):
        return f"{cgroup_root} is not a cgroup v2 directory (it has no cgroup.controllers)"
    child = os.path.join(cgroup_root, f"devmask-probe-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.mkdir(child)
    except OSError as exc:
        return f"cannot create a test cgroup under {cgroup_root}: {exc.strerror or exc}"
    try:
        apply(child, [0], True)
    except MaskError as exc:
        return str(exc)
    finally:
        for _ in range(50):
            try:
                os.rmdir(child)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)
    return None
