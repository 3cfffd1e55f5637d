"""Unit tests for hpc_batch.daemon.devmask: the eBPF device mask, run in a tiny interpreter.

Nothing here needs root or a kernel with BPF: program() is pure, and the
bpf(2) calls are replaced where the plumbing around them is tested. The real
kernel runs the program in tests/system/test_devmask_guest.py.
"""

import ctypes
import errno
import os
import struct

import pytest

from hpc_batch.daemon import devmask
from hpc_batch.daemon.devmask import MaskError, program

BLOCK, CHAR = 1, 2                    # BPF_DEVCG_DEV_BLOCK, BPF_DEVCG_DEV_CHAR
MKNOD, READ, WRITE = 1, 2, 4          # BPF_DEVCG_ACC_*
U64 = (1 << 64) - 1
CTX = object()                        # r1 at entry: the pointer to struct bpf_cgroup_dev_ctx

LDX_W, AND32_K, AND64_K, MOV64_K, JEQ_K, JNE_K, EXIT = 0x61, 0x54, 0x57, 0xB7, 0x15, 0x55, 0x95
KNOWN = {LDX_W, AND32_K, AND64_K, MOV64_K, JEQ_K, JNE_K, EXIT}


# --- a tiny eBPF interpreter, for exactly the opcodes the mask may use ---------------

def decode(code):
    """[(opcode, dst, src, off, imm)] from struct bpf_insn bytes (dst in the low nibble)."""
    assert len(code) % 8 == 0 and code, len(code)
    out = []
    for i in range(0, len(code), 8):
        op, regs, off, imm = struct.unpack("<BBhi", code[i:i + 8])
        out.append((op, regs & 0x0F, regs >> 4, off, imm))
    return out


def run(code, dev_type, major, minor, access=READ):
    """r0 when the program sees this device access."""
    ctx = struct.pack("<III", (access << 16) | dev_type, major, minor)
    insns = decode(code)
    regs = {1: CTX, 10: "frame pointer"}
    pc = 0
    for _ in range(10 * len(insns)):
        assert 0 <= pc < len(insns), f"pc {pc} left the program"
        op, dst, src, off, imm = insns[pc]
        pc += 1
        if op == LDX_W:
            assert regs.get(src) is CTX and off in (0, 4, 8), (src, off)
            regs[dst] = struct.unpack_from("<I", ctx, off)[0]
        elif op in (AND32_K, AND64_K):
            assert isinstance(regs.get(dst), int), f"r{dst} read before it was set"
            mask = imm & 0xFFFFFFFF if op == AND32_K else imm & U64
            regs[dst] = regs[dst] & mask
        elif op == MOV64_K:
            regs[dst] = imm & U64                                  # imm is sign-extended to 64 bits
        elif op in (JEQ_K, JNE_K):
            assert isinstance(regs.get(dst), int), f"r{dst} read before it was set"
            equal = regs[dst] == imm & U64
            if equal == (op == JEQ_K):
                pc += off
        elif op == EXIT:
            assert isinstance(regs.get(0), int), "r0 is not set at exit"
            return regs[0]
        else:
            pytest.fail(f"opcode {op:#x} at {pc - 1} is not one the interpreter knows")
    pytest.fail("the program did not terminate")


def allowed(code, dev_type, major, minor):
    answers = {run(code, dev_type, major, minor, acc) for acc in range(1, 8)}   # every mix of mknod/read/write
    assert len(answers) == 1, f"the access bits changed the answer for {dev_type} {major}:{minor}"
    (answer,) = answers
    assert answer in (0, 1)
    return answer == 1


# --- the decision table ----------------------------------------------------------------

@pytest.mark.parametrize("dev_type, major, minor, with_control, without_control", [
    (CHAR, 195, 0, True, True),         # the job's GPU
    (CHAR, 195, 1, False, False),       # another GPU
    (CHAR, 195, 253, False, False),     # the last GPU minor
    (CHAR, 195, 254, True, False),      # nvidia-modeset
    (CHAR, 195, 255, True, False),      # nvidiactl
    (CHAR, 195, 256, False, False),     # nothing real, but still NVIDIA's major: denied
    (CHAR, 1, 3, True, True),           # /dev/null
    (CHAR, 1, 195, True, True),         # a minor that looks like the major
    (CHAR, 508, 0, True, True),         # nvidia-uvm (dynamic major)
    (BLOCK, 8, 0, True, True),          # /dev/sda
    (BLOCK, 195, 1, True, True),        # a block device is never a GPU
])
def test_decision_table(dev_type, major, minor, with_control, without_control):
    assert allowed(program([0], True), dev_type, major, minor) is with_control
    assert allowed(program([0], False), dev_type, major, minor) is without_control


