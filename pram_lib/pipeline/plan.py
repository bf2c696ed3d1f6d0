"""Accuracy planning (`pram-release plan`): the standard errors a release would publish, predicted before any ε
is spent, from the spec's public information only.

For each categorical variable the channel is built as the release builds it (the family's own constructors) from
a *public planning prior* p: `prior: uniform`, a prior file's probabilities, or, where the release would read the
data (`prior: data`, `prior: {dp: ε0}`), the uniform prior. The released value of a record drawn from p has the
distribution m = M^T p, and the unbiased estimate p̂ = G m̂ (G = M^{-T}, or the least-squares left inverse for a
non-square M) has

    Cov(p̂) = (G diag(m) G^T − p p^T) / n,

exactly, for n records drawn from p (the released counts are Mult(n, m)); the estimator's published se is this
formula at m̂. Half-widths are z_{(1+confidence)/2} se. A group (multi-RR) publishes each attribute through its
cluster's sub-tuple channel (K-ary RR with keep' = keep + (K_C/K_sub − 1) move) and every 2-way table (within a
cluster the sub-tuple channel, across clusters the Kronecker product of the two); it is planned under a uniform
prior over every cell (attributes independent and uniform).

n is the spec's `rows:` (or `--rows`), else the total of a prior file's `count` column. The frequencies of the
source are never read; its *domain* (the set of values of a categorical column, which the release publishes in
channels.json) is read when the spec does not declare it, unless `read_source=False`. Nothing here touches the
ledger, the audit log or the output folder.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from pram_lib.core.epsilon import gamma_of
from pram_lib.core.operators import NonIdentifiableError, worst_relative_variance, worst_variance
from pram_lib.core.planning import GRID, ROWS_FIX, Estimand, TargetCurve, VariablePlan   # noqa: F401 (re-exported)
from pram_lib.core.quantile import z_value
from pram_lib.families import family_of
from pram_lib.families.base import Target
from pram_lib.families.categorical import count_values
from pram_lib.spec import ReleaseSpec, SpecError, check_static_budget


# -- what a plan holds ------------------------------------------------------------------------------------
@dataclass
class AccuracyPlan:
    spec_path: str
    release: str
    confidence: float
    variables: list[VariablePlan]
    source_read: list[str]             # the columns whose domain was read from the source


# -- n and the domains --------------------------------------------------------------------------------------
def _rows_of(spec: ReleaseSpec, i: int, v, given: tuple[int, str] | None) -> tuple[int, str] | None:
    """(n, where n comes from) of one planned variable or group: `given`, else its public reference's."""
    return given if given is not None else family_of(v).planning_rows(spec, i, v)


def planned_rows(spec: ReleaseSpec, rows: int | None = None) -> dict[str, tuple[int, str]]:
    """{variable: (n, where n comes from)} for every categorical variable and group; SpecError when one has none."""
    if rows is not None:
        given = (int(rows), "--rows")
    elif spec.rows is not None:
        given = (spec.rows, "`rows:` in the spec")
    else:
        given = None
    out, lacking = {}, []
    for i, v in enumerate(spec.variables):
        if family_of(v).not_planned(v):
            continue
        found = _rows_of(spec, i, v, given)
        if found is None:
            lacking.append(v.key)
        else:
            out[v.key] = found
    if lacking:
        raise spec.error(("rows",), "planning needs the number of records a release will have, and the spec "
                         "states none (no `rows:`, no prior file with a `count` column) for "
                         f"{', '.join(lacking)}", None, ROWS_FIX)
    return out


def _declared_domain(spec: ReleaseSpec, i: int, v) -> tuple[object, str] | None:
    """(domain, where it comes from) from public information; None for a public variable (read from the source)."""
    return family_of(v).public_domain(spec, i, v)


def source_domains(spec: ReleaseSpec, keys: set[str]) -> dict[str, object]:
    """The domains the release would find in the source, for the variables and groups in `keys`: the values of
    their columns only (the frequencies are counted as the release counts them, then dropped)."""
    from pram_lib.pipeline import stream

    stream.check_source(spec)
    wanted = [(i, v) for i, v in enumerate(spec.variables) if v.key in keys]
    parts: dict[str, object] = {}
    for ref, df in stream.iter_chunks(spec):
        for i, v in wanted:
            part = family_of(v).profile_chunk(spec, i, v, df, ref.start, 0)
            parts[v.key] = part if v.key not in parts else parts[v.key] + part
    out = {}
    for i, v in wanted:   # (a group is never here: its domains are always declared, Group.public_domain)
        profile = family_of(v).finish_profile(spec, i, v, parts.get(v.key, Counter()))
        out[v.key] = profile.categories
    return out


