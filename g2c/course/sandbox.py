"""Containment of the code ``grade-class`` runs: each submission's grading where it can write only a private
``/tmp`` and ``$HOME`` (each a small tmpfs where the mechanism allows), sees none of the other submissions, has
no network and leaves no process behind. ``docs/teaching.md`` (the threat model) says what this proves and
what it does not.

Mechanisms, chosen by ``choose_containment``:

- ``namespaces`` (Linux): util-linux ``unshare`` makes user, mount, PID, network, IPC and UTS namespaces, as
  root or as any user (no privilege needed), and ``sandbox_init.py`` runs inside as PID 1: the whole host
  read-only, private tmpfs over ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``$HOME``, the class folder, the
  reports and the other copies hidden under empty tmpfs, every capability dropped before the grader starts;
  after it exits, the processes left in the namespace are counted and killed.
- ``sandbox-exec`` (macOS): a Seatbelt profile (``seatbelt_profile``) that denies every write outside the
  private folders, every read of the class folder, the reports and the other copies,
  and the network. Processes that leave the grader's process group are not tracked there (the report says
  so).
- ``container`` (``--container IMAGE``, docker or podman): the copy and the teacher's files mounted
  read-only, a private ``/tmp`` and ``$HOME``, no network, no capabilities, the image's ``python3`` (the image
  must hold the course's dependencies).
- ``none`` (``--uncontained``): the grader runs as the teacher's user; every report then starts with
  "not contained: grading untrusted code as USER". Without the flag ``grade-class`` refuses to start where
  no mechanism works.

Tooling only (the layering test keeps course code away from it).
"""

from __future__ import annotations

import getpass
import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Containment", "Jail", "Run", "Unavailable", "choose_containment", "container_command", "launch",
           "seatbelt_profile", "stop_all"]

INIT = Path(__file__).with_name("sandbox_init.py")
UNSHARE_FLAGS = ("--user", "--map-root-user", "--mount", "--pid", "--fork", "--kill-child", "--net", "--ipc",
                 "--uts", "--mount-proc")
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")   # each an empty private tmpfs inside the namespaces
CONTAINER_HOME = "/home/g2c"                  # the private $HOME inside a container (a tmpfs)
FILE_SIZE_LIMIT = 256 * 2**20                 # RLIMIT_FSIZE of the graded code: no file (or log) past 256 MiB
SCRATCH_SIZE = "256m"                         # each private tmpfs (/tmp, /var/tmp, /dev/shm, $HOME) holds this much
PIDS_LIMIT = 512                              # processes (and threads) one submission's grading may hold at once
KILL_GRACE_S = 5.0                            # how long PID 1 gets to count and kill before the group is killed


class Unavailable(RuntimeError):
    """No containment works here (the message says why and which flag grades anyway)."""


def current_user() -> str:
    """The name of the user this process runs as (its uid's, not ``$USER``: ``setpriv`` or ``su`` keep that)."""
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError, OSError):
        pass
    try:
        return getpass.getuser()
    except Exception:  # no user database entry (a container's odd uid)
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "this user"


@dataclass(frozen=True)
class Containment:
    """How the class's code is contained: ``kind`` (``namespaces``, ``sandbox-exec``, ``container``, ``none``),
    as ``user``; ``contained``/``uncontained`` say, one short clause each, what holds and what does not."""

    kind: str
    user: str
    contained: tuple[str, ...] = ()
    uncontained: tuple[str, ...] = ()
    runtime: str | None = None
    image: str | None = None

    @property
    def is_contained(self) -> bool:
        return self.kind != "none"

    def headline(self) -> str:
        """The report's first line."""
        if not self.is_contained:
            return f"not contained: grading untrusted code as {self.user}"
        how = {"namespaces": "Linux namespaces (unshare)", "sandbox-exec": "macOS sandbox-exec",
               "container": f"container {self.image} ({Path(self.runtime or '').name})"}[self.kind]
        return f"contained by {how}, as {self.user}: " + "; ".join(self.contained)

    def lines(self) -> list[str]:
        """The headline, then what is not contained (one line each)."""
        return [self.headline(), *(f"not contained: {u}" for u in self.uncontained)]


