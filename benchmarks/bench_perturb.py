"""Perturbation throughput per channel family against the raw RNG cost (python -m benchmarks.bench_perturb).

Section 2 of benchmarks/RESULTS.md (benchmarks/results/bench_perturb.json), one core, median of 5 (~1.5 min):

* family (8), ``sample_keep_uniform``, S = 10 and S = 1000 (q ~ U(0.05, 0.9)); floor: >= 50% of the raw RNG
  throughput (issue 6) and >= 20 M values/s;
* a dense 10x10 matrix with zeros, ``sample_dense`` (alias method); floor >= 5 M values/s;
* uniform RR (k-RR) k = 10, eps = 1, ``uniform_rr(k, e^eps).perturb_codes``;
* a multi-attribute group: ``rr_joint`` on 3 attributes (9 x 16 x 7 = 1,008 cells, eps = 3), ``perturb_group``;
* two-sided gamma noise (theta = 0.5, eta = 1), ``NoiseChannel.perturb``;
* the same k-RR task through the per-value clients of pure-LDP (``DEClient.privatise``) and multi-freq-ldpy
  (``GRR_Client``), installed outside the .venv by
  ``pip install --target .bench-site --no-deps -r requirements-bench.txt``; rows say so if they are missing.

Family (8) is measured like for like against numpy's own uniform draws with the same Generator (PCG64), one
double per value, each pair timed in turn (median of REPS rounds):

* into a preallocated output: ``sample_keep_uniform(codes, q, rng, out=buf)`` (how the stream engine calls it)
  against ``rng.random(out=buf)`` (the faster of a reused CHUNK-sized buffer and one faulted-in n-sized buffer);
* into a fresh output: ``sample_keep_uniform(codes, q, rng)`` against ``rng.random(n)``.

The issue-6 floor (>= 50% of the raw RNG throughput) is checked on both. The strictest pairing (fresh kernel
output against preallocated raw draws) and the kernel's own C stepping of PCG64 (``pcg64_fill``, the same
numbers as ``rng.random``) are reported beside them. Other families are compared with ``rng.random(out=buf)``;
gamma noise with ``rng.standard_gamma(theta, out=buf)``.
"""

from __future__ import annotations

import ctypes
import math
import random
import statistics
import sys
import types
from importlib import metadata
from pathlib import Path

import numpy as np
from scipy import stats

from benchmarks.results_io import measured_note, median_time, sig, write_section
from pram_lib.channels import multi_rr as mr
from pram_lib.channels.gamma import fixed_gamma_noise
from pram_lib.channels.rr import uniform_rr
from pram_lib.core import fastpath
from pram_lib.core.perturb import CHUNK, sample_dense, sample_keep_uniform

N = 10**7  # values per timed call of our kernels
N_PEER = 10**5  # values per timed call of the per-value peer clients
REPS = 5  # paired kernel/raw timings
CHOICE_REPS = 3  # the Generator.choice baseline (slow: ~8 s per call at S = 1000)
K_RR, EPS_RR = 10, 1.0
FLOOR_RATIO_KEEP = 0.5  # issue 6: family (8) >= 50% of the raw RNG throughput
FLOOR_KEEP = 20e6
FLOOR_DENSE = 5e6
GROUP_SIZES, GROUP_EPS = (9, 16, 7), 3.0
GAMMA_THETA, GAMMA_ETA = 0.5, 1.0
BENCH_SITE = Path(__file__).resolve().parent.parent / ".bench-site"
INSTALL_HINT = "install: .venv/bin/python -m pip install --target .bench-site --no-deps -r requirements-bench.txt"
KEEP_TOL_SE = 5.0  # keep-frequency check: |observed - e^eps/(e^eps+k-1)| <= 5 standard errors


