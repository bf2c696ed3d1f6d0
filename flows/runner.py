"""The warm runner: a process beside the Prefect server that holds everything a release imports (Prefect,
pandas, pyarrow, scipy, Great Expectations, matplotlib, pram_lib), so that `pram-release run` does not
spend 3-6 CPU-seconds importing them on every run.

`pram-release ui` starts it (:func:`start_runner`); it listens on a Unix socket in a folder only this user
can enter (:func:`socket_path`). `pram-release run` (:func:`delegate`) sends its arguments, working folder,
environment and its terminal's file descriptors; the runner forks a copy of itself that runs the same CLI
code on the caller's terminal (a forked copy also serves as the release's validation sidecar), then reports
the exit status back. The copy is the caller's run in every way that matters: its output goes to the
caller's terminal, Ctrl-C and `kill` reach it, and it is killed when the caller dies.

The runner is used only when it is exactly the process the caller would have been: the same Python, the
same code (file times and sizes), the same Prefect API and the same environment for everything read when
modules are imported (:data:`IMPORT_TIME_PREFIXES`). Otherwise the caller runs cold, in itself, as
without a runner; a runner whose code changed restarts itself. Nothing reaches Prefect that a cold run
would not send: the request stays on this machine, between processes of one user.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flows", "tasks", "pram_lib")
CODE_SUFFIXES = (".py", ".so", ".c", ".json")
# Environment variables read while modules are imported (Prefect's settings, BLAS threads, matplotlib's and
# GX's configuration, the temp folder Python caches): the runner's values must equal the caller's.
IMPORT_TIME_PREFIXES = ("PREFECT_", "PYTHON", "OMP_", "OPENBLAS_", "MKL_", "GOTO", "NUMEXPR_", "ARROW_", "GX_",
                        "GE_", "MPL", "XDG_", "LC_")
IMPORT_TIME_NAMES = ("HOME", "TZ", "LANG", "TMPDIR", "TEMP", "TMP", "VIRTUAL_ENV")
WARM_MODULES = ("flows.cli", "flows.release", "pandas", "pyarrow.parquet", "pyarrow.csv", "scipy.optimize",
                "scipy.special", "great_expectations", "great_expectations.expectations",
                "pram_lib.core.validate", "pram_lib.pipeline.publish", "pram_lib.pipeline.plan",
                "matplotlib.figure", "matplotlib.backends.backend_agg")
_LENGTH = struct.Struct("!I")
RUNNER_PROCESS = "flows.runner_process"   # `python -m` this to start a runner (see start_runner)
LIMITS = ("RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CPU", "RLIMIT_CORE")
FIRST_REPLY_SECONDS = 60

IN_RUNNER = False   # set in the forked copy that runs a caller's command


def socket_path(api_url: str | None) -> Path | None:
    """The runner's socket for a local Prefect API (http://127.0.0.1:PORT/api or localhost); None otherwise."""
    if not api_url:
        return None
    try:
        parts = urlsplit(api_url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme != "http" or parts.hostname not in ("127.0.0.1", "localhost") or port is None:
        return None
    return Path(f"/tmp/pram-release-runner-{os.getuid()}") / f"{port}.sock"


def _private_folder(path: Path) -> bool:
    """The socket's folder exists, is ours and nobody else may enter it."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and (st.st_mode & 0o077) == 0 and path.is_dir() and not path.is_symlink()


def code_stamp(root: Path = ROOT) -> list:
    """(path, mtime_ns, size) of every code file of the project: a change to any makes a runner stale."""
    stamp = []
    for package in PACKAGES:
        stack = [root / package]
        while stack:
            with os.scandir(stack.pop()) as entries:
                for e in entries:
                    if e.is_dir(follow_symlinks=False):
                        if e.name != "__pycache__":
                            stack.append(e.path)
                    elif e.name.endswith(CODE_SUFFIXES):
                        st = e.stat()
                        stamp.append((e.path, st.st_mtime_ns, st.st_size))
    return sorted(stamp)


def import_environment(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES) or k in IMPORT_TIME_NAMES}


def fingerprint(env: dict, root: Path = ROOT) -> dict:
    """What a caller and the runner must share for the runner to stand in for the caller."""
    code = hashlib.sha256(json.dumps(code_stamp(root)).encode()).hexdigest()
    return {"python": sys.executable, "version": sys.version, "root": str(root), "code": code,
            "environment": import_environment(env)}


def differences(mine: dict, theirs: dict) -> str | None:
    """Why fingerprint `theirs` cannot be served by a runner with fingerprint `mine` (None: it can)."""
    if mine == theirs:
        return None
    if mine["code"] != theirs.get("code") or mine["root"] != theirs.get("root"):
        return "the code changed since the runner started (it restarts itself; this run starts cold)"
    if mine["python"] != theirs.get("python") or mine["version"] != theirs.get("version"):
        return "another Python"
    a, b = mine["environment"], theirs.get("environment", {})
    names = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return f"the environment differs in {', '.join(names[:5])}{' …' if len(names) > 5 else ''}"


# -- the caller's side -----------------------------------------------------------------------------------

def _send(sock: socket.socket, doc: dict, fds: list[int] | None = None) -> None:
    payload = json.dumps(doc).encode()
    if fds:
        socket.send_fds(sock, [_LENGTH.pack(len(payload))], fds)
    else:
        sock.sendall(_LENGTH.pack(len(payload)))
    sock.sendall(payload)


def _receive_exact(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _receive(sock: socket.socket, with_fds: int = 0) -> tuple[dict, list[int]]:
    fds: list[int] = []
    if with_fds:
        head, fds, _, _ = socket.recv_fds(sock, _LENGTH.size, with_fds)
        if not head:
            raise EOFError
        head += _receive_exact(sock, _LENGTH.size - len(head))
    else:
        head = _receive_exact(sock, _LENGTH.size)
    size, = _LENGTH.unpack(head)
    return json.loads(_receive_exact(sock, size)), fds


def _connect(api_url: str | None, timeout: float = 2.0) -> socket.socket | None:
    path = socket_path(api_url)
    if path is None or not _private_folder(path.parent) or not path.exists():
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None
    return sock


def ping(api_url: str | None, env: dict | None = None) -> tuple[bool, str]:
    """(ready, why not): whether a runner answers for `api_url` and would serve a caller with `env`."""
    sock = _connect(api_url)
    if sock is None:
        return False, "no runner"
    with sock:
        try:
            _send(sock, {"ping": fingerprint(dict(os.environ if env is None else env))})
            reply, _ = _receive(sock)
        except (OSError, EOFError, ValueError):
            return False, "the runner did not answer"
    return reply.get("status") == "ready", reply.get("why", "")


LAST_ANSWER: dict = {}   # how the last `delegate` went, for `--timings`


def delegate(argv: list[str]) -> int | None:
    """Run `pram-release argv` in the warm runner of this Prefect API; its exit code, or None when no runner
    stands in for this process (then the caller runs the command itself)."""
    LAST_ANSWER.clear()
    if IN_RUNNER or os.environ.get("PRAM_NO_RUNNER") == "1":
        return None
    sock = _connect(os.environ.get("PREFECT_API_URL"))
    if sock is None:
        return None
    request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "umask": _umask(),
               "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
               "limits": _limits(), "nice": os.getpriority(os.PRIO_PROCESS, 0),
               "fingerprint": fingerprint(dict(os.environ))}
    try:
        _send(sock, request, [0, 1, 2])
    except OSError:
        sock.close()
        return None
    sock.settimeout(FIRST_REPLY_SECONDS)
    try:
        reply, _ = _receive(sock)
    except (EOFError, ValueError, ConnectionError):   # it ended before taking the run: none was started
        sock.close()
        return None
    except OSError:   # timed out: a run may have started (closing the socket ends it); this one must not run too
        sock.close()
        print(f"error: the warm runner did not answer within {FIRST_REPLY_SECONDS} s. Fix: rerun, or set "
              "PRAM_NO_RUNNER=1 to run without it (`pram-release ui --stop` then `ui` restarts it)", file=sys.stderr)
        return 1
    if reply.get("status") != "started":
        LAST_ANSWER.update(reply)
        sock.close()
        return None
    pid = int(reply["pid"])
    sock.settimeout(None)

    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(s, forward)
    try:
        end, _ = _receive(sock)
    except (OSError, EOFError, ValueError):
        end = {"status": "lost"}
    finally:
        sock.close()
    if end.get("status") == "signalled":   # die as the run died, so the caller's caller sees the same
        signum = int(end["signal"])
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return 128 + signum
    if end.get("status") != "exited":
        print("error: the warm runner ended before the run reported its end; its release, if any, is "
              "recovered by the next run. Fix: rerun (set PRAM_NO_RUNNER=1 to run without the runner)",
              file=sys.stderr)
        return 1
    return int(end["code"])


def _limits() -> dict:
    import resource

    return {name: resource.getrlimit(getattr(resource, name)) for name in LIMITS if hasattr(resource, name)}


def _unreachable_limits(theirs: dict) -> str | None:
    """The caller's resource limits a fork of the runner cannot take (a hard limit above the runner's)."""
    import resource

    def above(a: int, b: int) -> bool:
        return (a == resource.RLIM_INFINITY and b != resource.RLIM_INFINITY) or (
            b != resource.RLIM_INFINITY and a > b)

    mine = _limits()
    names = [n for n, (_, hard) in theirs.items() if n in mine and above(hard, mine[n][1])]
    return f"the resource limits {', '.join(names)} are above the runner's" if names else None


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


# -- the runner's side -----------------------------------------------------------------------------------

def serve(path: Path, command: Callable[[list[str]], int]) -> None:
    """Import everything, then answer requests until killed: each run of `command` (the CLI's main) in a forked
    copy (single-threaded here, so forking is safe)."""
    import importlib

    for name in WARM_MODULES:
        importlib.import_module(name)
    from flows.release import one_blas_thread, warm_prefect
    from pram_lib.core.fastpath import keep_uniform_kernel
    from pram_lib.core.validate import warm_up
    from pram_lib.pipeline.publish import warm_up_plots

    warm_prefect()
    warm_up()         # GX's templates compiled and its lazy imports done, once for every fork
    warm_up_plots()   # matplotlib's fonts loaded and text caches filled
    keep_uniform_kernel()   # the compiled perturbation kernel loaded and checked (20 ms a chunk worker paid per run)
    one_blas_thread()
    mine = fingerprint(dict(os.environ))
    path.parent.mkdir(mode=0o700, exist_ok=True)
    if not _private_folder(path.parent):
        raise SystemExit(f"{path.parent} is not a folder only this user can enter; runner not started")
    path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    server.bind(str(path))
    os.umask(old)
    server.listen(16)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # the monitors reap themselves

    def stop(signum, frame):
        path.unlink(missing_ok=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    print(f"runner ready on {path} (pid {os.getpid()})", flush=True)
    while True:
        conn, _ = server.accept()
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        if uid != os.getuid():
            conn.close()
            continue
        if differences(mine, fingerprint(dict(os.environ))) is not None:   # our own code changed: reload
            _refuse(conn, differences(mine, fingerprint(dict(os.environ))))
            server.close()
            path.unlink(missing_ok=True)
            os.execv(sys.executable, [sys.executable, "-m", RUNNER_PROCESS, str(path)])
        if os.fork() == 0:
            server.close()
            try:
                _monitor(conn, mine, command)
            finally:
                os._exit(0)
        conn.close()


def _refuse(conn: socket.socket, why: str) -> None:
    try:
        _send(conn, {"status": "stale", "why": why})
    except OSError:
        pass
    conn.close()


def _monitor(conn: socket.socket, mine: dict, command: Callable[[list[str]], int]) -> None:
    """One request: answer a ping, or fork the run, relay its end to the caller, and kill it if the caller
    goes away first."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    conn.settimeout(10)
    try:
        request, fds = _receive(conn, with_fds=3)
    except (OSError, EOFError, ValueError):
        return
    why = differences(mine, request.get("fingerprint") or request.get("ping") or {})
    if "ping" in request:
        _send(conn, {"status": "ready" if why is None else "stale", "why": why or ""})
        return
    why = why or _unreachable_limits(request.get("limits", {}))
    if why is not None or len(fds) != 3:
        _refuse(conn, why or "the caller's terminal was not passed")
        return
    pid = os.fork()
    if pid == 0:
        conn.close()
        _become_caller(request, fds, command)   # never returns
    for fd in fds:
        os.close(fd)
    _send(conn, {"status": "started", "pid": pid})
    conn.settimeout(None)
    child = os.pidfd_open(pid)
    while True:
        ready, _, _ = select.select([conn, child], [], [])
        if child in ready:
            _, status = os.waitpid(pid, 0)
            if os.WIFSIGNALED(status):
                end = {"status": "signalled", "signal": os.WTERMSIG(status)}
            else:
                end = {"status": "exited", "code": os.waitstatus_to_exitcode(status)}
            try:
                _send(conn, end)
            except OSError:
                pass
            return
        if conn in ready and not conn.recv(1):   # the caller is gone (killed): so is its run
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return


def _become_caller(request: dict, fds: list[int], command: Callable[[list[str]], int]) -> None:
    """In the forked copy: take the caller's terminal, folder and environment, run its command, exit."""
    code = 1
    try:
        os.setsid()   # stopping the runner (its process group) does not stop a release under way
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.umask(int(request["umask"]))
        if request.get("affinity") and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, request["affinity"])
        import resource

        for name, (soft, hard) in request.get("limits", {}).items():
            resource.setrlimit(getattr(resource, name), (soft, hard))
        niceness = int(request.get("nice", 0)) - os.getpriority(os.PRIO_PROCESS, 0)
        if niceness > 0:
            os.nice(niceness)
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
            signal.signal(s, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        global IN_RUNNER
        IN_RUNNER = True
        from pram_lib.pipeline import sidecar

        sidecar.FORK_WARM = True
        sys.argv = ["pram-release", *request["argv"]]
        code = command(request["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        _exit(code)


def _exit(code: int) -> None:
    """End like an interpreter would (atexit handlers: Prefect's log flush, the sidecar's stop; the standard
    streams flushed) without tearing modules down one by one (about a second with GX loaded)."""
    import atexit

    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


# -- starting and stopping -------------------------------------------------------------------------------

def start_runner(api_url: str, env: dict, log: Path, timeout: float = 120) -> tuple[int | None, str]:
    """Start the runner for `api_url` with environment `env` (the callers' environment) unless a ready one
    answers; wait until it is ready. (pid or None when one was ready, a message)."""
    import subprocess

    path = socket_path(api_url)
    if path is None:
        return None, f"no runner for a Prefect API that is not local ({api_url})"
    ready, why = ping(api_url, env)
    if ready:
        return None, f"runner ready on {path}"
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", RUNNER_PROCESS, str(path)], env=env, cwd=ROOT,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            return None, f"the runner exited at start (see {log}); runs start cold"
        if ping(api_url, env)[0]:
            return proc.pid, f"runner ready on {path} (pid {proc.pid})"
        time.sleep(0.2)
    proc.kill()
    return None, f"the runner was not ready after {timeout:.0f} s (see {log}); runs start cold"
