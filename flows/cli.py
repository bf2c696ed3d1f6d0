"""`pram-release`: run | check | diff | plan | schema | alerts | ui | verify | analyze."""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from pram_lib.pipeline.links import RELEASES_ROOT_ENV, RELEASES_URL_ENV

DEFAULT_PORT = 4200

# Prefect's settings for a privacy tool, wherever it runs from: prefect.toml is read from the working directory
# only, so the CLI sets them in its environment before Prefect is imported (every process it starts inherits
# them). No telemetry, whatever the environment says: the server's analytics (PREFECT_SERVER_ANALYTICS_ENABLED)
# and the SDK's (DO_NOT_TRACK, prefect/_internal/analytics/enabled.py). The rest of prefect.toml are defaults
# (its `home` is relative to the working directory, so it is left to prefect.toml and PREFECT_HOME).
PREFECT_ENV_FORCED = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}
PREFECT_ENV_DEFAULTS = {"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120", "PREFECT_LOGGING_LEVEL": "INFO"}
# numpy's documented switch, read when numpy is imported: no madvise(MADV_HUGEPAGE) on its large arrays. A release
# streams chunks, touching each array once or twice, so huge pages save few TLB misses, while their first touch can
# be dear: with transparent huge pages and their defrag on `madvise`, on the 2-core EPYC VMs of 2026-12-02 a new
# process filled 800 MB in 4-6 s with them and 0.3-0.5 s without, and a 10^7-row memoized release's pass 2 took
# 3.3-3.6 s without against 3.9-4.5 s with (three alternated pairs). Left as set when the environment sets it.
RUN_ENV_DEFAULTS = {"NUMPY_MADVISE_HUGEPAGE": "0"}


def run_environment(environ=os.environ) -> None:
    """Put the project's Prefect settings (prefect.toml's, and no telemetry) and numpy's (`RUN_ENV_DEFAULTS`) into
    `environ`, before Prefect or numpy is imported: every process started from here inherits them."""
    environ.update(PREFECT_ENV_FORCED)
    for name, value in {**PREFECT_ENV_DEFAULTS, **RUN_ENV_DEFAULTS}.items():
        environ.setdefault(name, value)


def _api_url(port: int) -> str:
    return f"http://127.0.0.1:{port}/api"


def choose_as_the_release(spec_path: str):
    """(spec with its targets resolved, the spec on its engine, the source's SHA-256, profile, assignments, seed):
    the profile pass and the channel choice as the release would do them; nothing written, nothing spent."""
    from pram_lib.ops.audit import sha256_file
    from pram_lib.pipeline import release, stream
    from pram_lib.pipeline.plan import resolve_targets
    from pram_lib.spec import load_spec

    spec = resolve_targets(load_spec(spec_path))   # a `target:` becomes its ε, as the release resolves it
    seed = secrets.randbits(128)
    run = spec.on_engine(spec.engine.mode)   # the profile pass, as the release would do it
    if run.engine.address:
        stream.check_dask_address(run)
    stream.check_source(run)
    digest = sha256_file(run.resolve(run.source.path))
    profile = stream.finish_profile(run, stream.profile_pass(run, seed))
    return spec, run, digest, profile, release.choose_channels(spec, profile, seed), seed


def cmd_check(args: argparse.Namespace) -> int:
    from pram_lib.core.guarantee import NotDP
    from pram_lib.families import family_of
    from pram_lib.pipeline import release
    from pram_lib.pipeline.plan import accuracy_lines, target_line
    from pram_lib.spec import SpecError

    try:
        spec, run, digest, profile, assignments, seed = choose_as_the_release(args.spec)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the source vanished or became unreadable between the checks and the read
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"spec {spec.path} OK: release '{spec.release}', source {profile.n_rows:,} rows "
          f"(sha256 {digest[:12]}…), engine {spec.engine.mode}")
    print(f"{'variable':<18} {'stratum':<22} {'S':>5} {'epsilon':>8} {'gamma':>8} {'MI nats':>9}  method")
    for v in spec.variables:
        for a in assignments:
            if a.column == v.key:
                print(family_of(v).check_line(a))
    for line in accuracy_lines(spec, profile, assignments):
        print(line)
    spent = sum(release.spent_by_variable(assignments).values())
    for v in spec.variables:
        if getattr(v, "target_details", None) is not None:
            print(f"{v.key}: {target_line(spec, v)}")
    print(f"budget: epsilon {spent:.4g} of {spec.budget:g} per record ({spec.budget - spent:.4g} left)")
    noise = [a.column for a in assignments if isinstance(a.guarantee, NotDP)]
    if noise:
        print(f"continuous, protected by noise (not differential privacy, not in the budget): {', '.join(noise)}")
    if spec.passthrough:
        print(f"pass-through (unprotected): {', '.join(spec.passthrough)}")
    public = release.public_variables(assignments)
    if public:
        print(f"public variables (epsilon = inf accepted, not in the budget): {', '.join(public)}")
    try:
        print_population_check(spec, run, profile, assignments, seed)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("nothing written.")
    return 0