def raw_draws(rng: np.random.Generator, n: int, full: np.ndarray, theta: float | None = None) -> dict:
    """The raw RNG cost of n values as two timeable draws: {"chunked": into a reused CHUNK-sized buffer (what the
    kernels do), "n-buffer": into one preallocated n-sized buffer}. Uniform doubles, or standard-gamma variates
    of shape ``theta`` (for the gamma-noise kernel)."""
    small = np.empty(CHUNK)

    def one(out):
        if theta is None:
            rng.random(out=out)
        else:
            rng.standard_gamma(theta, out=out)

    def chunked():
        for lo in range(0, n, CHUNK):
            one(small[: min(CHUNK, n - lo)])

    return {"chunked": chunked, "n-buffer": lambda: one(full[:n])}


def paired_times(kernel, raws: dict, reps: int = REPS) -> tuple[float, dict]:
    """Median times of ``kernel`` and of each raw draw, timed in turn (so load drifts hit all alike)."""
    tk, tr = [], {name: [] for name in raws}
    for _ in range(reps):
        for name, fn in raws.items():
            tr[name].append(median_time(fn, 1))
        tk.append(median_time(kernel, 1))
    return statistics.median(tk), {name: statistics.median(v) for name, v in tr.items()}


def rounds(fns: dict, reps: int = REPS) -> dict:
    """Median time of each function over ``reps`` rounds, the functions timed in turn within a round."""
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            times[name].append(median_time(fn, 1))
    return {name: statistics.median(v) for name, v in times.items()}


def choice_baseline(codes, matrix, rng):
    """Per-category Generator.choice: the obvious numpy way to sample a general matrix."""
    out = np.empty(codes.size, dtype=np.int64)
    for x in range(matrix.shape[0]):
        idx = np.nonzero(codes == x)[0]
        out[idx] = rng.choice(matrix.shape[1], size=idx.size, p=matrix[x])
    return out


def keep_matrix(q):
    """The dense S x S matrix of a family-(8) channel (for the choice baseline)."""
    s = q.size
    m = np.repeat(((1 - q) / (s - 1))[:, None], s, axis=1)
    np.fill_diagonal(m, q)
    return m


def krr_check(x: np.ndarray, z: np.ndarray) -> tuple[float, float, bool, float]:
    """Keep frequency of a k-RR output, its expected value, whether it is within KEEP_TOL_SE standard errors,
    and the chi-square p-value of the moves' offsets (z - x) mod k being uniform on 1..k-1."""
    p = math.exp(EPS_RR) / (math.exp(EPS_RR) + K_RR - 1)
    kept = float(np.mean(z == x))
    ok = abs(kept - p) <= KEEP_TOL_SE * math.sqrt(p * (1 - p) / x.size)
    off = np.bincount(((z - x) % K_RR)[z != x], minlength=K_RR)[1:]
    return kept, p, ok, float(stats.chisquare(off).pvalue)


def load_peers() -> tuple[dict, list[str]]:
    """The peers' per-value k-RR clients as {name: fn(list of codes) -> list}, and notes on what failed."""
    if BENCH_SITE.is_dir() and str(BENCH_SITE) not in sys.path:
        sys.path.append(str(BENCH_SITE))  # appended: the .venv's numpy/scipy always win
    peers, problems = {}, []
    try:
        import pure_ldp

        # shim: pure_ldp/frequency_oracles/__init__.py imports every oracle, and the RAPPOR server imports
        # scikit-learn; register the package without running that __init__, then import DE alone.
        if "pure_ldp.frequency_oracles" not in sys.modules:
            pkg = types.ModuleType("pure_ldp.frequency_oracles")
            pkg.__path__ = [str(Path(pure_ldp.__file__).parent / "frequency_oracles")]
            sys.modules["pure_ldp.frequency_oracles"] = pkg
        from pure_ldp.frequency_oracles.direct_encoding import DEClient

        client = DEClient(epsilon=EPS_RR, d=K_RR, index_mapper=lambda v: v)  # codes are already 0..k-1
        peers[f"pure-LDP {metadata.version('pure-ldp')} DEClient.privatise (k-RR)"] = \
            lambda xs: [client.privatise(v) for v in xs]
    except Exception as exc:  # noqa: BLE001 - reported, not hidden
        problems.append(f"pure-LDP could not run: {type(exc).__name__}: {exc} ({INSTALL_HINT})")
    try:
        from multi_freq_ldpy.pure_frequency_oracles.GRR import GRR_Client

        GRR_Client(0, K_RR, EPS_RR)  # numba compiles on the first call (~5 s): not timed
        peers[f"multi-freq-ldpy {metadata.version('multi-freq-ldpy')} GRR_Client (k-RR, numba "
              f"{metadata.version('numba')})"] = lambda xs: [GRR_Client(v, K_RR, EPS_RR) for v in xs]
    except Exception as exc:  # noqa: BLE001
        problems.append(f"multi-freq-ldpy could not run: {type(exc).__name__}: {exc} ({INSTALL_HINT})")
    return peers, problems


