"""Cost of the empirical ε audit per release (python -m benchmarks.bench_audit [flow seconds]).

The demo (specs/adult.yaml) is profiled and its channels chosen in memory; then the gate's audit
(pram_lib.pipeline.stream.audit_channels: 8 ε-LDP channels, the default samples per value through the production
samplers, the Clopper–Pearson bounds) is timed, median of 7, per variable and in all, and set against the
demo's flow time (the argument, default the median in benchmarks/RESULTS.md; the issue's limit is 5 %).
The audit runs in the validate step while Great Expectations runs in the helper process.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

from pram_lib.pipeline import release, stream
from pram_lib.pipeline.stream import _by_variable
from pram_lib.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
DEMO_FLOW_SECONDS = 7.9   # benchmarks/RESULTS.md, section 5: the demo's median flow time (own process)
REPEATS = 7


def main(flow_seconds: float = DEMO_FLOW_SECONDS) -> None:
    spec = load_spec(ROOT / "specs" / "adult.yaml").on_engine("memory")
    profile = stream.finish_profile(spec, stream.profile_pass(spec, 1))
    plan = stream.make_plan(spec, profile, release.choose_channels(spec, profile, 1), 1, None, "memory")
    audit = spec.validation.audit
    stream.audit_channels(plan, audit.confidence, audit.samples, np.random.default_rng(0))   # warm: imports
    total = []
    for r in range(REPEATS):
        t = time.perf_counter()
        result = stream.audit_channels(plan, audit.confidence, audit.samples, np.random.default_rng(r))
        total.append(time.perf_counter() - t)
    per_variable = {}
    for v, family, alist in _by_variable(plan):
        times = []
        for r in range(REPEATS):
            t = time.perf_counter()
            family.audit_draws(v, alist, audit.samples, np.random.default_rng(r))
            times.append(time.perf_counter() - t)
        per_variable[v.key] = statistics.median(times)
    median = statistics.median(total)
    print(f"ε audit of the demo: {len(result)} channels, {audit.samples:,} draws per value, "
          f"median {1000 * median:.1f} ms of {REPEATS} "
          f"({100 * median / flow_seconds:.2f}% of a {flow_seconds:g} s flow)")
    for name, seconds in per_variable.items():
        print(f"  {name:<16} {1000 * seconds:7.2f} ms")


if __name__ == "__main__":
    main(*(float(a) for a in sys.argv[1:2]))