# -- a target instead of a level: the smallest ε that meets it -----------------------------------------------
SEARCH_LOW, SEARCH_HIGH = 1e-3, 20.0   # ε a target is searched in (the high end: `max_epsilon` when given)
SEARCH_GRID = 41                       # log-spaced ε where the half-widths are checked to decrease in ε
SCAN_GRID = 401                        # the dense scan when they do not (up to the first ε that meets)
BISECT_TOL = 1e-5                      # relative width of the last bracket; ε then has 5 significant digits
TARGET_LOOSEN = ("loosen the target (a larger `halfwidth:`/`relative:`, a larger `share_at_least:`, a lower "
                 "`confidence:`), plan for more records (`rows:`), or state the level with `alpha:` instead")


def _round_up(x: float, digits: int = 5) -> float:
    """x rounded up to `digits` significant digits."""
    e = math.floor(math.log10(x)) - digits + 1
    q = x / 10.0 ** e
    return float(f"{math.ceil(q - 1e-9 * q)}e{e}")


def smallest_epsilon(halfwidths: Callable[[float], np.ndarray | None], limits: np.ndarray, low: float,
                     high: float) -> tuple[float | None, str]:
    """(the smallest ε in [low, high] whose half-widths are all within `limits`, how it was found); (None, ...)
    when even `high` misses.

    The half-widths of these channels decrease in ε under a fixed prior; that is checked on SEARCH_GRID
    log-spaced points (every category), and the search bisects between the last grid point that misses and the
    first that meets. Where they do not decrease, a scan of SCAN_GRID points finds the first ε that meets and
    bisection refines it inside that step. The bracket (lo, hi] is narrowed to BISECT_TOL (relative); the ε
    returned is hi to 5 significant digits (rounded to the nearer, else up; one that meets), so ε(1 − 1e-3) lies
    below lo, where the target is missed."""

    def at(eps: float) -> np.ndarray:
        hw = halfwidths(eps)
        return np.full(limits.shape, np.inf) if hw is None else np.asarray(hw, dtype=float)

    def meets(eps: float) -> bool:
        return bool(np.all(at(eps) <= limits))

    grid = np.geomspace(low, high, SEARCH_GRID)
    hw = np.array([at(x) for x in grid])
    with np.errstate(invalid="ignore"):
        decreasing = bool(np.all((hw[1:] <= hw[:-1] * (1 + 1e-9)) | np.isinf(hw[:-1])))
    how = f"bisection (half-widths decrease in ε on a {SEARCH_GRID}-point grid)"
    if not decreasing:
        grid = np.geomspace(low, high, SCAN_GRID)
        how = (f"a scan of {SCAN_GRID} ε, then bisection (the half-widths do not decrease in ε everywhere: a "
               "smaller ε between the scanned points may also meet the target)")
        j = next((j for j, x in enumerate(grid) if meets(x)), None)
    else:
        ok = np.all(hw <= limits, axis=1)
        j = int(np.argmax(ok)) if ok.any() else None
    if j is None:
        return None, how
    if j == 0:
        return float(grid[0]), how + f"; met at the smallest ε searched ({low:g})"
    lo, hi = float(grid[j - 1]), float(grid[j])
    while hi / lo - 1 > BISECT_TOL:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if meets(mid) else (mid, hi)
    for rounded in (float(f"{hi:.5g}"), _round_up(hi)):   # 5 significant digits, the nearer one if it meets
        if lo < rounded <= high and meets(rounded):
            return rounded, how
    return hi, how


