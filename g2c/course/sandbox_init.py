"""PID 1 of one submission's sandbox on Linux (``g2c/course/sandbox.py`` starts it; never imported).

``grade-class`` runs::

    unshare --user --map-root-user --mount --pid --fork --kill-child --net --ipc --uts --mount-proc \\
        PYTHON -I -S sandbox_init.py SPEC_FD CONTROL_FD REPORT_FD

so this script starts as root of fresh user, mount, PID, network, IPC and UTS namespaces: root only over
them, as the teacher's own user outside (as an unprivileged user as well as root). Standard library only,
no ``site`` (``-S``), no environment (``-I``): nothing of the submission's can run before it.

1. It reads the plan (JSON) from ``SPEC_FD``: the command, its folder and environment, and the file
   system: ``scratch`` folders (an empty private tmpfs each: ``/tmp``, ``$HOME``), ``hide`` paths (an empty
   read-only tmpfs over a folder, ``/dev/null`` over a file: the class folder, the reports, the other
   submissions' copies), ``readonly`` and ``writable`` folders bound back at their own path (the
   submission's copy, read-only), each applied in path order; ``pass_fds``: the grader's own descriptors
   (its plan in, its results out), which this process closes once the grader has them.
2. It makes every mount it inherited read-only (keeping the flags the kernel locks: ``nosuid``,
   ``nodev``, ``noexec``, the atime flags): the whole host is read-only inside, whoever owns the files.
3. It starts the command (the grader) with every capability dropped (bounding, inheritable, ambient,
   effective and permitted sets), ``no_new_privs`` set and a file-size limit; the grader can no longer
   mount, unmount or remount anything, so the view above is fixed. Its loopback interface is up, no
   other exists: no network.
4. It waits for the grader to exit, or for ``kill`` (or end of file) on ``CONTROL_FD`` (a timeout, an
   interrupted class run, the grader gone). Then it counts the processes left in the namespace (a
   ``setsid`` daemon, a forgotten child), kills them all (``kill(-1, SIGKILL)``: every process of the
   PID namespace but itself) and reaps them, and writes one JSON line to ``REPORT_FD``:
   ``{"rc": exit code or null, "left": processes killed after the grader ended, "killed": bool,
   "unprotected": mounts it could not make read-only, "error": null or why it could not start,
   "setup_s": seconds from this script's start to the grader's}``.

It is not dumpable (no process of the submission can ptrace it or read its file descriptors, as none has
a capability), ignores SIGINT and SIGTERM (in its PID namespace only signals with a handler reach PID 1),
and when it ends the kernel kills whatever is left in the namespace anyway. With ``--probe`` instead of
the descriptors it checks that all of this works here and prints the report.
"""

import ctypes
import errno
import json
import os
import re
import resource
import select
import signal
import socket
import struct
import sys
import time

STARTED = time.monotonic()

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 1024, 2048, 4096, 16384
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
LOCKED = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
          "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 4, 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CAP_VERSION_3 = 0x20080522
O_PATH = getattr(os, "O_PATH", 0o10000000)
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _check(result: int, what: str, path: str = "") -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}", path)


def mount(source, target: str, fstype, flags: int, data=None) -> None:
    _check(libc.mount(source.encode() if source else None, os.fsencode(target), fstype.encode() if fstype else None,
                      flags, data.encode() if data else None), "mount", target)


def _unescape(field: bytes) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes come octal-escaped (``\\040``)."""
    return os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field))


def inherited_mounts() -> list:
    """``(mount point, locked flags)`` of every mount this namespace inherited, each point once (its top)."""
    points = {}
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split()
            point, options = _unescape(fields[4]), fields[5].decode()
            points[point] = sum(LOCKED.get(o, 0) for o in options.split(","))
    return sorted(points.items(), key=lambda item: item[0].count("/"))


def make_host_readonly(mounts: list) -> list:
    """Remount every inherited mount read-only; return ``[path, error]`` for those that refused."""
    failed = []
    for point, flags in mounts:
        try:
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):      # a mount point hidden by another mount
                failed.append([point, os.strerror(exc.errno)])
    return failed


def locked_flags(path: str, mounts: list) -> int:
    """The flags a bind of ``path`` inherits from the mount that holds it (a remount must keep them)."""
    best, flags = -1, 0
    for point, point_flags in mounts:
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, flags = len(point), point_flags
    return flags


def _makedirs(path: str, is_dir: bool) -> None:
    if os.path.lexists(path):
        return
    os.makedirs(path if is_dir else os.path.dirname(path), exist_ok=True)
    if not is_dir:
        with open(path, "wb"):
            pass


def apply_plan(spec: dict, mounts: list) -> None:
    """The file system of the plan (see the module docstring). Binds are taken from descriptors opened before
    any mount changes, so a folder can be bound back under one that is hidden."""
    ops = []
    for path in spec.get("scratch", []):
        ops.append((path, "scratch", None))
    for path in spec.get("hide", []):
        ops.append((path, "hide", None))
    for kind in ("readonly", "writable"):
        for path in spec.get(kind, []):
            ops.append((path, kind, os.open(path, O_PATH | os.O_CLOEXEC)))
    size = spec.get("scratch_size", "256m")
    hidden = []
    for path, kind, fd in sorted(ops, key=lambda op: (op[0].rstrip("/").count("/"), op[0])):
        if kind == "scratch":
            _makedirs(path, True)
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={size}")
        elif kind == "hide":
            if os.path.isdir(path):
                _makedirs(path, True)
                mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=755,size=1m")
                hidden.append(path)
            elif os.path.lexists(path):
                mount("/dev/null", path, None, MS_BIND)
                mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        else:
            is_dir = os.path.isdir(f"/proc/self/fd/{fd}")
            _makedirs(path, is_dir)
            mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            mount(None, path, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | locked_flags(path, mounts)
                  | (MS_RDONLY if kind == "readonly" else 0))
            os.close(fd)
    for path in reversed(hidden):                      # the hiding tmpfs themselves: nothing may be added
        mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


def loopback_up() -> None:
    """Bring ``lo`` up (a fresh network namespace has it down): localhost works, nothing else exists."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            import fcntl

            req = struct.pack("16sH14s", b"lo", 0, b"")
            flags = struct.unpack("16sH14s", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
            fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b""))
    except OSError:
        pass


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_privileges() -> None:
    """Drop every capability for good (the bounding set first: it needs CAP_SETPCAP), then no_new_privs."""
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == errno.EINVAL:
            break                                      # past the last capability this kernel knows
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header, data = _CapHeader(CAP_VERSION_3, 0), (_CapData * 2)()
    _check(libc.capset(ctypes.byref(header), data), "capset")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def start(spec: dict, close: list) -> int:
    """Fork and exec the command with no privileges; return its pid."""
    pid = os.fork()
    if pid:
        return pid
    try:
        for fd in close:
            os.close(fd)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.setsid()
        limit = int(spec.get("file_size_limit", 2**30))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        pids = int(spec.get("pids_limit", 0))
        if pids:                                       # per user namespace (Linux 5.14+); root is exempt
            resource.setrlimit(resource.RLIMIT_NPROC, (pids, pids))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.chdir(spec["cwd"])
        drop_privileges()
        os.execve(spec["cmd"][0], spec["cmd"], spec["env"])
    except BaseException as exc:                       # noqa: BLE001 - the child must never return
        try:
            os.write(2, f"g2c sandbox: cannot start the grader: {exc}\n".encode())
        finally:
            os._exit(127)
    return -1


