"""Host side of the VM test tier: boot the guest, talk to its agent.

    with Guest(image_dir, workdir) as guest:
        r = guest.run("cat /proc/1/comm", timeout=30)
        assert r.rc == 0 and r.out.strip() == "systemd"

The guest is the image that ``build-image`` caches, booted under QEMU TCG
(KVM does not work on the machines this runs on) with ``nodes`` NUMA nodes
of ``cpus_per_node`` CPUs and ``mem_per_node_mb`` MiB each, one socket a
node.  ``threads_per_core=2`` gives every core two threads (SMT); it needs
an Intel ``cpu_model`` such as Haswell-v1, since under TCG the default
``max`` model hides the siblings from the guest (its kernel then sees one
thread per core).  The root disk
is opened with ``snapshot=on``, so the cached image is never written and
every boot starts from the same state.

Commands go to the in-guest agent (agent.py) over a virtio-serial port;
files go through a 9p share, ``workdir/share`` on the host and
``/mnt/host`` in the guest.

QEMU is always taken down: ``close()`` (also run by the context manager,
and by ``atexit``) asks the guest to power off, then quits QEMU through its
monitor, then kills it.  A watchdog kills it once ``lifetime`` seconds have
passed whatever the caller is doing, and QEMU gets SIGKILL from the kernel
if the process that started it dies (PR_SET_PDEATHSIG), so a test run that
is killed by a timeout does not leave a guest behind.

The guest's serial console, which also carries its journal, is kept in
``workdir/serial.log``; ``serial_tail()`` returns its end for failure
reports.
"""

import atexit
import ctypes
import itertools
import json
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time

__all__ = ["Guest", "GuestError", "GuestTimeout", "Result"]

AGENT_PORT = "test.agent"
SHARE_TAG = "hostshare"
SHARE_MOUNT = "/mnt/host"
QEMU = "qemu-system-x86_64"
DEFAULT_ACCEL = "tcg,thread=multi"

_PR_SET_PDEATHSIG = 1


class GuestError(RuntimeError):
    """The guest or QEMU did not do what was asked."""


class GuestTimeout(GuestError):
    """No answer from the guest agent in time."""


class Result:
    """Outcome of one command in the guest."""

    __slots__ = ("cmd", "rc", "out", "err", "timed_out", "duration", "user")

    def __init__(self, cmd, rc, out, err, timed_out=False, duration=0.0,
                 user=None):
        self.cmd = cmd
        self.rc = rc
        self.out = out
        self.err = err
        self.timed_out = timed_out
        self.duration = duration
        self.user = user

    @property
    def ok(self):
        return self.rc == 0 and not self.timed_out

    def __iter__(self):
        # r.rc, r.out, r.err or: rc, out, err = guest.run(...)
        return iter((self.rc, self.out, self.err))

    def describe(self):
        who = " (as %s)" % self.user if self.user else ""
        state = "timed out" if self.timed_out else "rc=%s" % self.rc
        return ("guest command%s: %s\n%s after %.1fs\n--- stdout ---\n%s"
                "--- stderr ---\n%s" % (who, self.cmd, state, self.duration,
                                        _nl(self.out), _nl(self.err)))

    def check(self):
        """Return self, or raise GuestError describing the failure."""
        if not self.ok:
            raise GuestError(self.describe())
        return self

    def __repr__(self):
        return ("Result(rc=%r, out=%r, err=%r, timed_out=%r)"
                % (self.rc, _short(self.out), _short(self.err),
                   self.timed_out))


def _nl(text):
    return text if not text or text.endswith("\n") else text + "\n"


def _short(text, n=200):
    return text if len(text) <= n else text[:n] + "..."


def _set_pdeathsig():
    # Runs in the child between fork and exec: take QEMU down with us.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass
    os.setpgrp()