def _target_domains(spec: ReleaseSpec, pending: list, read_source: bool) -> dict[str, tuple[object, str]]:
    domains, need = {}, set()
    for i, v in pending:
        d = _declared_domain(spec, i, v)
        if d is None:
            need.add(v.key)
        else:
            domains[v.key] = d
    if need and not read_source:
        i, v = next((i, v) for i, v in pending if v.key in need)
        raise spec.error(("variables", i, "target"), f"the target of {v.key!r} is met on the shares of its "
                         "categories, which the spec does not declare, and the source may not be opened "
                         "(--no-source)", None, family_of(v).domain_fix(v) + "plan without --no-source")
    if need:
        for key, cats in source_domains(spec, need).items():
            domains[key] = (cats, "read from the source (its values only)")
    return domains


def resolve_target(spec: ReleaseSpec, i: int, v, cats, domain_from: str) -> dict:
    """The smallest ε meeting variable i's `target:`, with what was predicted there (the details channels.json
    records). `over: worst` (the default): for every true distribution, each share of at least `share_at_least`
    (worst_variance, worst_relative_variance) through the channel the public planning prior builds; `over: prior`:
    at the planning prior's shares. SpecError: no n, no category the target applies to, a target out of reach
    (below `max_epsilon`, or 20)."""
    t: Target = v.target
    confidence = t.confidence if t.confidence is not None else spec.confidence
    family = family_of(v)
    worst = t.over == "worst"
    given = (spec.rows, "`rows:` in the spec") if spec.rows is not None else None
    rows = _rows_of(spec, i, v, given)
    if rows is None:
        raise spec.error(("variables", i, "target"), f"a target is an accuracy for a number of records, and the "
                         f"spec states none for {v.key!r} (no `rows:`, no prior file with a `count` column)", None,
                         "declare `rows: N` at the top of the spec (the planned number of records: public "
                         "information)" + ("" if not family.data_prior(v) else ", or plan with a public "
                         "prior file with a `count` column (`prior: {file: ref.csv}`)") + ", or state the level "
                         "with `alpha:` instead")
    n, n_from = rows
    z = z_value(confidence)
    s = t.share_at_least
    curve = family.planning_curve(spec, i, v, cats, n, z)
    planned = curve.shares >= s - 1e-12             # the shares the target covers at the planning prior
    if worst:
        which = np.ones(curve.shares.size, dtype=bool)   # any category may have a true share ≥ s
        if t.relative is not None and s <= 0:
            raise spec.error(("variables", i, "target", "relative"), "a relative target for every true share "
                             "down to 0 asks a half-width of 0 for a share near 0, which no release reaches",
                             t.model_dump(exclude_none=True), "set `share_at_least:` above 0")
    else:
        which = planned
        if not which.any():
            raise spec.error(("variables", i, "target", "share_at_least"), f"no category of {v.key!r} has a "
                             f"planning share of at least {s:g} (planning prior: {curve.planning}; the largest "
                             f"share is {curve.shares.max():.4g})", s,
                             "lower `share_at_least:`" + ("" if not family.data_prior(v) else
                                                         ", or plan with a public prior `prior: {file: ref.csv}`"))
        if t.relative is not None and np.any(curve.shares[which] <= 0):
            raise spec.error(("variables", i, "target", "relative"), "a relative target of a share 0 is a "
                             "half-width of 0, which no release reaches (the categories are under found)",
                             [lab for lab, p, w in zip(curve.labels, curve.shares, which) if w and p <= 0][:10],
                             "set `share_at_least:` above 0")

    def worst_measure(a, A) -> np.ndarray:
        """z·sqrt(worst n Var / n): the half-width, or the half-width over the share for `relative:`."""
        nvar = worst_variance(a, A, s) if t.relative is None else worst_relative_variance(a, A, s)
        return z * np.sqrt(nvar / n)

    if worst:
        limits = np.full(which.size, t.halfwidth if t.halfwidth is not None else t.relative)

        def halfwidths(eps: float) -> np.ndarray | None:
            ab = curve.coefficients(eps)
            return None if ab is None else worst_measure(*ab)

        # ε = ∞ (no randomisation: M = G = I, a = 1, A = 0): the sampling error alone
        floor = worst_measure(np.ones(which.size), np.zeros(which.size))
    else:
        limits = np.full(int(which.sum()), t.halfwidth) if t.halfwidth is not None else t.relative * curve.shares[which]

        def halfwidths(eps: float) -> np.ndarray | None:
            hw = curve.halfwidths(eps)
            return None if hw is None else hw[which]

        floor = z * np.sqrt(curve.shares[which] * (1 - curve.shares[which]) / n)
    over = ("whatever the true shares" if worst else f"planning prior {curve.planning}")
    high = t.max_epsilon if t.max_epsilon is not None else SEARCH_HIGH
    eps, how = smallest_epsilon(halfwidths, limits, min(SEARCH_LOW, high), high)
    if eps is None:
        what = t.describe(confidence)
        if np.any(floor > limits):
            largest = (f"a half-width up to {float(np.max(floor)):.4g}" if t.relative is None or not worst else
                       f"a half-width up to {100 * float(np.max(floor)):.4g}% of a share of {s:g}")
            raise spec.error(("variables", i, "target"), f"the target {what} of {v.key!r} is out of reach at any "
                             f"ε: with n = {n:,} records the sampling error alone (no randomisation) gives "
                             f"{largest}" + (" for some true shares" if worst else ""),
                             t.model_dump(exclude_none=True), TARGET_LOOSEN)
        if t.max_epsilon is not None and t.max_epsilon < SEARCH_HIGH:
            need, _ = smallest_epsilon(halfwidths, limits, t.max_epsilon, SEARCH_HIGH)
            needs = f"it needs ε = {need:.5g}" if need is not None else f"it needs more than ε = {SEARCH_HIGH:g}"
            raise spec.error(("variables", i, "target", "max_epsilon"), f"the target {what} of {v.key!r} is not "
                             f"met at ε ≤ max_epsilon = {t.max_epsilon:g}: {needs} (n = {n:,}, {over})",
                             t.max_epsilon,
                             (f"raise `max_epsilon:` to {need:.5g}, or " + TARGET_LOOSEN) if need is not None
                             else TARGET_LOOSEN)
        at_high = halfwidths(high)
        there = "the channel is singular there" if at_high is None else \
            f"predicted largest {'relative ' if t.relative is not None and worst else ''}half-width there " \
            f"{float(np.max(at_high)):.4g}"
        raise spec.error(("variables", i, "target"), f"the target {what} of {v.key!r} is not met at ε ≤ {high:g} "
                         f"(n = {n:,}, {over}; {there})",
                         t.model_dump(exclude_none=True), TARGET_LOOSEN + (
                             ", or raise `max_epsilon:`" if t.max_epsilon is not None else ""))
    prior_hw = curve.halfwidths(eps)
    details = {"target": {**t.model_dump(exclude_none=True, exclude={"over"}), "confidence": confidence},
               "over": t.over, "epsilon": eps, "rows": n, "rows_from": n_from, "planning_prior": curve.planning,
               "domain": domain_from, "categories": int(which.sum()), "of_categories": int(which.size),
               "search": how}
    if prior_hw is not None and planned.any():
        details["predicted_largest_halfwidth"] = float(np.max(prior_hw[planned]))
        if t.relative is not None and np.all(curve.shares[planned] > 0):
            details["predicted_largest_relative_halfwidth"] = float(np.max(prior_hw[planned] /
                                                                           curve.shares[planned]))
    if worst:
        a, A = curve.coefficients(eps)
        details["worst_case_largest_halfwidth"] = float(np.max(z * np.sqrt(worst_variance(a, A, s) / n)))
        if t.relative is not None:
            details["worst_case_largest_relative_halfwidth"] = float(np.max(halfwidths(eps)))
    return details