@pytest.mark.parametrize("minors", [[], [0], [1, 3], [7, 2, 7], list(range(254))])
@pytest.mark.parametrize("control", [False, True])
def test_every_nvidia_minor(minors, control):
    code = program(minors, control)
    for minor in range(256):
        expect = minor in minors or (control and minor in (254, 255))
        assert allowed(code, CHAR, 195, minor) is expect, minor
        assert allowed(code, BLOCK, 195, minor)


def test_no_gpus_denies_all_of_major_195():
    code = program([], False)
    assert not any(allowed(code, CHAR, 195, minor) for minor in range(256))
    assert allowed(code, CHAR, 1, 3) and allowed(code, CHAR, 5, 1) and allowed(code, BLOCK, 8, 0)


def test_access_bits_do_not_matter():
    code = program([2], True)
    for access in (MKNOD, READ, WRITE, READ | WRITE, MKNOD | READ | WRITE):
        assert run(code, CHAR, 195, 2, access) == 1
        assert run(code, CHAR, 195, 3, access) == 0
        assert run(code, CHAR, 10, 200, access) == 1


# --- the shape of the program -------------------------------------------------------------

@pytest.mark.parametrize("minors, control", [([], False), ([], True), ([0], True), ([5, 9, 1], False),
                                             (list(range(254)), True)])
def test_structure(minors, control):
    insns = decode(program(minors, control))
    assert len(insns) == 10 + len(set(minors)) + (2 if control else 0)
    assert {op for op, *_ in insns} <= KNOWN
    assert insns[-1][0] == EXIT
    for pc, (op, dst, src, off, _imm) in enumerate(insns):
        assert dst <= 2 and src <= 2, (pc, dst, src)
        if op in (JEQ_K, JNE_K):
            target = pc + 1 + off
            assert off > 0 and 0 <= target < len(insns), (pc, off)    # forward only, inside the program
            assert insns[target][0] == MOV64_K and insns[target][4] == 1   # every jump goes to "allow"
        elif op != LDX_W:
            assert off == 0 and src == 0, pc
    # No instruction falls off the end: each exit's predecessor sets r0.
    exits = [pc for pc, (op, *_) in enumerate(insns) if op == EXIT]
    assert all(insns[pc - 1][0] == MOV64_K and insns[pc - 1][1] == 0 for pc in exits)


def test_encoding_of_the_first_instructions():
    code = program([0], True)
    # r2 = *(u32 *)(r1 + 0): opcode 0x61, dst r2 in the low nibble, src r1 in the high one.
    assert code[:8] == bytes([0x61, 0x12, 0, 0, 0, 0, 0, 0])
    # w2 &= 0xffff
    assert code[8:16] == bytes([0x54, 0x02, 0, 0]) + (0xFFFF).to_bytes(4, "little")
    # if r2 != 2 goto allow (off 8: from the next instruction, 3, to "r0 = 1", 11)
    assert code[16:24] == bytes([0x55, 0x02]) + (8).to_bytes(2, "little") + (2).to_bytes(4, "little")
    # the tail: r0 = 0; exit; r0 = 1; exit
    assert code[-32:] == (bytes([0xB7, 0, 0, 0]) + bytes(4) + bytes([0x95]) + bytes(7)
                          + bytes([0xB7, 0, 0, 0]) + (1).to_bytes(4, "little") + bytes([0x95]) + bytes(7))


def test_minors_are_deduplicated_and_order_does_not_matter():
    assert program([3, 1, 3], True) == program([1, 3], True) == program((m for m in (1, 3)), True)


@pytest.mark.parametrize("bad", [[-1], [254], [255], [256], ["0"], [1.0], [True], [None]])
def test_minors_out_of_range_are_refused(bad):
    with pytest.raises(ValueError):
        program(bad, True)


def test_minor_count_is_bounded():
    assert len(decode(program(range(254), True))) == 10 + 254 + 2
    program([0] * devmask.MAX_MINORS, False)
    with pytest.raises(ValueError, match="at most"):
        program([0] * (devmask.MAX_MINORS + 1), False)
    with pytest.raises(ValueError, match="at most"):
        program(list(range(254)) * 2, True)


# --- constants and layouts (checked against linux/bpf.h; see the module) ----------------