class Guest:
    """One QEMU guest booted from a cached image directory."""

    def __init__(self, image_dir, workdir, nodes=2, cpus_per_node=2,
                 mem_per_node_mb=2048, boot_timeout=600, lifetime=3600,
                 accel=None, log=None, threads_per_core=1, cpu_model="max"):
        if cpus_per_node % threads_per_core:
            raise ValueError("cpus_per_node (%d) is not a multiple of "
                             "threads_per_core (%d)"
                             % (cpus_per_node, threads_per_core))
        self.image_dir = os.path.abspath(image_dir)
        self.workdir = os.path.abspath(workdir)
        self.nodes = nodes
        self.cpus_per_node = cpus_per_node
        self.mem_per_node_mb = mem_per_node_mb
        self.threads_per_core = threads_per_core
        self.cpu_model = cpu_model
        self.boot_timeout = boot_timeout
        self.lifetime = lifetime
        self.accel = accel or os.environ.get("HPC_BATCH_VM_ACCEL",
                                             DEFAULT_ACCEL)
        self._log = log or (lambda msg: None)
        self.share_dir = os.path.join(self.workdir, "share")
        self.serial_log = os.path.join(self.workdir, "serial.log")
        self.qemu_log = os.path.join(self.workdir, "qemu.log")
        self.agent_path = os.path.join(self.workdir, "agent.sock")
        self.monitor_path = os.path.join(self.workdir, "monitor.sock")
        self.pidfile = os.path.join(self.workdir, "qemu.pid")
        self.proc = None
        self.boot_seconds = None
        self.system_state = None
        self._sock = None
        self._rbuf = b""
        self._ids = itertools.count(1)
        self._xfer = itertools.count(1)
        self._lock = threading.RLock()
        self._watchdog = None
        self._closed = False

    # --- lifecycle -----------------------------------------------------

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def qemu_argv(self):
        cpus = self.nodes * self.cpus_per_node
        mem = self.nodes * self.mem_per_node_mb
        argv = [
            # debug-threads: the vCPU threads are named ("CPU 0/TCG"), so the host can tell
            # how much of its CPU each got (guestlib.VcpuWatch).
            QEMU, "-name", "hpc-batch-test,debug-threads=on",
            "-accel", self.accel, "-cpu", self.cpu_model, "-machine", "q35",
            "-m", "%dM" % mem,
            "-smp", "%d,sockets=%d,cores=%d,threads=%d"
            % (cpus, self.nodes, self.cpus_per_node // self.threads_per_core,
               self.threads_per_core),
        ]
        for n in range(self.nodes):
            first = n * self.cpus_per_node
            argv += [
                "-object", "memory-backend-ram,id=m%d,size=%dM"
                % (n, self.mem_per_node_mb),
                "-numa", "node,nodeid=%d,cpus=%d-%d,memdev=m%d"
                % (n, first, first + self.cpus_per_node - 1, n),
            ]
        argv += [
            "-kernel", os.path.join(self.image_dir, "vmlinuz"),
            "-initrd", os.path.join(self.image_dir, "initrd.img"),
            "-append", "root=/dev/vda rw console=ttyS0 panic=-1 quiet "
                       "systemd.unified_cgroup_hierarchy=1 "
                       "systemd.log_color=0",
            "-drive", "file=%s,if=virtio,format=qcow2,snapshot=on,cache=unsafe"
            % os.path.join(self.image_dir, "root.qcow2"),
            "-device", "virtio-rng-pci",
            "-device", "virtio-serial-pci",
            "-chardev", "socket,id=agent,path=%s,server=on,wait=off"
            % self.agent_path,
            "-device", "virtserialport,chardev=agent,name=%s" % AGENT_PORT,
            "-virtfs", "local,path=%s,mount_tag=%s,security_model=none,"
                       "id=%s" % (self.share_dir, SHARE_TAG, SHARE_TAG),
            "-monitor", "unix:%s,server=on,wait=off" % self.monitor_path,
            "-serial", "file:%s" % self.serial_log,
            "-display", "none", "-no-reboot", "-nic", "none",
            "-pidfile", self.pidfile,
        ]
        return argv

    def start(self):
        if self.proc is not None:
            raise GuestError("guest already started")
        if shutil.which(QEMU) is None:
            raise GuestError("%s not found: run scripts/install-host-deps"
                             % QEMU)
        for name in ("vmlinuz", "initrd.img", "root.qcow2"):
            if not os.path.isfile(os.path.join(self.image_dir, name)):
                raise GuestError("image %s lacks %s: run "
                                 "tests/system/vm/build-image"
                                 % (self.image_dir, name))
        os.makedirs(self.share_dir, exist_ok=True)
        for path in (self.agent_path, self.monitor_path, self.pidfile):
            if os.path.exists(path):
                os.unlink(path)
        if len(self.agent_path) > 100:
            raise GuestError("workdir path too long for a unix socket: %s"
                             % self.workdir)

        argv = self.qemu_argv()
        with open(os.path.join(self.workdir, "qemu.cmdline"), "w") as f:
            f.write(" ".join(shlex.quote(a) for a in argv) + "\n")
        started = time.monotonic()
        self._log("booting guest: %s" % self.workdir)
        env = dict(os.environ, TMPDIR=self.workdir)
        with open(self.qemu_log, "wb") as qlog:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=qlog,
                stderr=subprocess.STDOUT, env=env, close_fds=True,
                preexec_fn=_set_pdeathsig)
        atexit.register(self.close)
        self._watchdog = threading.Timer(self.lifetime, self._expire)
        self._watchdog.daemon = True
        self._watchdog.start()

        deadline = started + self.boot_timeout
        self._connect(deadline)
        self._wait_agent(deadline)
        self._wait_system(deadline)
        self._mount_share(deadline)
        self.boot_seconds = time.monotonic() - started
        self._log("guest up after %.1fs (system %s)"
                  % (self.boot_seconds, self.system_state))
        return self

    def _expire(self):
        self._log("guest lifetime of %ss exceeded: killing QEMU"
                  % self.lifetime)
        self._append_serial("\n[harness] lifetime of %ss exceeded, QEMU "
                            "killed\n" % self.lifetime)
        self.kill()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def _check_alive(self, what):
        if not self.alive():
            rc = self.proc.returncode if self.proc else None
            raise GuestError("QEMU exited (rc=%s) while %s\n%s"
                             % (rc, what, self.failure_context()))

    def _connect(self, deadline):
        while True:
            self._check_alive("waiting for the agent socket")
            if os.path.exists(self.agent_path):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.connect(self.agent_path)
                except OSError:
                    sock.close()
                else:
                    sock.setblocking(False)
                    self._sock = sock
                    return
            if time.monotonic() > deadline:
                raise GuestTimeout("QEMU never created %s\n%s"
                                   % (self.agent_path, self.failure_context()))
            time.sleep(0.1)

    def _wait_agent(self, deadline):
        while True:
            self._check_alive("booting")
            try:
                self._request({"op": "ping"}, timeout=3)
                return
            except GuestTimeout:
                pass
            if time.monotonic() > deadline:
                raise GuestTimeout("guest agent did not answer within %ss\n%s"
                                   % (self.boot_timeout,
                                      self.failure_context()))

    def _mount_share(self, deadline):
        cmd = (f"mountpoint -q {SHARE_MOUNT} || mount -t 9p -o trans=virtio,"
               f"version=9p2000.L,msize=524288 {SHARE_TAG} {SHARE_MOUNT}"
               )
        while True:
            r = self.run(cmd, timeout=60)
            if r.ok:
                return
            if time.monotonic() > deadline:
                raise GuestError("could not mount the 9p share:\n%s\n%s"
                                 % (r.describe(), self.failure_context()))
            time.sleep(1)

    def _wait_system(self, deadline):
        left = max(10, int(deadline - time.monotonic()))
        r = self.run("systemctl is-system-running --wait", timeout=left)
        self.system_state = r.out.strip() or r.err.strip()
        if self.system_state not in ("running", "degraded"):
            raise GuestError("guest did not finish booting:\n%s\n%s"
                             % (r.describe(), self.failure_context()))
        if self.system_state == "degraded":
            failed = self.run("systemctl --failed --no-pager", timeout=30)
            self._log("guest is degraded:\n" + failed.out)

    def poweroff(self, timeout=60):
        """Ask the guest to power off and wait for QEMU to exit: through
        the agent, or, when it does not answer, the ACPI power button."""
        if not self.alive():
            return True
        deadline = time.monotonic() + timeout
        try:
            reply = self._request({"op": "run", "timeout": 10, "argv": [
                "systemctl", "poweroff", "--no-block"]}, timeout=15)
            asked = reply.get("rc") == 0
        except GuestError:
            asked = False
        if not asked:
            try:
                self._monitor("system_powerdown")
            except OSError:
                pass
        try:
            self.proc.wait(max(1, deadline - time.monotonic()))
            return True
        except subprocess.TimeoutExpired:
            return False

    def _monitor(self, command):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(3)
        try:
            sock.connect(self.monitor_path)
            sock.sendall(command.encode() + b"\n")
            time.sleep(0.5)
        finally:
            sock.close()

    def kill(self):
        """Take QEMU down now: monitor quit, then SIGTERM, then SIGKILL."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            self._monitor("quit")
            proc.wait(5)
            return
        except Exception:
            pass
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 30)):
            try:
                proc.send_signal(sig)
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue
            except OSError:
                return

    def close(self, poweroff_timeout=30):
        """Power off (briefly), then make sure QEMU is gone. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self.alive():
                started = time.monotonic()
                clean = self.poweroff(poweroff_timeout)
                self._log("guest %s after %.1fs"
                          % ("powered off" if clean else
                             "did not power off: killing QEMU",
                             time.monotonic() - started))
        finally:
            self.kill()
            if self._watchdog is not None:
                self._watchdog.cancel()
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            try:
                atexit.unregister(self.close)
            except Exception:
                pass

    # --- agent protocol ----------------------------------------------------

    def _readline(self, deadline):
        while b"\n" not in self._rbuf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._sock], [], [], min(left, 1.0))
            if not ready:
                if not self.alive():
                    raise GuestError("QEMU exited while waiting for the "
                                     "agent\n" + self.failure_context())
                continue
            chunk = self._sock.recv(1 << 20)
            if not chunk:
                raise GuestError("agent connection closed by QEMU\n"
                                 + self.failure_context())
            self._rbuf += chunk
        line, self._rbuf = self._rbuf.split(b"\n", 1)
        return line

    def _send(self, data, deadline):
        view = memoryview(data)
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise GuestTimeout("could not send to the agent in time")
            _, ready, _ = select.select([], [self._sock], [], min(left, 1.0))
            if ready:
                view = view[self._sock.send(view):]

    def _request(self, payload, timeout):
        if self._sock is None:
            raise GuestError("guest is not running")
        with self._lock:
            rid = next(self._ids)
            payload = dict(payload, id=rid)
            deadline = time.monotonic() + timeout
            self._send((json.dumps(payload) + "\n").encode(), deadline)
            answered = False
            try:
                while True:
                    line = self._readline(deadline)
                    if line is None:
                        raise GuestTimeout(
                            "no answer from the guest agent within %ss to %r"
                            % (timeout, payload))
                    try:
                        reply = json.loads(line)
                    except ValueError:
                        continue
                    if reply.get("id") == rid:
                        answered = True
                        return reply
                    # An answer to a request we already gave up on.
            finally:
                if not answered and payload.get("op", "run") == "run":
                    # Given up on (our timeout, a test timeout, Ctrl-C):
                    # do not leave the command running in the guest.
                    self._cancel(rid)

    def _cancel(self, rid):
        line = json.dumps({"op": "cancel", "target": rid,
                           "id": next(self._ids)}) + "\n"
        try:
            self._send(line.encode(), time.monotonic() + 2)
        except (OSError, GuestError):
            pass

    def run(self, cmd, timeout=60, user=None, input=None, env=None,
            cwd=None, check=False):
        """Run ``cmd`` in the guest (a string goes to ``sh -c``, a list is
        an argv) as root, or as ``user`` with that user's groups, home
        directory and a login-like environment.  The agent kills the
        command after ``timeout`` seconds; the reply then has
        ``timed_out`` set.  Returns a Result; ``check=True`` raises
        GuestError unless it succeeded."""
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        payload = {"op": "run", "argv": argv, "timeout": timeout}
        if user:
            payload["user"] = user
        if input is not None:
            payload["input"] = input
        if env:
            payload["env"] = env
        if cwd:
            payload["cwd"] = cwd
        # The agent enforces the timeout; allow for TCG slowness on top.
        reply = self._request(payload, timeout + 30)
        if "error" in reply:
            raise GuestError("agent could not run %r: %s"
                             % (cmd, reply["error"]))
        result = Result(cmd if isinstance(cmd, str) else shlex.join(argv),
                        reply["rc"], reply.get("out", ""),
                        reply.get("err", ""), reply.get("timed_out", False),
                        reply.get("duration", 0.0), user)
        return result.check() if check else result

    # --- files ---------------------------------------------------------------

    def _share_name(self, hint):
        base = os.path.basename(hint.rstrip("/")) or "file"
        return "xfer-%d-%s" % (next(self._xfer), base)

    def put(self, src, dest, mode=None, owner=None):
        """Copy host file ``src`` to ``dest`` in the guest (through the
        share), optionally chmod'ing and chown'ing it."""
        name = self._share_name(src)
        shutil.copyfile(src, os.path.join(self.share_dir, name))
        try:
            cmd = "mkdir -p %s && cp %s %s" % (
                shlex.quote(os.path.dirname(dest) or "/"),
                shlex.quote(SHARE_MOUNT + "/" + name), shlex.quote(dest))
            if mode is not None:
                cmd += " && chmod %o %s" % (mode, shlex.quote(dest))
            if owner is not None:
                cmd += " && chown %s %s" % (shlex.quote(owner),
                                            shlex.quote(dest))
            self.run(cmd, timeout=120, check=True)
        finally:
            os.unlink(os.path.join(self.share_dir, name))

    def put_bytes(self, data, dest, mode=None, owner=None):
        if isinstance(data, str):
            data = data.encode()
        staging = os.path.join(self.workdir, self._share_name(dest))
        with open(staging, "wb") as f:
            f.write(data)
        try:
            self.put(staging, dest, mode=mode, owner=owner)
        finally:
            os.unlink(staging)

    def get(self, src, dest):
        """Copy guest file ``src`` to host path ``dest``."""
        name = self._share_name(src)
        self.run("cp %s %s" % (shlex.quote(src),
                               shlex.quote(SHARE_MOUNT + "/" + name)),
                 timeout=120, check=True)
        try:
            shutil.copyfile(os.path.join(self.share_dir, name), dest)
        finally:
            os.unlink(os.path.join(self.share_dir, name))

    def read_bytes(self, src):
        name = self._share_name(src)
        self.run("cp %s %s" % (shlex.quote(src),
                               shlex.quote(SHARE_MOUNT + "/" + name)),
                 timeout=120, check=True)
        path = os.path.join(self.share_dir, name)
        try:
            with open(path, "rb") as f:
                return f.read()
        finally:
            os.unlink(path)

    # --- diagnostics ---------------------------------------------------------

    def _append_serial(self, text):
        try:
            with open(self.serial_log, "a") as f:
                f.write(text)
        except OSError:
            pass

    def serial_tail(self, lines=120):
        try:
            with open(self.serial_log, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 256 * 1024))
                text = f.read().decode("utf-8", errors="replace")
        except OSError as exc:
            return "(no serial log: %s)" % exc
        return "\n".join(text.splitlines()[-lines:])

    def qemu_output(self):
        try:
            with open(self.qemu_log, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def unit_report(self, unit, lines=80):
        """``systemctl status`` and the journal of ``unit``, for messages;
        never raises."""
        try:
            r = self.run("systemctl status %s --no-pager -l; journalctl -u %s "
                         "--no-pager -o short-monotonic -n %d"
                         % (unit, unit, lines), timeout=60)
            return "--- systemctl status / journalctl -u %s ---\n%s%s" % (
                unit, r.out, r.err)
        except GuestError as exc:
            return "(could not ask the guest about %s: %s)" % (unit, exc)

    def failure_context(self, lines=80):
        parts = ["--- guest serial log (%s), last %d lines ---"
                 % (self.serial_log, lines), self.serial_tail(lines)]
        qemu = self.qemu_output().strip()
        if qemu:
            parts += ["--- qemu output (%s) ---" % self.qemu_log, qemu]
        return "\n".join(parts)