def resolve_targets(spec: ReleaseSpec, read_source: bool = True) -> ReleaseSpec:
    """The spec with every `target:` resolved to its smallest ε (resolve_target), as if it stated `alpha:`; the
    budget and the population's cap are checked again. Reads no frequency of the source: only the domains the
    spec does not declare (as `plan` does; read_source=False refuses them). A spec without an unresolved target
    comes back as it is."""
    pending = [(i, v) for i, v in enumerate(spec.variables) if getattr(v, "unresolved_target", False)]
    if not pending:
        return spec
    domains = _target_domains(spec, pending, read_source)
    variables = list(spec.variables)
    for i, v in pending:
        cats, how = domains[v.key]
        details = resolve_target(spec, i, v, cats, how)
        w = v.model_copy(update={"alpha": details["epsilon"]})
        w._resolved = details
        variables[i] = w
    out = spec.model_copy(update={"variables": variables})
    check_static_budget(out)
    return out


def target_line(spec: ReleaseSpec, v) -> str:
    """`over: worst`: 'target ±0.01 for every share at 95%, whatever the true shares: ε = 2.0712 (planning-prior
    half-width 0.007611, worst case 0.01; 5 of 5 shares, n = 32,561)'; `over: prior`: 'target ±0.01 for every
    share at 95%: ε = 1.5772 (predicted largest half-width 0.009998; 5 of 5 shares, n = 32,561)'."""
    d = v.target_details
    what = v.target.describe(d["target"]["confidence"])
    hw, rel = d.get("predicted_largest_halfwidth"), d.get("predicted_largest_relative_halfwidth")
    tail = f"{d['categories']} of {d['of_categories']} shares, n = {d['rows']:,}"
    if d.get("over", "prior") == "prior":
        predicted = f"predicted largest half-width {hw:.4g}" + (
            f", {100 * rel:.4g}% of its share" if rel is not None else "")
        return f"target {what}: ε = {d['epsilon']:.5g} ({predicted}; {tail})"
    worst_rel = d.get("worst_case_largest_relative_halfwidth")
    prior = ("planning-prior half-width " + (f"{100 * rel:.4g}% of its share" if rel is not None and worst_rel
                                              is not None else f"{hw:.4g}") + ", ") if hw is not None else ""
    worst = (f"worst case {100 * worst_rel:.4g}% of the share" if worst_rel is not None else
             f"worst case {d['worst_case_largest_halfwidth']:.4g}")
    return f"target {what}, whatever the true shares: ε = {d['epsilon']:.5g} ({prior}{worst}; {tail})"