def live_processes() -> list:
    """The pids of this PID namespace (its own /proc) that are neither this process nor zombies."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            out.append(int(name))
    return out


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_all() -> int:
    """Kill every other process of the namespace; return how many were alive."""
    reap()
    left = len(live_processes())
    for _ in range(50):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        reap()
        if not live_processes():
            break
        select.select([], [], [], 0.01)
    while True:                                        # every child reaped before the report
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    return left


def supervise(spec: dict, control: int, report_fd: int) -> dict:
    child = start(spec, [control, report_fd])
    for fd in spec.get("pass_fds", []):                # the grader's own descriptors: this process keeps none
        try:
            os.close(int(fd))
        except OSError:
            pass
    pidfd = os.pidfd_open(child) if hasattr(os, "pidfd_open") else None
    rc, killed, crowd = None, False, None
    limit = int(spec.get("pids_limit", 0))
    while rc is None:
        waiting = [control] + ([pidfd] if pidfd is not None else [])
        ready, _, _ = select.select(waiting, [], [], 0.05)
        if control in ready:
            os.read(control, 64)                       # "kill", or b"" when the grade-class side is gone
            killed = True
            break
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid == child:
            rc = os.waitstatus_to_exitcode(status)
            break
        if limit:                                      # the limit root is exempt from: counted here, all killed
            alive = len(live_processes())
            if alive > limit:
                crowd, killed = alive, True
                break
    if killed:
        os.kill(child, signal.SIGKILL)
        _, status = os.waitpid(child, 0)
        left = max(0, kill_all())
    else:
        left = kill_all()
    return {"rc": rc, "left": left, "killed": killed, "pids_exceeded": crowd}


def probe() -> dict:
    """Every step but the command: the host read-only, a private tmpfs, a bound folder, privileges dropped."""
    report = {"unprotected": make_host_readonly(inherited_mounts())}
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=1m")
    with open("/tmp/probe", "w") as f:
        f.write("ok")
    pid = os.fork()
    if pid == 0:
        try:
            drop_privileges()
            mount(None, "/tmp", None, MS_REMOUNT | MS_BIND | MS_RDONLY)
            os._exit(3)                                # a remount must fail without capabilities
        except OSError:
            os._exit(0)
        except BaseException:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    report["dropped"] = os.waitstatus_to_exitcode(status) == 0
    return report


def main(argv: list) -> int:
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if argv[1:] == ["--probe"]:
        try:
            print(json.dumps(probe()))
        except OSError as exc:
            print(json.dumps({"error": str(exc)}))
        return 0
    spec_fd, control, report_fd = (int(a) for a in argv[1:4])
    chunks = []
    while True:
        chunk = os.read(spec_fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(spec_fd)
    spec = json.loads(b"".join(chunks))
    report = {"rc": None, "left": 0, "killed": False, "unprotected": [], "error": None, "setup_s": None}
    try:
        mounts = inherited_mounts()
        report["unprotected"] = make_host_readonly(mounts)
        apply_plan(spec, mounts)
        loopback_up()
        report["setup_s"] = round(time.monotonic() - STARTED, 4)
    except OSError as exc:
        report["error"] = f"could not set up the sandbox: {exc}"
    if report["error"] is None:
        report.update(supervise(spec, control, report_fd))
    os.write(report_fd, (json.dumps(report) + "\n").encode())
    os.close(report_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