def main() -> None:
    rng = np.random.default_rng(20240601)
    random.seed(20240601)  # pure-LDP draws from Python's random module
    full = np.empty(N)
    full.fill(0.0)  # fault its pages in once: the n-buffer draws then measure the RNG only
    columns = ["case", "n", "M values/s", "raw RNG M/s", "/ raw RNG", "floor", "verdict", "comparison"]
    rows = []

    def add(case, n, kernel, theta=None, floor=None, comparison=""):
        """Time ``kernel`` on n values paired with its raw RNG cost (the faster of the two draws); append the
        row; return (rate, ratio, kernel time)."""
        t, t_raws = paired_times(kernel, raw_draws(rng, n, full, theta))
        best = min(t_raws, key=t_raws.get)
        rate, ratio = n / t, t_raws[best] / t
        verdict = "" if floor is None else ("PASS" if floor[1](rate, ratio) else "FAIL")
        rows.append([case, n, sig(rate / 1e6), sig(n / t_raws[best] / 1e6), round(ratio, 3),
                     "" if floor is None else floor[0], verdict, comparison])
        print(f"{case}: {rate / 1e6:.2f} M/s, {ratio:.3f} of raw ({best}) {verdict}", flush=True)
        return rate, ratio, t

    # family (8): like for like against numpy's uniform draws, then the dense alias kernel
    keep_ratios, keep_rates = {}, {}
    keep_floor = f">= {FLOOR_RATIO_KEEP} x raw and >= {FLOOR_KEEP / 1e6:.0f} M/s"
    fill = fastpath.keep_uniform_kernel()
    for s in (10, 1000):
        q = rng.uniform(0.05, 0.9, s)
        codes = rng.integers(0, s, N)
        out = np.zeros(N, dtype=np.int64)  # faulted in once, like `full`
        t_choice = median_time(lambda: choice_baseline(codes, keep_matrix(q), rng), CHOICE_REPS)
        timed = {
            "kernel, out=": lambda: sample_keep_uniform(codes, q, rng, out=out),
            "kernel, fresh": lambda: sample_keep_uniform(codes, q, rng),
            **{f"raw, {k}": v for k, v in raw_draws(rng, N, full).items()},
            "raw, fresh": lambda: rng.random(N),
        }
        if fill is not None and fill["pcg64"]:
            lib = ctypes.CDLL(str(fastpath.LIBRARY))
            timed["C stepper"] = lambda: lib.pcg64_fill(ctypes.c_void_p(rng.bit_generator.ctypes.bit_generator.value),
                                                        ctypes.c_void_p(full.ctypes.data), ctypes.c_int64(N))
        t = rounds(timed)
        raw_pre = min(t["raw, chunked"], t["raw, n-buffer"])
        pairs = {"out=": (t["kernel, out="], raw_pre, "into a preallocated output (out=) vs rng.random(out=buf)"),
                 "fresh": (t["kernel, fresh"], t["raw, fresh"], "into a fresh output vs rng.random(n)")}
        for name, (tk, tr, what) in pairs.items():
            rate, ratio = N / tk, tr / tk
            ok = ratio >= FLOOR_RATIO_KEEP and rate >= FLOOR_KEEP
            keep_ratios[(s, name)] = ratio
            comparison = (f"{t_choice / tk:.0f}x faster than Generator.choice per category" if name == "fresh" else
                          f"strictest pairing (fresh kernel output vs preallocated raw draws): "
                          f"{raw_pre / t['kernel, fresh']:.3f}")
            rows.append([f"family (8) S={s}: sample_keep_uniform {what}", N, sig(rate / 1e6), sig(N / tr / 1e6),
                         round(ratio, 3), keep_floor, "PASS" if ok else "FAIL", comparison])
            print(f"family (8) S={s} {name}: {rate / 1e6:.1f} M/s, {ratio:.3f} of raw", flush=True)
        keep_rates[s] = {k: N / v / 1e6 for k, v in t.items()}
    m = rng.dirichlet(np.ones(10), size=10)
    m[rng.random((10, 10)) < 0.3] = 0.0
    m[:, 0] += 0.01
    m /= m.sum(axis=1, keepdims=True)
    codes = rng.integers(0, 10, N)
    t_choice = median_time(lambda: choice_baseline(codes, m, rng), CHOICE_REPS)
    _, _, t = add("dense 10x10 with zeros: sample_dense (alias)", N, lambda: sample_dense(codes, m, rng),
                  floor=(f">= {FLOOR_DENSE / 1e6:.0f} M/s", lambda rate, ratio: rate >= FLOOR_DENSE))
    rows[-1][-1] = f"{t_choice / t:.1f}x faster than Generator.choice per category"

    # k-RR: ours at N and at the peers' n, then the peers
    ch = uniform_rr(K_RR, math.exp(EPS_RR))
    codes = rng.integers(0, K_RR, N)
    ours_check = krr_check(codes, ch.perturb_codes(codes, rng))
    add(f"uniform RR k={K_RR}, eps={EPS_RR:g}: uniform_rr().perturb_codes", N, lambda: ch.perturb_codes(codes, rng))
    small = codes[:N_PEER].copy()
    ours_small, _, _ = add(f"uniform RR k={K_RR}, eps={EPS_RR:g}: ours at the peers' n", N_PEER,
                           lambda: ch.perturb_codes(small, rng))
    peers, problems = load_peers()
    checks = {"ours": ours_check}
    xs = small.tolist()
    for name, fn in peers.items():
        checks[name.split(" ")[0]] = krr_check(small, np.asarray(fn(xs)))
        rate, _, _ = add(name, N_PEER, lambda: fn(xs))
        rows[-1][-1] = f"ours {ours_small / rate:,.0f}x faster (same n)"
    for name in ("pure-LDP", "multi-freq-ldpy"):
        if not any(k.startswith(name) for k in peers):
            rows.append([f"{name}: not run", N_PEER, None, None, None, "", "", "see notes"])

    # a multi-attribute group (one K-ary RR on the product of 3 attributes)
    cats = {f"a{j}": list(range(k)) for j, k in enumerate(GROUP_SIZES)}
    group = mr.rr_joint(cats, GROUP_EPS)
    gcodes = np.column_stack([rng.integers(0, k, N) for k in GROUP_SIZES])
    add(f"group: rr_joint on 3 attributes ({' x '.join(map(str, GROUP_SIZES))} = {group.cluster_sizes[0]:,} cells), "
        "perturb_group (records)", N, lambda: mr.perturb_group(group, gcodes, rng))
    del gcodes

    # gamma noise: its raw cost is the gamma variates themselves
    noise = fixed_gamma_noise(GAMMA_THETA, GAMMA_ETA)
    values = rng.normal(40.0, 12.0, N)
    add(f"gamma noise theta={GAMMA_THETA:g}, eta={GAMMA_ETA:g}: NoiseChannel.perturb", N,
        lambda: noise.perturb(values, rng), theta=GAMMA_THETA,
        comparison="raw RNG here = rng.standard_gamma(theta, out=buf)")

    p_keep = math.exp(EPS_RR) / (math.exp(EPS_RR) + K_RR - 1)
    check_text = "; ".join(f"{k} {v[0]:.4f} ({'ok' if v[2] else 'OUT OF TOLERANCE'}, moves' offsets uniform: "
                           f"chi-square p = {v[3]:.2g})" for k, v in checks.items())
    notes = [
        f"One process, one core; each case is the median of {REPS} timed calls on n values (codes uniform on the "
        f"categories; the Generator.choice baseline: {CHOICE_REPS} calls), including the call's own set-up (tables, "
        "validation).",
        "raw RNG = numpy drawing the uniform doubles the kernel needs (one per value; one per record for the "
        "group, whose single cluster needs one) with the same Generator (PCG64). Family (8) is paired like for like, "
        f"timed in turn with its raw draws (median of {REPS} rounds): a preallocated output against "
        f"rng.random(out=buf), the faster of a reused {CHUNK}-double buffer and one faulted-in n-sized buffer; and a "
        "fresh output (allocated and faulted in by the call) against rng.random(n). The kernels also read n int64 "
        "codes; the raw draws do not. Other families: rng.random(out=buf) as above; gamma noise: "
        "rng.standard_gamma(theta, out=buf) (signs, scale and addition excluded).",
        "The family-(8) kernel (pram_lib/core/_fastpath.c) steps numpy's PCG64 itself, four states apart, and produces "
        "exactly rng.random's numbers and final state (checked when the library loads, and by tests); numpy steps it "
        "one value at a time behind a function pointer. Raw draws of the same numbers, M/s: " + "; ".join(
            f"S={s}: " + ", ".join(f"{k.replace(', ', ' ')} {v:.0f}" for k, v in keep_rates[s].items()
                                   if not k.startswith("kernel"))
            for s in keep_rates) + ". Against the C stepper's own draws the kernel reaches " + ", ".join(
            f"S={s} {keep_rates[s]['kernel, out='] / keep_rates[s]['C stepper']:.2f}"
            for s in keep_rates if "C stepper" in keep_rates[s]) + " (out=).",
        f"Issue-6 floor, family (8) >= {FLOOR_RATIO_KEEP} x raw RNG throughput, like for like: " + ", ".join(
            f"S={s} {name} {r:.3f}" for (s, name), r in keep_ratios.items()) +
        f" -> {'PASS' if min(keep_ratios.values()) >= FLOOR_RATIO_KEEP else 'FAIL'}.",
        f"k-RR task: k = {K_RR}, eps = {EPS_RR:g} for all three clients (ours: uniform_rr(k, gamma = e^eps), keep "
        f"e^eps/(e^eps+k-1) = {p_keep:.4f}; pure-LDP DEClient(epsilon, d) and multi-freq-ldpy "
        "GRR_Client(x, k, epsilon) "
        "compute the same p). The peers are per-value Python calls, so they are timed on n = "
        f"{N_PEER:,} values (codes passed as a Python list, outputs collected in a list) and compared with ours on the "
        f"same n; ours on n = {N:,} is the row above.",
        f"Same-task check, keep frequency P(z = x) within {KEEP_TOL_SE:g} standard errors of {p_keep:.4f} "
        f"(ours on n = {N:,}, peers on n = {N_PEER:,}): {check_text}.",
        "Peers draw from their own generators: pure-LDP from Python's random (Mersenne Twister), multi-freq-ldpy "
        "from numba's np.random inside the jitted client; its first call (numba compilation, ~5 s) is not timed.",
        "pure-LDP: importing pure_ldp.frequency_oracles (the documented path) fails without scikit-learn, which its "
        "RAPPOR server imports; the benchmark registers that package without running its __init__ and imports the "
        "direct-encoding (k-RR) client alone (no code of the client is changed).",
        *problems,
        measured_note(),
    ]
    write_section("bench_perturb", 2, "Perturbation throughput per channel family", columns, rows, notes)


if __name__ == "__main__":
    main()