def target_note(spec: ReleaseSpec, v) -> str:
    how = ("for every true distribution of the shares (the worst case)"
           if v.target_details.get("over", "prior") == "worst" else "under the planning prior")
    return f"ε resolved from `target:`, the smallest that meets it {how}: {target_line(spec, v)}"


def plan_release(spec: ReleaseSpec, rows: int | None = None, read_source: bool = True) -> AccuracyPlan:
    """The plan of every variable of `spec` (see the module docstring). SpecError: no n, a bad prior file, a
    domain that cannot be known (read_source=False and none declared) is a note, not an error. A `target:` is
    resolved first (resolve_targets): its ε is planned as the spec's."""
    spec = resolve_targets(spec, read_source=read_source)
    n_of = planned_rows(spec, rows)
    domains: dict[str, tuple[object, str]] = {}
    need_source = set()
    for i, v in enumerate(spec.variables):
        if not family_of(v).not_planned(v):
            d = _declared_domain(spec, i, v)
            if d is None:
                need_source.add(v.key)
            else:
                domains[v.key] = d
    read = []
    if need_source and read_source:
        found = source_domains(spec, need_source)
        for key, cats in found.items():
            domains[key] = (cats, "read from the source (its values only, as the release finds them; declare "
                                  "`categories:` to plan without opening it)")
        read = [c for v in spec.variables if v.key in need_source for c in v.names]
    out = []
    for i, v in enumerate(spec.variables):
        family = family_of(v)
        reason = family.not_planned(v)
        if reason:
            out.append(VariablePlan(v.key, v.channel, family.kind, not_planned=reason))
            continue
        if v.key not in domains:
            out.append(VariablePlan(v.key, v.channel, family.kind, not_planned="the domain is not declared "
                                    "(`categories:`), and the source was not opened"))
            continue
        cats, how = domains[v.key]
        n, n_from = n_of[v.key]
        out.append(family.plan_variable(spec, i, v, cats, how, n, n_from,
                                        None if v.target_details is None else target_note(spec, v)))
    return AccuracyPlan(str(spec.path), spec.release, spec.confidence, out, read)


# -- predicted beside achieved: `check` and the release report ---------------------------------------------
def planned_largest_halfwidths(spec: ReleaseSpec, i: int, v, cats, n: float,
                               confidence: float | None = None) -> dict[str, float]:
    """{the variable, or each attribute of a group: its largest interval half-width at the spec's ε under the
    public planning prior}, for n records and the domain `cats` (a group: one list per attribute); NaN where the
    channel is singular. Only the spec's ε: no grid."""
    return family_of(v).planned_largest_halfwidths(spec, i, v, cats, n,
                                                   z_value(spec.confidence if confidence is None else confidence))