def test_constants():
    assert (devmask.BPF_PROG_LOAD, devmask.BPF_PROG_ATTACH) == (5, 8)
    assert devmask.BPF_PROG_TYPE_CGROUP_DEVICE == 15
    assert devmask.BPF_CGROUP_DEVICE == 6
    assert devmask.BPF_F_ALLOW_MULTI == 2
    assert (devmask.OP_LDX_MEM_W, devmask.OP_AND32_K, devmask.OP_JEQ_K, devmask.OP_JNE_K,
            devmask.OP_MOV64_K, devmask.OP_EXIT) == (0x61, 0x54, 0x15, 0x55, 0xB7, 0x95)
    assert (devmask.BPF_DEVCG_DEV_BLOCK, devmask.BPF_DEVCG_DEV_CHAR) == (BLOCK, CHAR)
    assert (devmask.BPF_DEVCG_ACC_MKNOD, devmask.BPF_DEVCG_ACC_READ, devmask.BPF_DEVCG_ACC_WRITE) == (1, 2, 4)
    assert (devmask.CTX_ACCESS_TYPE, devmask.CTX_MAJOR, devmask.CTX_MINOR) == (0, 4, 8)


def test_bpf_attr_layout():
    load = {name: getattr(devmask._ProgLoadAttr, name).offset for name, _ in devmask._ProgLoadAttr._fields_}
    assert load == {"prog_type": 0, "insn_cnt": 4, "insns": 8, "license": 16, "log_level": 24, "log_size": 28,
                    "log_buf": 32, "kern_version": 40, "prog_flags": 44, "prog_name": 48, "prog_ifindex": 64,
                    "expected_attach_type": 68}
    att = {name: getattr(devmask._ProgAttachAttr, name).offset for name, _ in devmask._ProgAttachAttr._fields_}
    assert att == {"target_fd": 0, "attach_bpf_fd": 4, "attach_type": 8, "attach_flags": 12}
    # Room for the whole union of current kernels (168 bytes of BPF_PROG_LOAD in 6.17), zero-filled.
    assert ctypes.sizeof(devmask._BpfAttr) == devmask.ATTR_SIZE >= 168
    assert bytes(devmask._BpfAttr()) == bytes(devmask.ATTR_SIZE)


@pytest.mark.parametrize("machine, nr", [("x86_64", 321), ("aarch64", 280), ("riscv64", 280),
                                         ("loongarch64", 280), ("ppc64le", 361)])
def test_syscall_numbers(machine, nr):
    assert devmask.syscall_number(machine, 8, "little") == nr


@pytest.mark.parametrize("machine, size, order", [("s390x", 8, "big"), ("ppc64", 8, "big"), ("sparc64", 8, "big"),
                                                  ("mips64", 8, "little"), ("x86_64", 4, "little"),
                                                  ("i686", 4, "little"), ("", 8, "little")])
def test_unsupported_machines_are_refused(machine, size, order):
    with pytest.raises(MaskError) as err:
        devmask.syscall_number(machine, size, order)
    assert "\n" not in str(err.value) and "x86_64" in str(err.value)


# --- load, attach, apply, probe without the kernel ------------------------------------------

class FakeBpf:
    """Stands in for devmask._bpf: records each call, answers from a script."""

    def __init__(self, *answers, log=""):
        self.answers = list(answers)
        self.calls = []
        self.log = log

    def __call__(self, cmd, attr):
        seen = {"cmd": cmd}
        if cmd == devmask.BPF_PROG_LOAD:
            a = attr.load
            seen.update(prog_type=a.prog_type, insns=ctypes.string_at(a.insns, a.insn_cnt * 8),
                        license=ctypes.string_at(a.license), log_level=a.log_level, log_size=a.log_size,
                        name=a.prog_name, expected=a.expected_attach_type, kern_version=a.kern_version)
            if a.log_level and self.log:
                data = self.log.encode() + b"\0"
                ctypes.memmove(a.log_buf, data, min(len(data), a.log_size))
        else:
            a = attr.attach
            seen.update(target=os.fstat(a.target_fd), prog_fd=a.attach_bpf_fd, type=a.attach_type,
                        flags=a.attach_flags)
        self.calls.append(seen)
        answer = self.answers.pop(0)
        if isinstance(answer, int) and answer < 0:
            raise OSError(-answer, os.strerror(-answer))
        return answer


def test_load_fills_bpf_attr(monkeypatch):
    fake = FakeBpf(42)
    monkeypatch.setattr(devmask, "_bpf", fake)
    code = program([1], True)
    assert devmask.load(code) == 42
    (call,) = fake.calls
    assert call == {"cmd": 5, "prog_type": 15, "insns": code, "license": b"GPL", "log_level": 0, "log_size": 0,
                    "name": b"hpcb_devmask", "expected": 0, "kern_version": 0}