NAMESPACES_HOLD = ("each submission can write only a private /tmp and $HOME", "the host is read-only",
                   "the class folder, the reports and the other copies are hidden", "no network",
                   "no process outlives its grading")
NAMESPACES_OPEN = ("reads of the rest of the host (your files outside the class folder and the reports), CPU "
                   "time up to --timeout, memory",)


def _probe_namespaces() -> tuple[bool, str, tuple[str, ...]]:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False, "util-linux unshare is not installed", ()
    try:
        proc = subprocess.run([unshare, *UNSHARE_FLAGS, sys.executable, "-I", "-S", str(INIT), "--probe"],
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"unshare could not run ({exc})", ()
    try:
        report = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        why = " ".join((proc.stderr or proc.stdout).split())[:300] or f"exit code {proc.returncode}"
        return False, f"unshare cannot make the namespaces here ({why}); unprivileged user namespaces may be " \
                      "switched off (sysctl kernel.unprivileged_userns_clone, or AppArmor's " \
                      "kernel.apparmor_restrict_unprivileged_userns)", ()
    if report.get("error"):
        return False, f"the sandbox could not be set up: {report['error']}", ()
    if not report.get("dropped"):
        return False, "dropping the sandbox's capabilities did not hold", ()
    open_mounts = tuple(f"{path} stays writable inside ({why})" for path, why in report.get("unprotected", []))
    return True, "", open_mounts


def _container_runtime(explicit: str | None) -> str | None:
    for name in ([explicit] if explicit else ["podman", "docker"]):
        found = shutil.which(name)
        if found:
            return found
    return None


def choose_containment(*, container: str | None = None, uncontained: bool = False) -> Containment:
    """The containment this machine offers: ``container`` (an image) if given, else namespaces on Linux and
    sandbox-exec on macOS; ``none`` only when ``uncontained`` is asked for.

    Raises:
        Unavailable: ``container`` given but no docker or podman runs it, or nothing works here and
            ``uncontained`` is not set (the message names both flags).
    """
    user = current_user()
    if container:
        runtime = _container_runtime(os.environ.get("G2C_CONTAINER_RUNTIME"))
        if runtime is None:
            raise Unavailable("--container: neither podman nor docker is installed (or set G2C_CONTAINER_RUNTIME "
                              "to the one you have)")
        try:
            proc = subprocess.run([runtime, "image", "inspect", container], capture_output=True, text=True,
                                  timeout=60, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as exc:
            raise Unavailable(f"--container {container}: {Path(runtime).name} could not run ({exc})") from None
        if proc.returncode != 0:
            why = " ".join((proc.stderr or proc.stdout).split())[:200]
            raise Unavailable(f"--container {container}: {Path(runtime).name} has no such image ({why}); build or "
                              f"pull it first") from None
        return Containment("container", user, ("each submission can write only a private /tmp and $HOME",
                                               "the class folder, the reports and the other copies are not "
                                               "mounted", "no network", "no capabilities",
                                               "no process outlives its container"),
                           ("processes left behind are not counted (the container's end kills them)",),
                           runtime=runtime, image=container)
    if uncontained:
        return Containment("none", user, (), ("the graded code runs as your user and can change your files, "
                                              "other submissions' copies and their grades",
                                              "processes that leave their process group outlive the grading"))
    reasons = []
    system = platform.system()
    if system == "Linux":
        ok, why, open_mounts = _probe_namespaces()
        if ok:
            return Containment("namespaces", user, NAMESPACES_HOLD, (*open_mounts, *NAMESPACES_OPEN))
        reasons.append(why)
    elif system == "Darwin":
        exe = shutil.which("sandbox-exec") or ("/usr/bin/sandbox-exec" if Path("/usr/bin/sandbox-exec").exists()
                                               else None)
        if exe:
            return Containment("sandbox-exec", user, ("each submission can write only its private folders",
                                                      "the class folder, the reports and the other copies are "
                                                      "unreadable", "no network"),
                               ("processes that leave the grader's process group (setsid) are not tracked; they "
                                "can write nothing and reach no network", *NAMESPACES_OPEN), runtime=exe)
        reasons.append("sandbox-exec is missing")
    else:
        reasons.append(f"no sandbox is known on {system}")
    raise Unavailable(f"cannot contain the graded code here: {'; '.join(reasons)}. Grading runs every submission's "
                      f"code; uncontained it runs as {user}, and can change your files and other students' grades. "
                      "Give --container IMAGE (docker or podman), or --uncontained to grade anyway (only code you "
                      "trust)")


# -- one submission's run ---------------------------------------------------------------------------

@dataclass
class Jail:
    """Where one submission's grader runs: ``copy`` (its overlay, read-only inside), ``results`` (the one
    folder it may write besides its private ones), ``private`` (a host folder for the private ``/tmp`` and
    ``$HOME`` where the mechanism needs one), ``hide`` (the class folder, the reports, the class run's folder
    of copies, every submission's own source), ``expose`` (folders the grader needs that may sit under a
    hidden one: the teacher's checkout, its ``.venv``, the Python installation), ``home`` (the real ``$HOME``,
    replaced by an empty private one), ``links`` (what the copy's ``artifacts`` and ``data`` links point to: a
    container mounts them read-only at their own paths, its own ``python3`` standing in for the ``.venv``)."""

    copy: Path
    results: Path
    private: Path
    hide: list[Path] = field(default_factory=list)
    expose: list[Path] = field(default_factory=list)
    home: Path | None = None
    links: list[Path] = field(default_factory=list)


def _under(path: Path, folders) -> bool:
    return any(path == f or f in path.parents for f in folders)


def runtime_dirs() -> list[str]:
    """The host's folders of Unix sockets, hidden under an empty tmpfs in the namespace: ``/run``, ``/var/run``
    (unless it is a link to ``/run``) and ``$XDG_RUNTIME_DIR``. A network namespace does not cover a socket
    bound to a path, so without this the graded code could connect to the docker socket, the session bus or an
    agent socket the teacher's uid may use. A socket bound elsewhere on the host stays reachable where its
    permissions let the grader's uid write it (docs/teaching.md, "What the sandbox does not cover")."""
    found = []
    for p in ("/run", "/var/run", os.environ.get("XDG_RUNTIME_DIR", "")):
        if p and os.path.isabs(p) and os.path.isdir(p) and not os.path.islink(p):
            p = os.path.normpath(p)
            if not any(p == f or p.startswith(f + "/") for f in found):
                found.append(p)
    return found


def namespace_spec(jail: Jail, cmd: list[str], env: dict[str, str], pass_fds: tuple[int, ...] = ()) -> dict:
    """The plan ``sandbox_init.py`` applies (see its docstring)."""
    scratch = [p for p in SCRATCH if Path(p).is_dir()]
    home = jail.home if jail.home and jail.home.is_dir() and jail.home != Path("/") else None
    if home is not None:
        scratch.append(str(home))
    hide = {str(p) for p in jail.hide} | set(runtime_dirs())
    covered = [Path(p) for p in scratch] + [Path(p) for p in hide]
    readonly = [str(jail.copy)] + sorted({str(p) for p in jail.expose if p.exists() and _under(p, covered)})
    return {"cmd": cmd, "cwd": str(jail.copy), "env": env, "scratch": scratch,
            "hide": sorted(hide), "readonly": readonly, "writable": [],
            "file_size_limit": FILE_SIZE_LIMIT, "scratch_size": SCRATCH_SIZE, "pids_limit": PIDS_LIMIT,
            "pass_fds": list(pass_fds)}


def seatbelt_profile(hidden: int) -> str:
    """The macOS sandbox-exec profile (SBPL) for a grader with ``hidden`` folders to hide. Paths come in as
    parameters (``-D NAME=path``, ``seatbelt_params``), never spliced into the text: ``COPY`` (the submission's
    copy), ``PRIVATE`` (its private /tmp and $HOME) and ``HIDDEN_0`` ...
    (the class folder, the reports, the other copies). The last matching rule wins: everything is allowed,
    then writes and the network are denied, writes to the private folders and the usual
    devices allowed back; reads of the hidden folders denied, of the submission's own folders allowed back."""
    return "\n".join([
        "(version 1)",
        "(allow default)",
        "(deny network*)",
        "(allow network* (remote unix-socket))",
        "(deny file-write*)",
        "(allow file-write*",
        '    (subpath (param "PRIVATE"))',
        '    (literal "/dev/null") (literal "/dev/zero") (literal "/dev/dtracehelper")',
        '    (regex #"^/dev/tty") (regex #"^/dev/fd/"))',
        *(f'(deny file-read* (subpath (param "HIDDEN_{i}")))' for i in range(hidden)),
        '(allow file-read* (subpath (param "COPY")) (subpath (param "PRIVATE")))',
        "",
    ])


def seatbelt_params(jail: Jail) -> list[tuple[str, str]]:
    """``-D`` parameters of ``seatbelt_profile``: real paths (``/tmp`` is ``/private/tmp`` on macOS)."""
    return [("COPY", os.path.realpath(jail.copy)), ("PRIVATE", os.path.realpath(jail.private)),
            *((f"HIDDEN_{i}", os.path.realpath(p)) for i, p in enumerate(jail.hide))]


def container_command(runtime: str, image: str, jail: Jail, cmd: list[str], env: dict[str, str], name: str,
                      mounts: list[Path]) -> list[str]:
    """``docker run`` / ``podman run`` for one grader: no network, no capabilities, read-only root, the copy
    and ``mounts`` (the teacher's artifacts and data, at their own paths, as the copy's links name them)
    read-only, a private ``/tmp`` and ``$HOME`` (tmpfs of ``SCRATCH_SIZE``), at most ``PIDS_LIMIT`` processes;
    the grader's own ``python3``. Nothing on the host is writable: the results come back on its standard output."""
    home = env.get("HOME", CONTAINER_HOME)
    args = [runtime, "run", "--rm", "--name", name, "--network", "none", "--read-only", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "--pids-limit", str(PIDS_LIMIT), "--init",
            "--tmpfs", f"/tmp:rw,size={SCRATCH_SIZE}", "--tmpfs", f"{home}:rw,size={SCRATCH_SIZE}",
            "-v", f"{jail.copy}:{jail.copy}:ro",
            "-w", str(jail.copy)]
    for m in mounts:
        args += ["-v", f"{m}:{m}:ro"]
    if hasattr(os, "getuid"):
        args += ["--user", f"{os.getuid()}:{os.getgid()}"]
    for key, value in sorted(env.items()):
        args += ["-e", f"{key}={value}"]
    return [*args, image, "python3", *cmd[1:]]


_LIVE: set[Run] = set()               # every run in flight, for stop_all
_LIVE_LOCK = threading.Lock()


class Run:
    """One grader started in its containment. ``poll()``/``wait(t)`` as ``Popen``; ``kill()`` ends it and
    everything it started; ``finish()`` returns ``(exit code, processes left and killed or None when they
    could not be counted)``."""

    def __init__(self, containment: Containment, proc: subprocess.Popen, *, control: int | None = None,
                 report: int | None = None, name: str | None = None):
        self.containment, self.proc = containment, proc
        self._control, self._report, self._name = control, report, name
        self.report: dict | None = None
        self.killed = False
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self):
        return self.proc.poll()

    def wait(self, timeout: float | None = None):
        return self.proc.wait(timeout)

    def _kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass

    def kill(self, *, hard: bool = False) -> None:
        """Stop the grader and everything it started (a timeout, an interrupt)."""
        self.killed = True
        if self._control is not None and not hard:
            try:
                os.write(self._control, b"kill\n")
            except OSError:
                pass
            try:
                self.proc.wait(KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        if self._name and self.containment.runtime:
            subprocess.run([self.containment.runtime, "kill", self._name], capture_output=True, timeout=60)
        if self.proc.poll() is None:
            self._kill_group()
        self.proc.wait()

    def _group_left(self) -> int | None:
        """Processes still in the grader's process group (no PID namespace): counted, then killed."""
        pgid = self.proc.pid
        pids = []
        if Path("/proc").is_dir() and platform.system() == "Linux":
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        stat = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
                    except (OSError, IndexError):
                        continue
                    if int(stat[2]) == pgid and stat[0] not in (b"Z", b"X"):
                        pids.append(int(entry))
        else:
            try:
                out = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True, timeout=30).stdout
                pids = [int(p) for p in out.split() if p.isdigit()]
            except (OSError, subprocess.SubprocessError):
                return None
        self._kill_group()
        return len(pids)

    def _group_gone(self, timeout: float = 10.0) -> None:
        """Wait (at most ``timeout`` s) until no process of the run's group is left, zombies included: after a
        hard kill the namespace's first process is reaped by the system's init, not by us."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.01)

    def finish(self) -> tuple[int | None, int | None]:
        """Wait for the end; return (exit code of the grader, processes left behind and killed)."""
        try:
            rc = self.proc.wait()
            if self.killed:
                self._group_gone()
            if self._report is not None:
                data = b""
                while True:
                    chunk = os.read(self._report, 1 << 16)
                    if not chunk:
                        break
                    data += chunk
                try:
                    self.report = json.loads(data.decode() or "null")
                except ValueError:
                    self.report = None
                if not self.report:
                    return None, None             # PID 1 died (killed with its group): nothing to count
                if self.report.get("error"):
                    return None, None
                return self.report.get("rc"), self.report.get("left")
            if self.containment.kind == "container":
                return rc, None
            return rc, self._group_left()
        finally:
            for fd in (self._control, self._report):
                if fd is not None:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            self._control = self._report = None
            with _LIVE_LOCK:
                _LIVE.discard(self)

    def setup_error(self) -> str | None:
        return (self.report or {}).get("error")


def launch(containment: Containment, jail: Jail, cmd: list[str], env: dict[str, str], log,
           pass_fds: tuple[int, ...] = ()) -> Run:
    """Start ``cmd`` (the grader) for one submission in ``containment``; its output goes to ``log`` (a file,
    never a pipe: a process the graded code leaves behind could hold a pipe open). ``pass_fds``: descriptors
    the grader inherits (its plan in, its results out); a container gets the first as its standard input and
    the second as its standard output instead."""
    common = {"stdout": log, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL, "start_new_session": True,
              "pass_fds": tuple(pass_fds)}
    if containment.kind == "namespaces":
        spec = json.dumps(namespace_spec(jail, cmd, env, tuple(pass_fds))).encode()
        spec_r, spec_w = os.pipe()
        control_r, control_w = os.pipe()
        report_r, report_w = os.pipe()
        try:
            proc = subprocess.Popen([shutil.which("unshare") or "unshare", *UNSHARE_FLAGS, sys.executable, "-I",
                                     "-S", str(INIT), str(spec_r), str(control_r), str(report_w)],
                                    **{**common, "pass_fds": (spec_r, control_r, report_w, *pass_fds)})
        except BaseException:
            for fd in (spec_r, spec_w, control_r, control_w, report_r, report_w):
                os.close(fd)
            raise
        for fd in (spec_r, control_r, report_w):
            os.close(fd)
        try:
            os.write(spec_w, spec)          # the plan is small; PID 1 reads it at once
        finally:
            os.close(spec_w)
        return Run(containment, proc, control=control_w, report=report_r)
    jail.private.mkdir(parents=True, exist_ok=True)
    if containment.kind == "sandbox-exec":
        args = [containment.runtime or "sandbox-exec", "-p", seatbelt_profile(len(jail.hide))]
        for key, value in seatbelt_params(jail):
            args += ["-D", f"{key}={value}"]
        return Run(containment, subprocess.Popen([*args, *cmd], cwd=jail.copy, env=env, **common))
    if containment.kind == "container":
        name = f"g2c-grade-{secrets.token_hex(6)}"
        mounts = sorted({p for p in jail.links if p.exists()})
        args = container_command(containment.runtime or "docker", containment.image or "", jail, cmd, env, name,
                                 mounts)
        if len(pass_fds) == 2:             # docker run -i: the plan on standard input, the results on standard output
            args[2:2] = ["-i"]
            args = [*args[:-2], "0", "1"] if args[-2:] == [str(f) for f in pass_fds] else args
            common = {**common, "stdin": pass_fds[0], "stdout": pass_fds[1], "stderr": log, "pass_fds": ()}
        return Run(containment, subprocess.Popen(args, **common), name=name)
    return Run(containment, subprocess.Popen(cmd, cwd=jail.copy, env=env, **common))


def stop_all() -> None:
    """Kill every run in flight at once (an interrupted class run): their process groups, and with them the
    namespaces (``unshare --kill-child``) or containers."""
    with _LIVE_LOCK:
        runs = list(_LIVE)
    for run in runs:
        run.killed = True
        run._kill_group()
        if run._name and run.containment.runtime:
            subprocess.run([run.containment.runtime, "kill", run._name], capture_output=True, timeout=60)


def cost(rounds: int = 15, root: Path | None = None, echo=print) -> dict[str, float]:
    """What containment adds per submission, measured here: a trivial grader (``python -c pass``) started plainly
    and inside the namespaces, and one pass of the checks after a submission (``integrity``) over ``root`` (the
    teacher's checkout, default this one), rows interleaved; medians in seconds.

        python -m g2c.course.sandbox --cost [ROUNDS]
    """
    import statistics
    import tempfile

    from . import integrity
    from .registry import REPO_ROOT

    root = Path(root or REPO_ROOT).resolve()
    home = Path(os.environ["HOME"]) if os.environ.get("HOME") else None
    kinds = {"plain start": choose_containment(uncontained=True)}
    try:
        kinds["namespaces start"] = choose_containment()
    except Unavailable as exc:
        echo(f"no sandbox here: {exc}")
    times: dict[str, list[float]] = {k: [] for k in [*kinds, "checks after a submission"]}
    with tempfile.TemporaryDirectory(prefix="g2c-cost-") as tmp:
        work = Path(tmp).resolve()
        jail = Jail(copy=work / "copy", results=work / "results", private=work / "private", hide=[work],
                    expose=[root, Path(os.path.realpath(sys.prefix)), Path(os.path.realpath(sys.base_prefix))],
                    home=home)
        jail.copy.mkdir()
        jail.results.mkdir()
        watch, _, _ = integrity.begin(root, prune=[work], home=home)
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": "/tmp"}
        for _ in range(rounds):
            for name, containment in kinds.items():
                with open(work / "log", "wb") as log:
                    start = time.monotonic()
                    launch(containment, jail, [sys.executable, "-c", "pass"], env, log).finish()
                    times[name].append(time.monotonic() - start)
            start = time.monotonic()
            integrity.changes(watch, integrity.stamp(work / "stamps"), work / "stamps")
            times["checks after a submission"].append(time.monotonic() - start)
    out = {k: statistics.median(v) for k, v in times.items()}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    for k, v in out.items():
        echo(f"{k:26s} {v * 1000:7.1f} ms (median of {rounds})")
    if len(kinds) == 2:
        echo(f"containment adds {(out['namespaces start'] - out['plain start']) * 1000:.0f} ms per grading process "
             f"and {out['checks after a submission'] * 1000:.0f} ms of checks per submission (load average "
             f"{load:.1f}, {os.cpu_count()} cores)")
    return out


if __name__ == "__main__":
    if sys.argv[1:2] != ["--cost"]:
        sys.exit("usage: python -m g2c.course.sandbox --cost [ROUNDS]")
    cost(int(sys.argv[2]) if len(sys.argv) > 2 else 15)