def count_source_columns(spec: ReleaseSpec, columns: list[str]) -> list[Counter]:
    """The source's counts of the values of each column (confidential), read again chunk by chunk."""
    from pram_lib.pipeline import stream

    found = [Counter() for _ in columns]
    for _, df in stream.iter_chunks(spec):
        for j, column in enumerate(columns):
            found[j] += count_values(df, [column])
    return found


def true_share_halfwidths(spec: ReleaseSpec, v, assignments: list, profile) -> dict[str, float]:
    """{the variable, or each attribute of a group: its largest interval half-width at the source's shares
    through the channels chosen} (confidential: it reads the profile, and the source again where the profile does
    not hold the shares)."""
    return family_of(v).true_share_halfwidths(spec, v, assignments, profile, z_value(spec.confidence),
                                              lambda columns: count_source_columns(spec, columns))


def accuracy_lines(spec: ReleaseSpec, profile, assignments: list) -> list[str]:
    """`check`'s table: per categorical variable (and group attribute) the largest interval half-width at the
    spec's ε predicted under the public planning prior (what `plan` says) and at the source's shares through the
    channels chosen (what the release will achieve, up to sampling noise)."""
    try:
        n_of = planned_rows(spec)
    except SpecError:
        n_of = {}
    rows, notes = [], []
    for i, v in enumerate(spec.variables):
        mine = [a for a in assignments if a.column == v.key]
        family = family_of(v)
        reason = family.not_planned(v, brief=True)
        if reason:
            rows.append((v.key, "", f"not planned ({reason})", ""))
            continue
        if not mine:
            continue
        cats, n_source = family.profile_domain(v, profile)
        n = n_of.get(v.key, (n_source, ""))[0]
        if v.key not in n_of:
            notes.append(v.key)
        eps = max(a.channel.epsilon for a in mine)
        try:
            planned = planned_largest_halfwidths(spec, i, v, cats, n)
        except (SpecError, ValueError, NonIdentifiableError) as exc:   # a channel the prior cannot build
            rows.append((v.key, f"{eps:.4g}", f"not planned ({exc})", ""))
            continue
        actual = true_share_halfwidths(spec, v, mine, profile)
        for name in planned:
            rows.append((family.accuracy_name(v, name), f"{eps:.4g}", f"{planned[name]:.5f}",
                         f"{actual.get(name, math.nan):.5f}"))
    if not rows:
        return []
    hw = f"±{_pct(spec.confidence)}"
    width = max(len("variable"), *(len(r[0]) for r in rows))
    out = [f"accuracy: the largest {hw} interval half-width of each variable's shares at the spec's ε, predicted",
           "  planned (prior): under the public planning prior, as `plan` predicts it",
           "  at source shares: at the source's shares through the channels above (what the release will achieve, up "
           "to sampling noise)",
           f"{'variable':<{width}} {'epsilon':>8} {'planned (prior)':>16} {'at source shares':>17}"]
    for name, eps, planned, actual in rows:
        if actual == "":
            out.append(f"{name:<{width}} {eps:>8} {planned}")
        else:
            out.append(f"{name:<{width}} {eps:>8} {planned:>16} {actual:>17}")
    if notes:
        out.append(f"(no `rows:` for {', '.join(notes)}: planned at the source's number of records)")
    return out


# -- output ------------------------------------------------------------------------------------------------
def _pct(confidence: float) -> str:
    return f"{100 * confidence:.4g}%"


def _fmt_eps(e: float) -> str:
    return "inf" if math.isinf(e) else f"{e:.4g}"


def _summary(estimands: list[Estimand], level: float, z: float) -> tuple[float, float]:
    """(largest, median) half-width over the cells of the estimands at ε = level."""
    hw = np.concatenate([z * e.se[level] for e in estimands]) if estimands else np.array([np.nan])
    if np.isnan(hw).all():
        return math.nan, math.nan
    return float(np.nanmax(hw)), float(np.nanmedian(hw))


