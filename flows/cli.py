"""`pram-release`: run | check | ui | verify."""

from __future__ import annotations

import argparse
import math
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

DEFAULT_PORT = 4200


def _api_url(port: int) -> str:
    return f"http://127.0.0.1:{port}/api"


def cmd_check(args: argparse.Namespace) -> int:
    from pram_lib import release
    from pram_lib.spec import SpecError, load_spec

    try:
        spec = load_spec(args.spec)
        seed = secrets.randbits(128)
        if spec.engine.mode == "memory":
            source, digest = release.read_source(spec)
            profile = release.profile_source(source, spec)
        else:  # a source larger than memory: the profile pass in chunks, as the release would do it
            from pram_lib import stream

            stream.check_source(spec)
            digest = release.file_sha256(spec.resolve(spec.source.path))
            profile = stream.finish_profile(spec, stream.profile_pass(spec, seed))
        assignments = release.choose_channels(spec, profile, seed)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"spec {spec.path} OK: release '{spec.release}', source {profile.n_rows:,} rows "
          f"(sha256 {digest[:12]}…), engine {spec.engine.mode}")
    print(f"{'variable':<18} {'stratum':<22} {'S':>5} {'epsilon':>8} {'gamma':>8} {'MI nats':>9}  method")
    for a in assignments:
        c = a.channel
        if a.is_group:
            cl = " | ".join("+".join(c.variables) for c in c.channels)
            print(f"{a.column[:18]:<18} {'all':<22} {'group':>5} {c.epsilon:>8.4g} {c.gamma:>8.4g} {'':>9}  "
                  f"{c.method}: {cl} (dependence ε {c.epsilon_dependence:.3g})")
            continue
        if a.is_noise:
            print(f"{a.column:<18} {'all':<22} {'cont':>5} {'not DP':>8} {'':>8} {'':>9}  two-sided gamma "
                  f"theta={c.theta:.4g} eta={c.eta:.4g} (noise sd {math.sqrt(c.variance):.4g}), {c.method}")
            continue
        mi = "" if c.objective is None or math.isnan(c.objective) else f"{c.objective:.4g}"
        print(f"{a.column:<18} {a.stratum_label[:22]:<22} {c.n_inputs:>5} {c.epsilon:>8.4g} {c.gamma:>8.4g} "
              f"{mi:>9}  {c.method}{'' if c.certified else ' [not certified]'}")
    spent = sum(release.spent_by_variable(assignments).values())
    print(f"budget: epsilon {spent:.4g} of {spec.budget:g} per record ({spec.budget - spent:.4g} left)")
    noise = [a.column for a in assignments if a.is_noise]
    if noise:
        print(f"continuous, protected by noise (not differential privacy, not in the budget): {', '.join(noise)}")
    if spec.passthrough:
        print(f"pass-through (unprotected): {', '.join(spec.passthrough)}")
    public = release.public_variables(assignments)
    if public:
        print(f"public variables (epsilon = inf accepted, not in the budget): {', '.join(public)}")
    if spec.population is not None:
        from pram_lib.ledger import ledger_for
        from pram_lib.spec import ledger_bound

        pop, ledger = spec.population, ledger_for(spec)
        used, need = ledger.spent(pop.key), ledger_bound(spec)
        print(f"population {pop.key}: epsilon {used:.4g} of cap {ledger.cap(pop.key) or pop.cap:g} spent or reserved; "
              f"this release reserves {need:.4g} ({'fits' if used + need <= pop.cap + 1e-9 else 'REFUSED: over the cap'})")
    print("nothing written.")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    if not os.environ.get("PREFECT_API_URL"):
        print("note: PREFECT_API_URL is not set; Prefect starts a temporary server for this run (15-25 s). "
              "Start one with `pram-release ui`.", file=sys.stderr)
    from flows.release import release_flow
    from pram_lib.spec import SpecError

    t0 = time.perf_counter()
    try:
        folder = release_flow(str(Path(args.spec).resolve()), seed=args.seed, engine=args.engine)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"release: {folder}")
    print(f"flow time: {time.perf_counter() - t0:.1f} s")
    return 0


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"{_api_url(port)}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def start_server(home: Path, port: int, timeout: float = 180) -> tuple[int | None, str]:
    """Start `prefect server start` on 127.0.0.1 in the background (unless one is up); wait until healthy."""
    url = _api_url(port)
    if _healthy(port):
        return None, url
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": url}
    log = open(home / "server.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    (home / "server.pid").write_text(str(proc.pid))
    deadline = time.time() + timeout
    while time.time() < deadline:
        if _healthy(port):
            return proc.pid, url
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited early; see {home / 'server.log'}")
        time.sleep(1)
    raise RuntimeError(f"prefect server not healthy after {timeout:.0f} s; see {home / 'server.log'}")


def cmd_ui(args: argparse.Namespace) -> int:
    home = Path(args.home).resolve()
    if args.stop:
        pid_file = home / "server.pid"
        if pid_file.exists():
            try:
                os.killpg(int(pid_file.read_text()), 15)
            except ProcessLookupError:
                pass
            pid_file.unlink()
            print("server stopped")
        return 0
    pid, url = start_server(home, args.port)
    ui = url.removesuffix("/api")
    print(f"Prefect UI: {ui}  (API {url}; database {home / 'prefect.db'}"
          f"{'' if pid is None else f'; pid {pid}, stop with: pram-release ui --stop'})")
    print(f"export PREFECT_API_URL={url}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from pram_lib.verify import verify_release

    ok = True
    for good, msg in verify_release(Path(args.release), Path(args.audit) if args.audit else None):
        print(("OK   " if good else "FAIL ") + msg)
        ok = ok and good
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pram-release", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="run the release flow for SPEC and print the release folder")
    p.add_argument("spec")
    p.add_argument("--seed", type=int, default=None, help="fix the seed (tests, reproductions); default OS entropy")
    p.add_argument("--engine", choices=["memory", "stream", "dask"], default=None,
                   help="override the spec's engine.mode: all in memory, chunks on one core, or chunks on Dask")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("check", help="check SPEC and source; print the channels it would choose; write nothing")
    p.add_argument("spec")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("ui", help="start a local Prefect server + UI on 127.0.0.1 (database under .prefect-home)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--home", default=".prefect-home")
    p.add_argument("--stop", action="store_true")
    p.set_defaults(func=cmd_ui)
    p = sub.add_parser("verify", help="recompute a release's manifest hashes (and the audit chain)")
    p.add_argument("release")
    p.add_argument("--audit", default=None, help="path of the private audit log (audit.jsonl)")
    p.set_defaults(func=cmd_verify)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
