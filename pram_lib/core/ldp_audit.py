"""An empirical lower confidence bound on a published channel's ε: the LDP-Auditor method (Arcolezi & Gambs,
"Revealing the true cost of locally differentially private protocols: an auditing perspective", 2023).

For a categorical channel M (M[x, y] = P(released y | true x)) the pair of true values (x, x') and the output y
with the largest likelihood ratio M[x, y] / M[x', y] is where a channel weaker than claimed shows most. The audit
draws n records with true value x and n with x' through the sampler that perturbed the data, counts how often y
comes out (k and k'), and bounds each probability by Clopper–Pearson (the exact interval of
`scipy.stats.binomtest(...).proportion_ci(method="exact")`, computed from scipy's Beta quantiles): a one-sided
lower bound L on P(y | x) and upper bound U on P(y | x'), each at level 1 − β/2. Then ε_lower = ln(L / U)
is a lower confidence bound on the channel's ε at level 1 − β (Bonferroni over
the two bounds): for an ε-LDP channel, P(ε_lower > ε) ≤ β. Across the channels of one release the release's
error 1 − confidence is split again (Bonferroni), so a correct release is refused with probability at most
1 − confidence (:func:`per_channel_confidence`).

What it shows: that the sampler which ran is not detectably weaker than its claim at this one ratio. What it
does not prove: that the channel is ε-LDP (an audit can only refute); and a sampler that is wrong elsewhere
than at the audited (x, x', y) is not seen. Additive Gamma noise (and its Laplace member, as this code
calibrates it) is not differential privacy: nothing to audit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.special import betaincinv   # scipy.stats.beta.ppf's own routine, without importing scipy.stats

NEAR_TIE = 1e-9   # log-ratios this close count as tied: among them the pair with the likeliest output is audited


@dataclass(frozen=True)
class WorstPair:
    """The audited pair of true values and output: ``ratio`` = M[true, output] / M[other, output], the largest."""

    true: int
    other: int
    output: int
    ratio: float


def worst_pair(matrix: np.ndarray | None = None, keep: np.ndarray | None = None) -> WorstPair:
    """The (x, x', y) with the largest M[x, y] / M[x', y] of a row-stochastic `matrix`, or of a family-(8)
    channel given by its `keep` vector (O(S), never the S×S matrix). Among (near) ties, the one whose smaller
    probability M[x', y] is largest (the audit's counts are then largest, and its bound tightest)."""
    if (matrix is None) == (keep is None):
        raise ValueError("give exactly one of matrix= or keep=")
    if keep is not None:
        q = np.asarray(keep, dtype=float)
        s = q.size
        if s < 2:
            raise ValueError("a channel with one category has no pair to audit")
        r = (1.0 - q) / (s - 1)          # M[x, y] for y != x
        order = np.argsort(r, kind="stable")
        idx = np.arange(s)
        max_other = np.where(idx == order[-1], order[-2], order[-1])
        min_other = np.where(idx == order[0], order[1], order[0])
        top = np.where(q >= r[max_other], idx, max_other)
        bottom = np.where(q <= r[min_other], idx, min_other)
        hi, lo = np.where(top == idx, q, r[top]), np.where(bottom == idx, q, r[bottom])
    else:
        m = np.asarray(matrix, dtype=float)
        if m.ndim != 2 or m.shape[0] < 2:
            raise ValueError("a matrix with fewer than two rows has no pair to audit")
        top, bottom = m.argmax(axis=0), m.argmin(axis=0)
        hi, lo = m.max(axis=0), m.min(axis=0)
    live = hi > 0
    if not np.any(live):
        raise ValueError("no output has positive probability")
    with np.errstate(divide="ignore"):
        log_ratio = np.where(live, np.log(hi) - np.log(lo), -np.inf)
    best = log_ratio.max()
    tied = np.flatnonzero(log_ratio >= best - NEAR_TIE) if np.isfinite(best) else np.flatnonzero(log_ratio == best)
    y = int(tied[np.argmax(lo[tied])])
    return WorstPair(int(top[y]), int(bottom[y]), y, float(math.exp(min(log_ratio[y], 700.0))))


def per_channel_confidence(confidence: float, channels: int) -> float:
    """Bonferroni: the confidence each of `channels` audits needs so that all hold together at `confidence`."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if channels < 1:
        raise ValueError(f"channels must be at least 1, got {channels}")
    return 1.0 - (1.0 - confidence) / channels