def print_population_check(spec, run, profile, assignments, seed) -> None:
    """`check`'s lines on the population: a longitudinal one's predicted per-record charge, or where the release
    leaves the population's ε ledger (SpecError: the population's ledger or key cannot be read)."""
    from pram_lib.pipeline import stream

    if spec.longitudinal is not None:
        from pram_lib.ops.panel import summary_lines

        predicted = stream.predicted_charge(run, profile, assignments, seed)
        print("if released now (predicted; nothing is charged by check):")
        for line in summary_lines(spec, predicted):
            print(f"  {line}")
    if spec.population is not None and spec.longitudinal is None:
        from pram_lib.ops.ledger import bound_units, ledger_for, population_summary, units_epsilon

        # the population may be registered to another ledger (pram_lib.ops.ledger.PopulationRegistry)
        pop, ledger = spec.population, ledger_for(spec)
        used, need = ledger.spent(pop.key), units_epsilon(bound_units(spec))   # in pico-ε, summed as reserved
        print(f"population {pop.key}: epsilon {used:.4g} of cap {ledger.cap(pop.key) or pop.cap:g} spent or reserved; "
              f"this release reserves {need:.4g} ({'fits' if ledger.fits(pop.key, pop.cap, need) else 'REFUSED: over the cap'})")
        print(f"population {pop.key}: {population_summary(spec).line()}"
              + (f" (composed cap {pop.cap_composed:g} at δ = {pop.delta:g})" if pop.cap_composed else ""))
        refused = ledger.refusals(pop.key, spec.release)
        if refused:
            print(f"release {spec.release}: refused by the validation gate {refused} time(s) of at most "
                  f"{spec.validation.max_refusals} (validation.max_refusals)"
                  f"{'; REFUSED: a further run is refused before reading data' if refused >= spec.validation.max_refusals else ''}")


def cmd_diff(args: argparse.Namespace) -> int:
    """What a release of SPEC would change against the last published release of the same name; exit 0 no
    change, 1 changes, 2 error (as `kubectl diff`). Reads the source as `check` does; writes and spends nothing."""
    from pram_lib.core.jsonable import to_json
    from pram_lib.families import family_of
    from pram_lib.pipeline import diff
    from pram_lib.pipeline.plan import true_share_halfwidths
    from pram_lib.pipeline.publish import channels_document
    from pram_lib.spec import SpecError, ledger_bound

    try:
        spec, _, _, profile, assignments, _ = choose_as_the_release(args.spec)
        last = diff.last_release(spec)
        after = to_json(channels_document(spec, assignments))["channels"]
        channels = diff.compare(last.channels if last else [], after)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if last is None:
        print(f"no published release of '{spec.release}' in the private store's audit log: everything is new")
    else:
        print(f"against {last.folder} (published {last.finished})")
    for c in channels:
        if c.kind != "=" or args.all:
            print(f"{c.kind} {c.name}")
            for line in c.lines:
                print(f"    {line}")
    before = diff.published_halfwidths(last.estimates if last else None)
    rows = []
    for v in spec.variables:
        mine = [a for a in assignments if a.column == v.key]
        if mine and not family_of(v).not_planned(v, brief=True):
            for name, hw in true_share_halfwidths(spec, v, mine, profile).items():
                rows.append((name, before.get(name, math.nan), hw))
    if rows:
        print(f"largest interval half-width of the shares: published before -> predicted at the source's shares")
        for name, b, a in rows:
            print(f"  {name:<18} {'-' if math.isnan(b) else f'{b:.5f}':>9} -> {a:.5f}")
    if spec.population is not None and spec.longitudinal is None:
        from pram_lib.ops.ledger import ledger_for

        try:
            pop, ledger = spec.population, ledger_for(spec)
        except SpecError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        used, need, cap = ledger.spent(pop.key), ledger_bound(spec), ledger.cap(pop.key) or pop.cap
        print(f"ledger {pop.key}: ε {used:.4g} of cap {cap:g} -> {used + need:.4g} after this release"
              f"{'' if used + need <= cap else ' (REFUSED: over the cap)'}")
    changed = any(c.kind != "=" for c in channels)
    print("changes." if changed else "no change.", "nothing written, nothing spent.")
    return 1 if changed else 0


