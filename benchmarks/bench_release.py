"""End-to-end releases of a synthetic census: 10^6, 10^7 and 10^8 rows (python -m benchmarks.bench_release).

Each run is `pram-release run SPEC --engine E` in a fresh process against one local Prefect server
(started once; its start is not timed): read Parquet, profile, choose channels, perturb six variables,
validate (GX on a row sample + exact checks on every row), write Parquet parts, report, manifest, audit.
Peak RSS is the largest sum of resident memory over the run's process tree (the flow process, and for
engine dask its scheduler, nannies and workers), sampled every 50 ms.

Engines: `stream` (chunks in one process) pinned to CPU 0 with taskset ("1 core": pyarrow's I/O threads,
the release's reader/writer threads and its sidecar share that core) and, from 10^7 rows, unpinned ("1 process,
2 cores": two chunks at a time on threads, the sidecar on the other core), and `dask` (a local cluster of 2
worker processes, unpinned);
`memory` (the whole source as one chunk of the same engine, also pinned) at 10^6 rows, against the old
separate in-memory engine's figures (OLD_MEMORY_ENGINE_1E6).
Floors (issue 6): 10^7 rows in <= 60 s; 10^8 rows with peak RSS <= 2 GiB. Issue 15: at 10^7 rows the flow time
within 2x a plain pyarrow + numpy script (benchmarks/baseline_plain.py, timed in the same run, pinned and not);
at 10^8 rows Dask on 2 workers faster than one core.
Census files are cached in .bench-data/ (10^8 rows: about 400 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from benchmarks.census import write_census, write_spec
from benchmarks.results_io import compile_project, measured_note

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / ".bench-data"
RESULTS = Path(__file__).resolve().parent / "results"
PORT = 4291
FLOOR_SECONDS_1E7 = 60.0
FLOOR_RSS_1E8 = 2 * 1024 ** 3
# The separate in-memory engine that `mode: memory` was until commit 7f10348 (issue 14 removed it), measured at
# 10^6 rows on this machine by this benchmark at that commit (git worktree, 2026-11-24 08:30 UTC): flow s, MiB.
# Floor of issue 14: a one-chunk release (`mode: memory` today) is no slower and no larger.
OLD_MEMORY_ENGINE_1E6 = (11.9, 1116)
REPEATS_1E7 = 3   # issue 15's floors are on medians: each 10^7 stream run and its baseline, 3 times


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    """The process and its descendants (those alive now: one may end while they are listed)."""
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return [proc]


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in _tree(proc):
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def _pss(p: psutil.Process) -> int:
    try:
        return p.memory_full_info().pss
    except psutil.Error:   # ended meanwhile
        return 0


def tree_pss(proc: psutil.Process) -> int:
    """Proportional set size of a process tree: pages shared between processes (a fork and its parent) count
    once in all, split among them; RSS would count them in each."""
    return sum(_pss(p) for p in _tree(proc))


def communicate_sampling_rss(proc: subprocess.Popen, runner: int | None = None) -> tuple[str, str, int]:
    """proc.communicate(), sampling the peak RSS of its process tree every 50 ms meanwhile: (out, err, peak).
    With a warm runner's pid: the peak PSS of the caller and of the runner's descendants (the run it forked and
    the run's forked sidecars, which share most of their pages with the runner: RSS would count those pages
    once per process); the idle runner's own share is left out."""
    peak, ps = 0, psutil.Process(proc.pid)
    forks = psutil.Process(runner) if runner else None
    stop = threading.Event()

    def sample():
        nonlocal peak
        while not stop.is_set():
            if forks is None:
                total = tree_rss(ps)
            else:
                total = tree_pss(ps) + sum(_pss(p) for p in _tree(forks)[1:])   # not the idle runner itself
            peak = max(peak, total)
            time.sleep(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = proc.communicate()
    stop.set()
    th.join()
    return out, err, peak


PHASES = {  # task name -> phase of the breakdown table (other tasks of the run are counted as "rest")
    "profile-pass": "pass 1: profile", "profile-chunks": "pass 1: profile",
    "choose-channels": "choose channels",
    "perturb-pass": "pass 2: perturb + write", "perturb-chunks": "pass 2: perturb + write",
    "estimate": "estimate + validate (side by side)", "validate": "estimate + validate (side by side)",
    "publish": "publish (report, manifest)",
}


def phase_times(since: float, env: dict) -> dict:
    """Seconds per phase of the run that started after `since` (epoch s), from its task runs on the server.
    A phase run as many tasks (dask) counts from its first start to its last end; "before pass 1" is the
    time from the run's first task to the first profile task (for dask: mostly starting the local cluster)."""
    import asyncio

    os.environ.update({k: env[k] for k in ("PREFECT_API_URL", "PREFECT_HOME")})
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import TaskRunSort

    async def read():  # the newest 200 task runs (the server's limit); one release has a few dozen
        async with get_client() as client:
            return await client.read_task_runs(sort=TaskRunSort.EXPECTED_START_TIME_DESC, limit=200)

    runs = [t for t in asyncio.run(read()) if t.start_time and t.end_time and t.start_time.timestamp() >= since]
    spans: dict[str, list[float]] = {}
    for t in runs:
        phase = PHASES.get(t.name.rsplit("-", 1)[0], "rest")
        a, b = t.start_time.timestamp(), t.end_time.timestamp()
        lo, hi = spans.get(phase, [a, b])
        spans[phase] = [min(lo, a), max(hi, b)]
    if not runs or "pass 1: profile" not in spans:
        return {}
    first, last = min(t.start_time.timestamp() for t in runs), max(t.end_time.timestamp() for t in runs)
    out = {"before pass 1": spans["pass 1: profile"][0] - first}
    out.update({p: spans[p][1] - spans[p][0] for p in dict.fromkeys(PHASES.values()) if p in spans})
    out["rest"] = (last - first) - sum(out.values())
    return out


def run_release(spec: Path, engine: str, env: dict, pinned: bool = True, runner: int | None = None,
                memory: bool = True) -> dict:
    """One `pram-release run`: flow and wall seconds, peak memory (unless `memory` is False: reading PSS walks
    every page table of every process and takes half a core on this machine, so a warm-runner run is timed
    without it and its memory is read in another run), folder, bytes, phases."""
    t0 = time.perf_counter()
    since = time.time()
    pin = ["taskset", "-c", "0"] if pinned and engine != "dask" and shutil.which("taskset") else []
    proc = subprocess.Popen([*pin, str(ROOT / ".venv" / "bin" / "pram-release"), "run", str(spec), "--engine", engine,
                             "--seed", "20261123", "--timings"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=ROOT)
    if memory:
        out, _, peak = communicate_sampling_rss(proc, runner)
    else:
        out, peak = proc.communicate()[0], 0
    wall = time.perf_counter() - t0
    if runner is not None and "started in the warm runner" not in out:
        raise RuntimeError(f"the warm runner did not take the run:\n{out[-2000:]}")
    if proc.returncode != 0:
        raise RuntimeError(f"release failed ({engine}):\n{out[-4000:]}")
    folder = Path(re.search(r"^release: (.+)$", out, re.M).group(1))
    flow = float(re.search(r"^flow time: ([\d.]+) s$", out, re.M).group(1))
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    try:
        phases = phase_times(since, env)
    except Exception as exc:  # noqa: BLE001 - the breakdown is a note; the timings above stand without it
        print(f"phase breakdown unavailable: {type(exc).__name__}: {exc}", flush=True)
        phases = {}
    return {"wall": wall, "flow": flow, "peak_rss": peak, "folder": folder, "bytes": size, "phases": phases}


def _median_run(spec: Path, engine: str, env: dict, pinned: bool, runner: int | None, repeats: int, warm_up: bool,
                keep: bool) -> dict:
    """run_release `repeats` times: the run of median flow time, with the largest peak memory of them all. With
    `warm_up`, one run before them measures the memory and the timed runs read none: the sampler's thread
    walks the process tree every 50 ms beside the release (0.1 s of a 3.4 s flow on 2 cores, measured
    2026-12-02), which the plain script it is compared with does not carry."""
    peaks = []
    if warm_up:
        first = run_release(spec, engine, env, pinned, runner)
        peaks.append(first["peak_rss"])
        shutil.rmtree(first["folder"])
    runs = [run_release(spec, engine, env, pinned, runner, memory=not warm_up) for _ in range(repeats)]
    median = sorted(runs, key=lambda r: r["flow"])[len(runs) // 2]
    for r in runs:
        if r is not median and not keep:
            shutil.rmtree(r["folder"])
    return {**median, "peak_rss": max(peaks + [r["peak_rss"] for r in runs]), "flows": [r["flow"] for r in runs]}


def _perturb_run(plan, refs) -> float:
    from pram_lib.pipeline import stream

    t = time.perf_counter()
    stream.perturb_batch(plan, [(r, r) for r in refs])
    return time.perf_counter() - t


def parallel_ceiling(source: Path, work: Path, k: int = 4) -> tuple[float, float, float]:
    """What two processes gain on this machine without Prefect or Dask: k chunks perturbed in one process,
    then 2 x k chunks in two processes at once (the same work per process). Returns (serial s, parallel s,
    speedup = 2 t_serial / t_parallel)."""
    import tempfile
    from concurrent.futures import ProcessPoolExecutor

    from pram_lib.pipeline import release, stream
    from pram_lib.spec import load_spec

    work.mkdir(parents=True, exist_ok=True)
    spec = load_spec(write_spec(work / "ceiling.yaml", source, work / "r", work / "p", rows=0, seed=1))
    refs = stream.plan_chunks(spec)[: 3 * k]
    profile = stream.finish_profile(spec, stream.profile_batch(spec, [(r, r) for r in refs[:1]], 1))
    plan = stream.make_plan(spec, profile, release.choose_channels(spec, profile, 1), 1, Path(tempfile.mkdtemp()))
    _perturb_run(plan, refs[:1])
    serial = _perturb_run(plan, refs[k:2 * k])
    with ProcessPoolExecutor(2) as ex:
        list(ex.map(_perturb_run, [plan, plan], [refs[:1], refs[1:2]]))  # imports, warm-up
        t = time.perf_counter()
        list(ex.map(_perturb_run, [plan, plan], [refs[k:2 * k], refs[2 * k:3 * k]]))
        parallel = time.perf_counter() - t
    return serial, parallel, 2 * serial / parallel


def plain_baseline(spec: Path, pinned: bool) -> float:
    """Seconds of benchmarks/baseline_plain.py's timed part on `spec`'s source, in a fresh process (on CPU 0 when
    `pinned`), with the numpy setting a release runs with (flows/cli.py RUN_ENV_DEFAULTS)."""
    from flows.cli import RUN_ENV_DEFAULTS

    pin = ["taskset", "-c", "0"] if pinned and shutil.which("taskset") else []
    out = subprocess.run([*pin, sys.executable, "-m", "benchmarks.baseline_plain", str(spec)], cwd=ROOT, check=True,
                         capture_output=True, text=True, env={**os.environ, **RUN_ENV_DEFAULTS}).stdout
    return float(re.search(r"plain pyarrow \+ numpy: ([\d.]+) s", out).group(1))


def main() -> None:
    compile_project()
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1e6,1e7,1e8")
    ap.add_argument("--keep", action="store_true", help="keep the release folders")
    args = ap.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    sys.path.insert(0, str(ROOT))
    from flows.cli import start_server

    DATA.mkdir(exist_ok=True)
    home = DATA / "prefect-home"
    pid, url = start_server(home, PORT)
    env = {**os.environ, "PREFECT_API_URL": url, "PREFECT_HOME": str(home), "PREFECT_LOGGING_LEVEL": "WARNING",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}   # every run imports what it needs (no daemon, issue 27)
    rows, notes, breakdown = [], [], {}
    t_all = time.perf_counter()
    try:
        for n in sizes:
            src = DATA / f"census-{n}.parquet"
            if not src.exists():
                t = time.perf_counter()
                write_census(src, n)
                print(f"generated {src.name} in {time.perf_counter() - t:.1f} s", flush=True)
            work = DATA / f"run-{n}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
            spec = write_spec(work / "census.yaml", src, work / "releases", work / "private", rows=n,
                              chunk_rows=1_000_000, workers=2, tag=str(n))
            runs = [("memory", True, False), ("stream", True, False), ("dask", False, False)]   # pinned: one core
            if n >= 10_000_000:   # one process, free to use the second core for I/O and the helper process
                runs.insert(2, ("stream", False, False))
            for engine, pinned, warm in runs:
                if engine == "memory" and n > 1_000_000:
                    continue
                repeats = REPEATS_1E7 if n == 10_000_000 and engine == "stream" else 1
                r = _median_run(spec, engine, env, pinned, None, repeats=repeats, warm_up=warm or repeats > 1,
                                keep=args.keep)
                where = "2 workers" if engine == "dask" else "1 core" if pinned else "1 process, 2 cores"
                where += ", warm runner" if warm else ""
                row = [f"{n:,}", engine, where, round(r["flow"], 1),
                       round(r["wall"], 1), round(n / r["flow"] / 1e6, 2), round(r["peak_rss"] / 2 ** 20),
                       round(r["bytes"] / 2 ** 20)]
                print(" | ".join(map(str, row)) + (f"  (median of flows {r['flows']})" if len(r["flows"]) > 1 else ""),
                      flush=True)
                rows.append(row)
                if r["phases"] and n >= 10_000_000:
                    label = engine if pinned or engine == "dask" else f"{engine} (2 cores{', warm' if warm else ''})"
                    breakdown[(f"{n:,}", label)] = r["phases"]
                if not args.keep:
                    shutil.rmtree(r["folder"])
    finally:
        if pid is not None:
            os.killpg(pid, 15)
    ceiling = None
    if any(n >= 10_000_000 for n in sizes):
        serial, parallel, ceiling = parallel_ceiling(DATA / "census-10000000.parquet", DATA / "ceiling")
        print(f"machine ceiling: 4 chunks {serial:.2f} s in one process, 2 x 4 chunks {parallel:.2f} s in two "
              f"processes: {ceiling:.2f}x", flush=True)
    verdicts = []
    if 10_000_000 in sizes:   # issue 15's baseline: a plain pyarrow + numpy script, same channels, same machine
        for pinned, where in ((True, "1 core"), (False, "1 process, 2 cores")):
            plain = statistics.median(plain_baseline(DATA / "run-10000000" / "census.yaml", pinned)
                                      for _ in range(REPEATS_1E7))
            flow = next(r[3] for r in rows if r[0] == f"{10**7:,}" and r[1] == "stream" and r[2] == where)
            print(f"plain pyarrow + numpy script at 10^7 rows ({where}): {plain:.2f} s", flush=True)
            verdicts.append(f"10^7 rows, stream ({where}): flow {flow} s = {flow / plain:.2f}x a plain pyarrow + numpy "
                            f"script (read, perturb the same channels, write; {plain:.2f} s, {where}): "
                            f"{'PASS' if flow <= 2 * plain else 'FAIL'} against issue 15's floor (<= 2x)" +
                            ("" if pinned else f"; {'PASS' if flow <= 2.5 * plain else 'FAIL'} against issue 27's "
                             "floor with no daemon (<= 2.5x)"))
    for n, engine, where, flow, _, _, rss, _ in rows:
        if n == f"{10**7:,}" and not where.startswith("1 process, 2 cores"):
            verdicts.append(f"10^7 rows, {engine}: {flow} s {'<=' if flow <= FLOOR_SECONDS_1E7 else '>'} 60 s: "
                            f"{'PASS' if flow <= FLOOR_SECONDS_1E7 else 'FAIL'}")
        if n == f"{10**6:,}" and engine == "memory":
            ok = flow <= OLD_MEMORY_ENGINE_1E6[0] and rss <= OLD_MEMORY_ENGINE_1E6[1]
            verdicts.append(f"10^6 rows, memory (one chunk of the one engine): {flow} s, {rss} MiB against the old "
                            f"in-memory engine's {OLD_MEMORY_ENGINE_1E6[0]} s, {OLD_MEMORY_ENGINE_1E6[1]} MiB: "
                            f"{'PASS' if ok else 'FAIL'}")
        if n == f"{10**8:,}":
            ok = rss * 2 ** 20 <= FLOOR_RSS_1E8
            verdicts.append(f"10^8 rows, {engine} ({where}): peak RSS {rss} MiB {'<=' if ok else '>'} 2048 MiB: "
                            f"{'PASS' if ok else 'FAIL'}")
    two = {r[0]: r[3] for r in rows if r[1] == "dask"}
    one = {r[0]: r[3] for r in rows if r[1] == "stream" and r[2] == "1 core"}
    speedups = [f"{n} rows: 2 Dask workers {one[n] / two[n]:.2f}x the one-core speed" +
                (f": {'PASS' if two[n] < one[n] else 'FAIL'} (issue 15: Dask faster than one core at 10^8)"
                 if n == f"{10**8:,}" else "") for n in one if n in two]
    notes += ["Flow time: from the flow's start to the published folder (what `pram-release run` prints as "
              "flow time; Prefect server start excluded). Wall: the whole `pram-release run` process, including "
              "Python and Prefect imports (and, for dask, starting the local cluster).",
              f"Benchmark total {time.perf_counter() - t_all:.0f} s (census generation included when not cached).",
              "Rows/s = rows / flow time. Peak RSS: largest summed RSS of the run's process tree (50 ms sampling; "
              "the release's process and its spawned helper).",
              "Six protected variables (3 optimal PRAM with DP priors, one of them stratified by sex; 2 uniform RR; "
              "1 Gamma noise with optimised (theta, eta)) plus one pass-through column; chunks of 10^6 rows.",
              f"At 10^7 rows each stream run is the median of {REPEATS_1E7} runs (issue 15's floors are on medians), "
              "timed without the memory sampler (until 2026-12-02 11:40 they were sampled, 0.1 s of a 3.4 s flow on "
              "2 cores); their peak memory is that of one more run, sampled. Each plain-script baseline is the median of "
              f"{REPEATS_1E7}, run with the release's numpy setting (NUMPY_MADVISE_HUGEPAGE=0, flows/cli.py "
              "RUN_ENV_DEFAULTS; since 2026-12-02 22:20, when releases began to set it). The machine was shared "
              "with other developers' work during the measurement.",
              *verdicts, *speedups]
    if ceiling is not None:
        big = list(one)[-1] if one else None
        reached = one[big] / two[big] if big in two else float("nan")
        notes.append(f"Parallel ceiling of this machine, measured in the same run without Prefect or Dask: perturbing "
                     f"4 chunks of 10^6 rows (read, perturb, write) took {serial:.2f} s in one process and the same "
                     f"work twice, in two processes at once, {parallel:.2f} s: {ceiling:.2f}x. The dask engine "
                     f"reached {reached:.2f}x at {big} rows.")
        passes = ("pass 1: profile", "pass 2: perturb + write")
        b1, b2 = breakdown.get((big, "stream")), breakdown.get((big, "dask"))
        if b1 and b2 and all(p in b1 and p in b2 for p in passes):
            t1, t2 = sum(b1[p] for p in passes), sum(b2[p] for p in passes)
            notes.append(f"At {big} rows the two passes over the chunks ran {t1 / t2:.2f}x faster on 2 workers "
                         f"({t2:.1f} s against {t1:.1f} s); the rest of a release is serial and takes about as long "
                         f"on either engine ({b2['before pass 1'] - b1['before pass 1']:+.1f} s before pass 1 for "
                         "starting the local cluster; channel choice, estimates, GX and publishing run once in the "
                         "flow). The passes stay short of the ceiling by Prefect's task runs on the workers and the "
                         "flow, scheduler and Prefect server sharing the same 2 cores. Dask's nannies set "
                         "MALLOC_TRIM_THRESHOLD_=65536 in their workers, which made the chunk work 1.45-1.5x slower; "
                         "the local cluster unsets it (flows/release.py: local_cluster).")
    if breakdown:
        phases = list(dict.fromkeys(p for b in breakdown.values() for p in b))
        head = "| phase (s) | " + " | ".join(f"{n} {e}" for n, e in breakdown) + " |"
        lines = [head, "|---|" + "---:|" * len(breakdown)]
        lines += [f"| {p} | " + " | ".join(f"{b.get(p, 0.0):.1f}" for b in breakdown.values()) + " |" for p in phases]
        notes.append("Where the time goes (from the runs' task runs on the Prefect server; a phase mapped over "
                     "chunks on Dask counts from its first task's start to its last task's end; 'before pass 1' "
                     "includes starting the local Dask cluster; 'rest' is the run's other tasks and the gaps between "
                     "tasks):\n\n" + "\n".join(lines) + "\n")
    notes.append(measured_note())
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_release.json").write_text(json.dumps({
        "order": 3, "section": "3. End-to-end release (read Parquet, perturb, validate, write Parquet)",
        "columns": ["rows", "engine", "workers", "flow s", "wall s", "M rows/s", "peak RSS MiB", "release MiB"],
        "rows": rows, "notes": notes}, indent=2) + "\n")
    print("\n".join(notes))


if __name__ == "__main__":
    main()