@dataclass(frozen=True)
class AuditResult:
    """One channel's audit.

    Attributes:
        epsilon_lower: ln(p_true_lower / p_other_upper), floored at 0 (every channel has ε ≥ 0); a lower
            confidence bound on the channel's ε at `confidence`.
        epsilon_claimed: the ε the channel publishes.
        confidence: the level of `epsilon_lower` (for this channel alone; see per_channel_confidence).
        samples: records drawn per true value (n for x and n for x').
        pair: the audited (x, x', y) and their ratio M[x, y] / M[x', y] in the published matrix.
        count_true, count_other: how often y came out from x and from x'.
        p_true_lower, p_other_upper: the Clopper–Pearson bounds on P(y | x) and P(y | x').
    """

    epsilon_lower: float
    epsilon_claimed: float
    confidence: float
    samples: int
    pair: WorstPair
    count_true: int
    count_other: int
    p_true_lower: float
    p_other_upper: float

    @property
    def refused(self) -> bool:
        """The empirical lower bound exceeds the claim: the sampler is weaker than the channel says."""
        return self.epsilon_lower > self.epsilon_claimed

    def to_dict(self, labels: tuple | None = None) -> dict:
        """JSON-ready; `labels`: the published labels of (true, other, output), else their codes."""
        true, other, output = labels or (self.pair.true, self.pair.other, self.pair.output)
        return {"epsilon_lower": self.epsilon_lower, "epsilon_claimed": self.epsilon_claimed,
                "confidence": self.confidence, "samples": self.samples,
                "true_value": true, "other_value": other, "output": output,
                "count_true": self.count_true, "count_other": self.count_other,
                "p_true_lower": self.p_true_lower, "p_other_upper": self.p_other_upper,
                "passed": not self.refused}


def clopper_pearson_lower(k: int, n: int, level: float) -> float:
    """One-sided Clopper–Pearson lower bound at `level` on a binomial p from k successes in n: the p with
    P(Bin(n, p) ≥ k) = 1 − level, i.e. the (1 − level) quantile of Beta(k, n − k + 1) (0 when k = 0). The same
    number as ``scipy.stats.binomtest(k, n, alternative="greater").proportion_ci(level, "exact").low``, from
    scipy's Beta quantile in microseconds instead of a root search (about 10 ms)."""
    return float(betaincinv(k, n - k + 1, 1.0 - level)) if k > 0 else 0.0


def clopper_pearson_upper(k: int, n: int, level: float) -> float:
    """One-sided Clopper–Pearson upper bound at `level`: the `level` quantile of Beta(k + 1, n − k) (1 when
    k = n); ``binomtest(k, n, alternative="less").proportion_ci(level, "exact").high``."""
    return float(betaincinv(k + 1, n - k, level)) if k < n else 1.0


def epsilon_lower_bound(count_true: int, count_other: int, samples: int, claimed: float, confidence: float,
                        pair: WorstPair) -> AuditResult:
    """Clopper–Pearson bounds on P(y | x) (lower) and P(y | x') (upper), each one-sided at 1 − (1 − confidence)/2,
    and ε_lower = ln(lower / upper) (0 when the lower bound is 0)."""
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    for name, k in (("count_true", count_true), ("count_other", count_other)):
        if not 0 <= k <= samples:
            raise ValueError(f"{name} must lie in [0, {samples}], got {k}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    each = 1.0 - (1.0 - confidence) / 2.0
    low, high = clopper_pearson_lower(count_true, samples, each), clopper_pearson_upper(count_other, samples, each)
    eps = max(0.0, math.log(low / high)) if low > 0 else 0.0
    return AuditResult(eps, float(claimed), float(confidence), int(samples), pair, int(count_true),
                       int(count_other), float(low), float(high))


@dataclass(frozen=True)
class AuditDraw:
    """What the sampler gave: `samples` records from each of pair.true and pair.other, of which `count_true` and
    `count_other` came out as pair.output; `claimed` is the channel's published ε."""

    pair: WorstPair
    claimed: float
    samples: int
    count_true: int
    count_other: int

    def bound(self, confidence: float) -> AuditResult:
        """The lower bound on ε at `confidence` (:func:`epsilon_lower_bound`)."""
        return epsilon_lower_bound(self.count_true, self.count_other, self.samples, self.claimed, confidence,
                                   self.pair)


def draw(sample: Callable[[np.ndarray, np.random.Generator], np.ndarray], pair: WorstPair, claimed: float,
         samples: int, rng: np.random.Generator) -> AuditDraw:
    """Draw `samples` records with true code pair.true and as many with pair.other through `sample(codes, rng)`
    (the production sampler: released codes of the codes' shape) and count pair.output in each half."""
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    count_true = count_other = 0
    for n in blocks(samples):
        hit = np.asarray(sample(np.repeat(np.array([pair.true, pair.other], dtype=np.int64), n), rng)) == pair.output
        count_true += int(np.count_nonzero(hit[:n]))
        count_other += int(np.count_nonzero(hit[n:]))
    return AuditDraw(pair, float(claimed), int(samples), count_true, count_other)


BLOCK = 1 << 19   # draws per value at a time: a few MB of codes, whatever the sample size


def blocks(samples: int) -> list[int]:
    """`samples` cut into blocks of at most BLOCK (the counts add up)."""
    return [BLOCK] * (samples // BLOCK) + ([samples % BLOCK] if samples % BLOCK else [])


def audit_sampler(sample: Callable[[np.ndarray, np.random.Generator], np.ndarray], pair: WorstPair,
                  claimed: float, samples: int, confidence: float, rng: np.random.Generator) -> AuditResult:
    """One channel's audit: :func:`draw`, then the bound at `confidence`."""
    return draw(sample, pair, claimed, samples, rng).bound(confidence)