def cmd_alerts(args: argparse.Namespace) -> int:
    """Set up the operator's alerts on the Prefect server at PREFECT_API_URL (flows/operate.py)."""
    from datetime import timedelta

    api = os.environ.get("PREFECT_API_URL")
    if not api or not _answers(api):
        print(f"error: no Prefect server answers at PREFECT_API_URL={api or '(unset)'}. Fix: start one with "
              "`pram-release ui` and export the URL it prints", file=sys.stderr)
        return 2
    if not args.webhook.startswith(("http://", "https://")):
        print(f"error: --webhook {args.webhook!r} is not an http(s) URL. Fix: give the URL your chat or paging "
              "tool offers for incoming webhooks", file=sys.stderr)
        return 2
    if not args.window_minutes * 60 >= 10:
        print(f"error: --window-minutes {args.window_minutes:g} is under 10 seconds, the least Prefect's proactive "
              "triggers accept. Fix: give at least 0.17 (a scheduled release's usual run time, with a margin)",
              file=sys.stderr)
        return 2
    from flows.operate import set_up
    from pram_lib.spec import SpecError, load_spec

    populations = []
    for path in args.spec or sorted(Path("specs").glob("*.yaml")):
        try:
            spec = load_spec(path)
        except SpecError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if spec.population is not None and spec.population.key not in populations:
            populations.append(spec.population.key)
    for line in set_up(args.webhook, timedelta(minutes=args.window_minutes), populations):
        print(line)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """Predicted standard errors and interval half-widths of SPEC's estimates, before any ε is spent."""
    from pram_lib.pipeline import saved_plan
    from pram_lib.pipeline.plan import check_out, default_out, plan_release, render, write_plan
    from pram_lib.spec import SpecError, load_spec

    if args.save and args.no_source:
        print("error: --save records the source's SHA-256 and the channels chosen from it: it needs the source. "
              "Fix: drop --no-source", file=sys.stderr)
        return 2
    try:
        spec = load_spec(args.spec)
        out = check_out(spec, Path(args.out) if args.out else default_out(spec))
        reviewed = None
        if args.save:   # the channels and ε `check` prints, chosen as the release chooses them
            chosen, _, digest, _, assignments, _ = choose_as_the_release(args.spec)
            reviewed = saved_plan.reviewed(chosen, assignments, digest)
        plan = plan_release(spec, rows=args.rows, read_source=not args.no_source)
        files = write_plan(plan, spec, out)
        if reviewed is not None:
            saved_plan.write(Path(args.save), reviewed)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the source or a prior file unreadable, the plan folder not writable
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render(plan), end="")
    curves = sum(f.suffix == ".png" for f in files)
    print(f"\nwritten: {out} (plan.txt, plan.csv, {curves} curve{'s' if curves != 1 else ''}); nothing published, "
          "no ε spent, no ledger or audit entry.")
    if args.save:
        print(f"saved plan: {args.save} (spec and source SHA-256, channels and ε); `pram-release run {args.spec} "
              f"--plan {args.save}` publishes exactly this or refuses")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    """Print the privacy spec's JSON Schema: the committed file, or (--from-models) what the spec models give."""
    from pram_lib.pipeline.spec_schema import committed_schema_text, generated_schema_text

    sys.stdout.write(generated_schema_text() if args.from_models else committed_schema_text())
    return 0