def test_a_rejected_program_is_loaded_again_for_the_log(monkeypatch):
    log = "0: R1=ctx() R10=fp0\n0: (95) exit\nR0 !read_ok\nprocessed 1 insns\n"
    fake = FakeBpf(-errno.EACCES, -errno.EACCES, log=log)
    monkeypatch.setattr(devmask, "_bpf", fake)
    with pytest.raises(MaskError) as err:
        devmask.load(program([], False))
    assert [c["log_level"] for c in fake.calls] == [0, 1]
    assert fake.calls[1]["log_size"] == devmask.LOG_SIZE
    msg = str(err.value)
    assert "\n" not in msg and "verifier" in msg and "R0 !read_ok" in msg
    assert err.value.errno == errno.EACCES and err.value.log == log


@pytest.mark.parametrize("err, words", [(errno.EPERM, "root"), (errno.ENOSYS, "CONFIG_BPF_SYSCALL"),
                                        (errno.EINVAL, "CONFIG_CGROUP_BPF"), (errno.E2BIG, "E2BIG"),
                                        (errno.ENOMEM, "Cannot allocate memory")])
def test_load_failures_are_one_line(monkeypatch, err, words):
    monkeypatch.setattr(devmask, "_bpf", FakeBpf(-err, -err))
    with pytest.raises(MaskError) as exc:
        devmask.load(program([0], True))
    assert isinstance(exc.value, OSError) and exc.value.errno == err
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_eagain_is_retried(monkeypatch):
    monkeypatch.setattr(devmask, "_bpf", FakeBpf(-errno.EAGAIN, -errno.EAGAIN, 7))
    assert devmask.load(program([0], True)) == 7


def test_load_refuses_partial_instructions():
    with pytest.raises(ValueError):
        devmask.load(b"\x95\0\0")


def test_attach_fills_bpf_attr(monkeypatch, tmp_path):
    fake = FakeBpf(0)
    monkeypatch.setattr(devmask, "_bpf", fake)
    devmask.attach(str(tmp_path), 9)
    (call,) = fake.calls
    assert call["cmd"] == 8 and call["prog_fd"] == 9 and call["type"] == 6 and call["flags"] == 2
    assert (call["target"].st_dev, call["target"].st_ino) == (os.stat(tmp_path).st_dev, os.stat(tmp_path).st_ino)


def test_attach_refuses_symlinks_and_missing_cgroups(monkeypatch, tmp_path):
    monkeypatch.setattr(devmask, "_bpf", FakeBpf())       # never reached
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(MaskError, match="symbolic link"):
        devmask.attach(str(tmp_path / "link"), 9)
    with pytest.raises(MaskError, match="No such file"):
        devmask.attach(str(tmp_path / "gone"), 9)


@pytest.mark.parametrize("err, words", [(errno.EBADF, "not a cgroup v2"), (errno.EPERM, "ALLOW_MULTI")])
def test_attach_failures_are_one_line(monkeypatch, tmp_path, err, words):
    monkeypatch.setattr(devmask, "_bpf", FakeBpf(-err))
    with pytest.raises(MaskError, match=words) as exc:
        devmask.attach(str(tmp_path), 9)
    assert exc.value.errno == err and "\n" not in str(exc.value)


def test_apply_closes_the_program_descriptor(monkeypatch, tmp_path):
    fds = []

    def fake_load(code):
        fds.append(os.open(os.devnull, os.O_RDONLY))
        return fds[-1]

    monkeypatch.setattr(devmask, "load", fake_load)
    monkeypatch.setattr(devmask, "_bpf", FakeBpf(0, -errno.EPERM))
    devmask.apply(str(tmp_path), [0], True)
    with pytest.raises(MaskError):
        devmask.apply(str(tmp_path), [0], True)
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)


def test_probe_outside_cgroup_v2(tmp_path):
    reason = devmask.probe(str(tmp_path))
    assert reason and "cgroup v2" in reason and "\n" not in reason
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("outcome", [None, "the kernel said no"])
def test_probe_applies_to_a_temporary_child(monkeypatch, tmp_path, outcome):
    (tmp_path / "cgroup.controllers").write_text("cpuset memory\n")
    seen = []

    def fake_apply(path, minors, control):
        assert os.path.isdir(path) and os.path.dirname(path) == str(tmp_path)
        seen.append((list(minors), control))
        if outcome:
            raise MaskError(outcome)

    monkeypatch.setattr(devmask, "apply", fake_apply)
    assert devmask.probe(str(tmp_path)) == outcome
    assert seen == [([0], True)]
    assert [p.name for p in tmp_path.iterdir()] == ["cgroup.controllers"]     # the child is gone


def test_probe_on_an_unsupported_machine(monkeypatch, tmp_path):
    monkeypatch.setattr(devmask.platform, "machine", lambda: "s390x")
    reason = devmask.probe(str(tmp_path))
    assert reason and "s390x" in reason