def plan_frame(plan: AccuracyPlan) -> pd.DataFrame:
    """Every planned number: one row per cell, estimand and ε (plan.csv)."""
    z = z_value(plan.confidence)
    frames = []
    for vp in plan.variables:
        for est in vp.estimands:
            for level, se in est.se.items():
                frames.append(pd.DataFrame({
                    "variable": vp.key, "channel": vp.channel, "estimand": est.name, "kind": est.kind,
                    "category": [lab[0] for lab in est.labels],
                    "category_b": [lab[1] if len(lab) > 1 else "" for lab in est.labels],
                    "epsilon": level, "epsilon_spent": level + vp.extra_epsilon,
                    "spec_epsilon": bool(vp.spec_epsilon is not None and math.isclose(level, vp.spec_epsilon)),
                    "rows": vp.rows, "planning_share": est.planning, "se": se, "half_width": z * se,
                    "confidence": plan.confidence, "method": est.method}))
    columns = ["variable", "channel", "estimand", "kind", "category", "category_b", "epsilon", "epsilon_spent",
               "spec_epsilon", "rows", "planning_share", "se", "half_width", "confidence", "method"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def render(plan: AccuracyPlan) -> str:
    """The printed plan: per variable its shares at the spec's ε, then the largest and median half-width per ε."""
    z, hw = z_value(plan.confidence), f"±{_pct(plan.confidence)}"
    L = [f"accuracy plan of {plan.spec_path} (release '{plan.release}'): predicted standard errors (se) and "
         f"{_pct(plan.confidence)} interval half-widths ({hw}) of the unbiased estimates the release publishes.",
         "Planned from the spec alone: no frequency of the source is read, no ε is spent, nothing is published."
         + (f" The domains of {', '.join(plan.source_read)} were read from the source (values only)."
            if plan.source_read else "")]
    for vp in plan.variables:
        L.append("")
        if vp.not_planned:
            L.append(f"{vp.key}: {vp.channel}: not planned: {vp.not_planned}")
            continue
        spent = f" (ε spent {_fmt_eps(vp.spec_epsilon + vp.extra_epsilon)})" if vp.extra_epsilon else ""
        gamma = f", γ = {gamma_of(vp.spec_epsilon):.4g}" if math.isfinite(gamma_of(vp.spec_epsilon)) else ""
        L.append(f"{vp.key}: {vp.channel} at ε = {_fmt_eps(vp.spec_epsilon)}{gamma}{spent}; n = {vp.rows:,} "
                 f"({vp.rows_from})")
        L += [f"  {note}" for note in vp.notes]
        shares = [e for e in vp.estimands if e.kind == "share"]
        tables = [e for e in vp.estimands if e.kind == "table"]
        at = vp.spec_epsilon
        for est in shares:
            head = est.name if vp.shares_named else "category"
            width = min(max([len(head)] + [len(lab[0]) for lab in est.labels]), 30)
            L.append(f"  {head:<{width}} {'share':>8} {'se':>9} {hw:>9}")
            for lab, p, se in zip(est.labels, est.planning, est.se[at]):
                L.append(f"  {lab[0][:width]:<{width}} {p:>8.4f} {se:>9.5f} {z * se:>9.5f}")
        if tables:
            width = max(len("2-way table"), *(len(t.name) for t in tables))
            L.append(f"  {'2-way table':<{width}} {'cells':>6} {'largest ' + hw:>15} {'median ' + hw:>14}  method")
            for t in tables:
                big, med = _summary([t], at, z)
                L.append(f"  {t.name:<{width}} {len(t.labels):>6} {big:>15.5f} {med:>14.5f}  {t.method}")
        if len(vp.grid) > 1:
            if tables:
                L.append(f"  {'ε':>7} {'shares: largest ' + hw:>24} {'median':>9} {'tables: largest ' + hw:>24} "
                         f"{'median':>9}")
            else:
                L.append(f"  {'ε':>7} {'largest ' + hw:>15} {'median ' + hw:>14}")
            for level in vp.grid:
                mark = "*" if math.isclose(level, at) else " "
                big, med = _summary(shares, level, z)
                row = f"  {_fmt_eps(level) + mark:>7} {big:>{24 if tables else 15}.5f} {med:>{9 if tables else 14}.5f}"
                if tables:
                    tb, tm = _summary(tables, level, z)
                    row += f" {tb:>24.5f} {tm:>9.5f}"
                L.append(row)
            L.append("  (* the spec's ε)")
    return "\n".join(L) + "\n"


def _curve(vp: VariablePlan, confidence: float, path: Path) -> None:
    """Largest and median half-width against ε (log-log), the spec's ε marked; a group: shares and tables apart."""
    from pram_lib.pipeline.figures import fit_layout, gc_paused, new_figure, plot_label

    z = z_value(confidence)
    panels = [("shares", [e for e in vp.estimands if e.kind == "share"])]
    if any(e.kind == "table" for e in vp.estimands):
        panels.append(("2-way tables", [e for e in vp.estimands if e.kind == "table"]))
    with gc_paused():
        fig, axes = new_figure(6.0 * len(panels), 4.2, len(panels))
        for ax, (title, ests) in zip(axes, panels):
            for c, est in enumerate(ests):
                xs = np.array(vp.grid)
                big, med = np.array([_summary([est], x, z) for x in xs]).T
                name = f"{plot_label(est.name)}: " if vp.shares_named else ""
                color = f"C{c % 10}"
                if np.allclose(big, med, rtol=1e-9, equal_nan=True):   # every cell alike (a uniform prior)
                    ax.plot(xs, big, "o-", color=color, label=f"{name}every cell" if name else "every cell")
                else:
                    ax.plot(xs, big, "o-", color=color, label=f"{name}largest")
                    ax.plot(xs, med, "s--", color=color, label=f"{name}median", alpha=0.7)
            if math.isfinite(vp.spec_epsilon):
                ax.axvline(vp.spec_epsilon, color="k", linestyle=":", linewidth=1,
                           label=f"the spec's ε = {_fmt_eps(vp.spec_epsilon)}")
            if len(vp.grid) > 1:
                from matplotlib.ticker import FixedLocator, NullFormatter

                ax.set_xscale("log")
                ticks = [x for x in (0.25, 0.5, 1, 2, 4, 8) if vp.grid[0] <= x <= vp.grid[-1]]
                ax.xaxis.set_major_locator(FixedLocator(ticks))
                ax.set_xticklabels([f"{x:g}" for x in ticks])
                ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_yscale("log")
            spent = f" (spent: + {vp.extra_epsilon:g})" if vp.extra_epsilon else ""
            ax.set_xlabel(vp.epsilon_label + spent)
            ax.set_ylabel(f"{_pct(confidence)} interval half-width")
            ax.set_title(f"{plot_label(vp.key)}: {title}, n = {vp.rows:,}", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fit_layout(fig)
        fig.savefig(path, dpi=100, metadata={"Software": None})


def default_out(spec: ReleaseSpec, now: datetime | None = None) -> Path:
    """<private_store>/plans/<release>-<UTC time>/."""
    now = now or datetime.now(timezone.utc)
    return spec.resolve(spec.private_store) / "plans" / f"{spec.release}-{now.strftime('%Y%m%dT%H%M%S%fZ')}"


def check_out(spec: ReleaseSpec, out: Path) -> Path:
    """The folder a plan is written to: never in the release output folder, never over existing files."""
    out = Path(out).expanduser().resolve()
    public = spec.resolve(spec.output).resolve()
    if out.is_relative_to(public):
        raise SpecError(str(spec.path), None, None, "--out", f"the plan would be written into the "
                        f"release output folder {public}, where releases are published", str(out),
                        "give --out a folder outside `output:` (the default is <private_store>/plans/)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SpecError(str(spec.path), None, None, "--out", "the folder exists and is not empty", str(out),
                        "give a new or empty folder")
    return out


def write_plan(plan: AccuracyPlan, spec: ReleaseSpec, out: Path) -> list[Path]:
    """plan.txt (the printed plan), plan.csv (every number) and one PNG per planned variable or group."""
    from pram_lib.pipeline.figures import file_stem

    out = check_out(spec, out)
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "plan.txt", out / "plan.csv"]
    files[0].write_text(render(plan), encoding="utf-8")
    plan_frame(plan).to_csv(files[1], index=False)
    taken = {"plan"}
    for vp in plan.variables:
        if vp.not_planned:
            continue
        stem = file_stem(vp.key)
        stem = stem if stem.lower() not in taken else f"{stem}-{len(taken)}"
        taken.add(stem.lower())
        files.append(out / f"{stem}.png")
        _curve(vp, plan.confidence, files[-1])
    return files