def _positive_rows(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the planned number of records is a whole number > 0")
    return n


def _seed(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if not 0 <= n < 1 << 128:   # the spec's `seed:` range (numpy's SeedSequence refuses a negative one mid-run)
        raise argparse.ArgumentTypeError(f"{text!r}: a seed is a whole number from 0 to 2^128 - 1")
    return n


def cmd_run(args: argparse.Namespace) -> int:
    if not os.environ.get("PREFECT_API_URL"):
        print("note: PREFECT_API_URL is not set; Prefect starts a temporary server for this run (15-25 s). "
              "Start one with `pram-release ui`.", file=sys.stderr)
    spec = Path(args.spec)
    if not spec.is_file():  # before Prefect starts: nothing is created for a spec that is not there
        print(f"error: {spec}: no such spec file. Fix: check the path", file=sys.stderr)
        return 2
    if args.plan is not None and not Path(args.plan).is_file():
        print(f"error: {args.plan}: no such saved plan. Fix: save one with `pram-release plan {args.spec} --save "
              f"{args.plan}`", file=sys.stderr)
        return 2
    api = os.environ.get("PREFECT_API_URL")
    if api and not _answers(api):
        print(f"error: no Prefect server answers at PREFECT_API_URL={api}. Fix: start one with `pram-release ui` "
              "(and export the URL it prints), or unset PREFECT_API_URL for a temporary server", file=sys.stderr)
        return 2
    from flows.interrupt import interrupts_end_the_run
    from pram_lib.pipeline import sidecar

    # the helper imports GX while this imports Prefect; a spec that does not load fails the flow's first step (which
    # records it), so the helper is ended at once
    with interrupts_end_the_run(), sidecar.started_ahead() as helpers:
        if not _loads(spec):
            helpers.close(failed=True)
        return _run(spec, args)


def _loads(spec: Path) -> bool:
    """Whether the spec file loads (a cheap parse; the flow's first step loads it again and says what is wrong)."""
    from pram_lib.spec import load_spec

    try:
        load_spec(str(spec))
    except Exception:   # noqa: BLE001 - whatever it is, the flow's load step reports it (one located message)
        return False
    return True


def _run(spec: Path, args: argparse.Namespace) -> int:
    from flows.release import one_blas_thread, run_release, warm_prefect
    warm_prefect()
    one_blas_thread()
    imports_done()
    from pram_lib.spec import SpecError
    from tasks.privacy import StepFailed, full_message

    t0 = time.perf_counter()
    try:
        folder = run_release(str(spec.resolve()), seed=args.seed, engine=args.engine,
                             **({"plan": str(Path(args.plan).resolve())} if args.plan else {}))
    except KeyboardInterrupt:   # Ctrl-C: the flow cleaned up before it let the interrupt through
        print("interrupted: the run stopped and was cleaned up (staging folder removed, ε reservation settled or "
              "cancelled, audit entry written; see the run's summary in the Prefect UI)", file=sys.stderr)
        return 130
    except (SpecError, StepFailed) as exc:
        return _report_failure(exc)
    except Exception as exc:
        if StepFailed.wrap(exc).user_error:  # the gate's refusal, the disk, the ledger's database
            return _report_failure(exc)
        if getattr(exc.__cause__, "folder", None) is not None:
            return _report_failure(exc)
        print(f"error (a programming error, please report it):\n{full_message(exc)}", file=sys.stderr)
        return 1
    flow_time = time.perf_counter() - t0
    print(f"release: {folder}")
    print(f"flow time: {flow_time:.1f} s")
    if args.timings:
        print_timings(flow_time)
    return 0


def print_timings(flow_time: float) -> None:
    """Where the run's time went: seconds inside each step (in order; a step run twice is summed), and the
    rest (Prefect's task and API round trips, the flow between steps)."""
    from tasks.steps import take_timings

    spent: dict[str, float] = {}
    for name, start, end in take_timings():
        spent[name] = spent.get(name, 0.0) + end - start
    rest_label = "Prefect and the flow between steps"
    width = max([len(n) for n in spent] + [len(rest_label)])
    print(f"{'step':<{width}} {'s':>7} {'share':>6}")
    for name, seconds in spent.items():
        print(f"{name:<{width}} {seconds:>7.2f} {100 * seconds / flow_time:>5.0f}%")
    rest = flow_time - sum(spent.values())
    print(f"{rest_label:<{width}} {rest:>7.2f} {100 * rest / flow_time:>5.0f}%")


def _report_failure(exc: BaseException) -> int:
    """One message for a failed run, no traceback; a release published before the failure is said plainly."""
    from tasks.privacy import StepFailed, full_message

    run = exc if isinstance(exc, StepFailed) else exc.__cause__
    folder, unrecorded = getattr(run, "folder", None), getattr(run, "unrecorded", [])
    if folder is not None:
        print(f"release: {folder}")
        print(f"PUBLISHED: the release above is whole and public; a step after publication failed: "
              f"{full_message(exc)}", file=sys.stderr)
        for what in unrecorded:
            print(f"could not record: {what}; the next run on this private store records it", file=sys.stderr)
        print("Do not rerun to publish it again.", file=sys.stderr)
        return 3
    print(f"error: {full_message(exc)}", file=sys.stderr)
    for what in unrecorded:
        print(f"could not record: {what}; the next run on this private store records it", file=sys.stderr)
    return 2 if isinstance(exc, StepFailed) and exc.user_error or not isinstance(exc, StepFailed) else 1


def _answers(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=5) as r:
            return r.status == 200
    except (OSError, ValueError):
        return False


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
    (home / "server.pid").write_text(json.dumps({"pid": proc.pid, "port": port}))  # `ui --stop` checks both
    _wait_until_up(proc, lambda: _healthy(port), timeout, 1.0, "prefect server", home / "server.log")
    return proc.pid, url


def _wait_until_up(proc: subprocess.Popen, up, timeout: float, poll: float, what: str, log: Path) -> None:
    """Wait until `up()` (a started server answers); raise naming its log if it exits or times out first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if up():
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited early; see {log}")
        time.sleep(poll)
    raise RuntimeError(f"{what} did not answer after {timeout:.0f} s; see {log}")


def _home_flag(home: str) -> str:
    return "" if home == ".prefect-home" else f" --home {home}"


def start_file_server(home: Path, root: Path, port: int, timeout: float = 30) -> tuple[int | None, str]:
    """Serve the public release folders under `root` read-only on 127.0.0.1 (the standard library's http.server,
    in a process of its own: `python -m pram_lib.pipeline.links`), so that the run summary's folder link opens
    in a browser: a page served over http may not link to file://. Returns (pid or None when one is already up, its URL)."""
    url = f"http://127.0.0.1:{port}/"
    if _serves(url):
        return None, url
    root.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    log = open(home / "files.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "pram_lib.pipeline.links", str(port), str(root)], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    (home / "files.pid").write_text(json.dumps({"pid": proc.pid, "port": port, "root": str(root)}))
    _wait_until_up(proc, lambda: _serves(url), timeout, 0.2, "the release file server", home / "files.log")
    return proc.pid, url


def _serves(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def stop_file_server(home: Path) -> str | None:
    """Stop the file server `ui` started for `home` (its pid file names it); what was done, or None."""
    pid_file = home / "files.pid"
    if not pid_file.exists():
        return None
    try:
        pid = int(json.loads(pid_file.read_text())["pid"])
        argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
        ours = b"pram_lib.pipeline.links" in argv and os.getpgid(pid) == pid
    except (OSError, ValueError, KeyError, TypeError):
        ours = False
    pid_file.unlink(missing_ok=True)
    if not ours:
        return "stale files.pid removed, nothing killed"
    try:
        os.killpg(pid, 15)
    except ProcessLookupError:
        pass
    return f"release file server stopped (pid {pid})"


def _not_our_server(pid: int, port: int | None, home: Path) -> str | None:
    """Why process `pid` is not the Prefect server `ui` started for `home` (None: it is)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "no such process"
    except PermissionError:
        return "the process belongs to another user"
    proc = Path("/proc") / str(pid)
    try:
        argv = (proc / "cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return "no such process"
    except OSError as exc:
        return f"its command line cannot be read ({exc.strerror})"
    args = [a.decode(errors="replace") for a in argv]
    if not any(a == "prefect" or a.endswith("/prefect") for a in args) or "server" not in args:
        return "it is not a Prefect server"
    if port is not None and str(port) not in args:
        return f"it is not a Prefect server on port {port}"
    try:
        env = dict(x.split(b"=", 1) for x in (proc / "environ").read_bytes().split(b"\0") if b"=" in x)
    except OSError:
        return None  # not readable: the command line had to do
    their_home = env.get(b"PREFECT_HOME", b"").decode(errors="replace")
    if not their_home or Path(their_home).resolve() != home:
        return f"its PREFECT_HOME is {their_home or 'unset'}, not {home}"
    return None


def cmd_ui(args: argparse.Namespace) -> int:
    home = Path(args.home).resolve()
    if args.stop:
        stopped = stop_file_server(home)
        if stopped:
            print(stopped)
        pid_file = home / "server.pid"
        if not pid_file.exists():
            print(f"no server.pid in {home}: nothing to stop")
            return 0
        try:
            text = pid_file.read_text().strip()
            doc = json.loads(text) if text.startswith("{") else {"pid": int(text)}  # older files: the pid only
            pid, port = int(doc["pid"]), doc.get("port")
            port = int(port) if port is not None else None
            why = None if pid > 1 else "not a process id of ours"
        except (OSError, ValueError, KeyError, TypeError):
            pid, why = None, "it does not hold a process id"
        why = why or _not_our_server(pid, port, home)
        if why is not None:
            pid_file.unlink(missing_ok=True)
            print(f"stale {pid_file} removed, nothing killed: pid {pid} is not this project's Prefect server ({why})")
            return 0
        try:  # `ui` started the server in a session of its own: its process group id is its pid
            if os.getpgid(pid) == pid:
                os.killpg(pid, 15)
            else:
                os.kill(pid, 15)
        except ProcessLookupError:
            pass
        pid_file.unlink(missing_ok=True)
        print(f"server stopped (pid {pid})")
        return 0
    pid, url = start_server(home, args.port)
    ui = url.removesuffix("/api")
    print(f"Prefect UI: {ui}  (API {url}; database {home / 'prefect.db'}"
          f"{'' if pid is None else f'; pid {pid}, stop with: pram-release ui --stop' + _home_flag(args.home)})")
    print(f"export PREFECT_API_URL={url}")
    root = Path(args.releases).resolve()
    files_pid, files_url = start_file_server(home, root, args.files_port or args.port + 1)
    print(f"Release folders under {root}: {files_url}  (read-only, 127.0.0.1; the run summary links there)")
    print(f"export {RELEASES_URL_ENV}={files_url} {RELEASES_ROOT_ENV}={root}")
    return 0


EXIT_FAIL, EXIT_AUDIT_NOT_CHECKED, EXIT_WARN = 1, 3, 4


def cmd_verify(args: argparse.Namespace) -> int:
    """Exit 0: every check OK; 1: a check FAILed; 3: AUDIT NOT CHECKED (no audit log given or found);
    4: no failure, but a WARNing (e.g. the audit log has no head file yet)."""
    from pram_lib.ops.audit import LOCAL_LIMIT
    from pram_lib.ops.verify import audit_for_spec, find_audit, verify_release
    from pram_lib.spec import SpecError

    folder = Path(args.release)
    audit, how = None, ""
    if args.audit:
        audit = Path(args.audit)
    elif args.spec:
        try:
            audit, how = audit_for_spec(args.spec), f"from spec {args.spec}"
        except SpecError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    else:
        audit, how = find_audit(folder)
    if audit is not None and how:
        print(f"audit log: {audit} ({how})")
    status = {True: "OK   ", None: "WARN ", False: "FAIL "}
    results = verify_release(folder, audit, args.head)
    for good, msg in results:
        print(status[good] + msg)
    if audit is not None and args.head is None:
        print(f"note: {LOCAL_LIMIT}")
    if audit is None:
        print(f"AUDIT NOT CHECKED: {how}. Only the files were checked against manifest.json, which whoever "
              f"rewrote the data could have rewritten too. Give the audit log with --audit "
              f"<private_store>/audit.jsonl or --spec SPEC (exit {EXIT_AUDIT_NOT_CHECKED}).")
    if any(g is False for g, _ in results):
        return EXIT_FAIL
    if audit is None:
        return EXIT_AUDIT_NOT_CHECKED
    return EXIT_WARN if any(g is None for g, _ in results) else 0


def cmd_analyze(args: argparse.Namespace) -> int:
    """Tables, means and regressions from a published release, corrected for its channels (exit 2 on bad input)."""
    from pram_lib.analysis import ReleaseError, open_release

    try:
        release = open_release(args.release, verify=not args.no_verify)
        if args.what == "describe":
            import pandas as pd

            print(f"release {release.name}: {len(release.files)} data file(s)")
            print(pd.DataFrame(release.describe()).to_string(index=False))
            return 0
        if args.what == "table":
            result = release.table(args.variables, by=args.by, confidence=args.confidence, mle=args.mle)
        elif args.what == "mean":
            result = release.mean(args.variable, by=args.by, confidence=args.confidence, scale=args.scale)
        else:
            reference = {}
            for item in args.reference or []:
                column, sep, category = item.partition("=")
                if not sep:
                    raise ReleaseError(f"--reference {item!r}: write COLUMN=CATEGORY, e.g. race=White")
                reference[column] = category
            result = release.regress(args.formula, family=args.family, confidence=args.confidence,
                                     success=args.success, reference=reference)
    except ReleaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(result)
    if args.csv:
        result.to_frame().to_csv(args.csv, index=False)
        print(f"written: {args.csv}")
    return 0


def _analyze_parser(sub) -> None:
    p = sub.add_parser("analyze", help="estimate tables, means and regressions from a published release, "
                       "corrected for its channels")
    p.add_argument("release", help="the release folder")
    p.add_argument("--no-verify", action="store_true", help="skip checking the files against manifest.json")
    what = p.add_subparsers(dest="what", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--confidence", type=float, default=0.95, help="interval level (default 0.95)")
    common.add_argument("--csv", default=None, help="also write the result as CSV to this file")
    what.add_parser("describe", help="list the columns, their kind and channel")
    t = what.add_parser("table", parents=[common], help="estimated true joint distribution of categorical columns")
    t.add_argument("variables", nargs="+")
    t.add_argument("--by", nargs="+", default=None, help="give the distribution within each true cell of these")
    t.add_argument("--mle", action="store_true", help="also the maximum-likelihood estimate (can take seconds)")
    m = what.add_parser("mean", parents=[common], help="estimated true mean and variance of a continuous column")
    m.add_argument("variable")
    m.add_argument("--by", nargs="+", default=None, help="within each true cell of these categorical columns")
    m.add_argument("--scale", choices=["original", "released"], default="original",
                   help="for a log1p-released column: the mean of x (original) or of log(1 + x) (released)")
    r = what.add_parser("regress", parents=[common], help="regression corrected for the channels, e.g. "
                        "'income ~ education + sex' (naive fit beside)")
    r.add_argument("formula")
    r.add_argument("--family", choices=["gaussian", "binomial"], default="gaussian")
    r.add_argument("--success", default=None, help="binomial: the response category modelled (default: the second)")
    r.add_argument("--reference", nargs="+", default=None, metavar="COLUMN=CATEGORY",
                   help="code a categorical covariate against this category (default: its first)")
    p.set_defaults(func=cmd_analyze, csv=None)


def main(argv: list[str] | None = None) -> int:
    run_environment()   # before anything imports Prefect or numpy
    ap = argparse.ArgumentParser(prog="pram-release", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    _release_parsers(sub)
    _operator_parsers(sub)
    _analyze_parser(sub)
    args = ap.parse_args(argv)
    return args.func(args)


def console() -> None:
    """The `pram-release` command (pyproject's entry point): `main`, then the interpreter's usual exit, with the
    objects made so far frozen out of the garbage collector (the standard library's gc.freeze). At exit the
    collector otherwise walks every object the run left (Prefect, pandas, scipy, the release's tables): 0.5-0.6 s
    of a 6 s demo run, for memory the process gives back anyway. Reference counting still frees them, files close
    and atexit handlers run (Prefect drains its logs and events) as usual. For `run`, the collector is also off
    while the release's modules are imported (`imports_done` turns it back on): importing Prefect, pandas, scipy
    and pram_lib set off four full collections over everything imported so far, 0.25 s of the demo's CPU. Not in
    `main`: in-process callers (tests, notebooks) keep their collector."""
    if sys.argv[1:2] == ["run"]:
        gc.disable()
    code = main()
    gc.freeze()
    sys.exit(code)


def imports_done() -> None:
    """The collector back on after `console` turned it off for the imports, the imported modules' objects frozen
    out of it (they live as long as the process); nothing when it is on (in-process callers)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def _release_parsers(sub) -> None:
    """The curator's commands: run, check, diff, plan."""
    p = sub.add_parser("run", help="run the release flow for SPEC and print the release folder")
    p.add_argument("spec")
    p.add_argument("--seed", type=_seed, default=None, help="fix the seed (tests, reproductions); default OS entropy")
    p.add_argument("--engine", choices=["memory", "stream", "dask"], default=None,
                   help="override the spec's engine.mode: the source as one chunk in memory, chunks on one core, "
                   "or chunks on Dask")
    p.add_argument("--timings", action="store_true", help="print where the run's time went, step by step")
    p.add_argument("--plan", default=None, metavar="PLAN_JSON", help="publish exactly what `plan --save` saved, "
                   "or refuse before any ε is reserved, naming what differs (spec, source, a channel or ε)")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("check", help="check SPEC and source; print the channels it would choose; write nothing")
    p.add_argument("spec")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("diff", help="what a release of SPEC would change against the last published release of "
                       "the same name (channels, ε, matrices, categories, half-widths, ledger); exit 0 no change, "
                       "1 changes, 2 error; writes and spends nothing")
    p.add_argument("spec")
    p.add_argument("--all", action="store_true", help="list unchanged channels too")
    p.set_defaults(func=cmd_diff)
    p = sub.add_parser("plan", help="predict the standard errors and interval half-widths of SPEC's estimates at "
                       "its ε and on a grid of ε (table, plan.csv, a curve per variable); spends no ε, publishes "
                       "nothing")
    p.add_argument("spec")
    p.add_argument("--out", default=None, help="folder for plan.txt, plan.csv and the curves (default "
                   "<private_store>/plans/<release>-<UTC time>/; never inside `output:`)")
    p.add_argument("--rows", type=_positive_rows, default=None, help="the planned number of records (overrides "
                   "the spec's `rows:`)")
    p.add_argument("--no-source", action="store_true", help="do not open the source even for the domain of a "
                   "column the spec does not declare (such variables are then not planned)")
    p.add_argument("--save", default=None, metavar="PLAN_JSON", help="also save what was reviewed (the spec's and "
                   "the source's SHA-256, the channels and ε; public values only) for `run --plan`")
    p.set_defaults(func=cmd_plan)


def _operator_parsers(sub) -> None:
    """The operator's commands: alerts, schema, ui, verify."""
    p = sub.add_parser("alerts", help="set up the operator's alerts on the Prefect server: a webhook for failed or "
                       "crashed release runs and for releases late past --window-minutes, unresponsive runs marked "
                       "Crashed, one release per population at a time (global concurrency limits)")
    p.add_argument("--webhook", required=True, help="URL that receives a JSON POST {subject, text} per alert")
    p.add_argument("--window-minutes", type=float, default=120.0,
                   help="a release run not finished this long after it was due or started is late (default 120)")
    p.add_argument("--spec", action="append", help="a spec whose population gets a concurrency limit (repeat; "
                   "default: specs/*.yaml)")
    p.set_defaults(func=cmd_alerts)
    p = sub.add_parser("schema", help="print the privacy spec's JSON Schema (pram_lib/schemas/spec.schema.json), "
                       "for editors: a spec's first line `# yaml-language-server: $schema=<path of it>`")
    p.add_argument("--from-models", action="store_true", help="generate it from the spec models (to regenerate "
                   "the committed file after changing a model)")
    p.set_defaults(func=cmd_schema)
    p = sub.add_parser("ui", help="start a local Prefect server + UI on 127.0.0.1 (database under .prefect-home)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--home", default=".prefect-home")
    p.add_argument("--releases", default="releases", help="the public release folders' root, served read-only on "
                   "127.0.0.1 so that the run summary's folder link opens (default ./releases)")
    p.add_argument("--files-port", type=int, default=None, help="the release file server's port (default --port + 1)")
    p.add_argument("--stop", action="store_true")
    p.set_defaults(func=cmd_ui)
    p = sub.add_parser("verify", help="check a release against its manifest and the audit entry that vouches "
                       "for it; exit 0 OK, 1 FAIL, 3 AUDIT NOT CHECKED, 4 WARN")
    p.add_argument("release")
    p.add_argument("--audit", default=None, help="path of the private audit log (audit.jsonl)")
    p.add_argument("--spec", default=None, help="the release's spec: its private_store/audit.jsonl is checked "
                   "(default: look for a spec publishing to the release's folder in ./specs and beside it)")
    p.add_argument("--head", default=None, help="the audit head as kept elsewhere (a copy of audit.head.json, or "
                   "its ENTRIES:SHA256 line): catches a log and head rewritten together")
    p.set_defaults(func=cmd_verify)

if __name__ == "__main__":
    sys.exit(main())
