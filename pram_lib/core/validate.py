"""The two checks of the validation gate (plain functions; no Prefect).

1. :func:`validate_table`: Great Expectations (GX Core 1.x) on the released table: row count, exact
   column set, dtype, missing-value bound (exact), categorical domain, numeric range.
2. :func:`channel_consistency_test`: are the released counts of one variable consistent with the
   published channel applied, record by record, to the true counts? Mahalanobis statistic with the
   exact covariance of a sum of independent multinomials, referred to χ² on rank(Σ) df.
3. :func:`noise_consistency_test`: are released − source draws of the published noise law? (Kolmogorov–Smirnov)

``great_expectations`` is imported lazily inside the functions (importing it costs about 5 s).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pram_lib.core.jsonable import to_json

__all__ = ["validate_table", "channel_consistency_test", "noise_consistency_test", "holm", "gate_message",
           "NUMERIC_TYPE_LIST"]

# GX 1.24.1 + pandas 3 dtype handling (checked on this machine):
# * ExpectColumnValuesToBeOfType compares the dtype's *scalar type*: a `category` column reports
#   "CategoricalDtypeType" (type_="category" / "CategoricalDtype" fail), a pandas-3 string column
#   reports "str" (type_="object" fails), int64 -> "int64", float64 -> "float64".
# * ExpectColumnValuesToBeInTypeList fails for `category` and `str` columns whatever the spelling,
#   but works for numpy numeric dtypes and for nullable extension dtypes spelled "Int64Dtype" etc.
_GX_TYPE_NAMES = {"category": "CategoricalDtypeType", "categorical": "CategoricalDtypeType",
                  "str": "str", "string": "str"}
NUMERIC_TYPE_LIST = [
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64",
    "Int8Dtype", "Int16Dtype", "Int32Dtype", "Int64Dtype", "UInt8Dtype", "UInt16Dtype", "UInt32Dtype",
    "UInt64Dtype", "Float32Dtype", "Float64Dtype",
]
_SAMPLE = 5
DENSE_MAX = 2000  # largest support handled with dense m×m linear algebra
_DOCS_SITE = "release_docs"


# =================================================================================================
# 1. Great Expectations on the released table
# =================================================================================================
def _gx_modules():
    import great_expectations as gx
    import great_expectations.expectations as gxe
    from great_expectations.data_context.types.base import ProgressBarsConfig

    _share_compiled_templates()
    return gx, gxe, ProgressBarsConfig


class _CompiledTemplates:
    """A Jinja bytecode cache in memory, shared by every Data Docs view of this process. GX builds a new Jinja
    environment for each view, so without it each release compiles the same ~50 templates again (0.3 s of a
    0.5 s suite). Jinja keys each entry by template name and a checksum of its source: never stale."""

    def __new__(cls):
        from jinja2 import BytecodeCache

        class Cache(BytecodeCache):
            def __init__(self):
                self.code: dict[str, bytes] = {}

            def load_bytecode(self, bucket) -> None:
                if bucket.key in self.code:
                    bucket.bytecode_from_string(self.code[bucket.key])

            def dump_bytecode(self, bucket) -> None:
                self.code[bucket.key] = bucket.bytecode_to_string()

        return Cache()


def _share_compiled_templates() -> None:
    from great_expectations.render.view import view

    base = view.DefaultJinjaView
    if getattr(base, "_pram_shared_templates", None) is not None:
        return
    cache, build = _CompiledTemplates(), base.__init__

    def __init__(self, *args, **kwargs):
        build(self, *args, **kwargs)
        self.env.bytecode_cache = cache

    base.__init__, base._pram_shared_templates = __init__, cache


def _quiet(context, progress_bars_config) -> None:
    context.variables.progress_bars = progress_bars_config(globally=False, metric_calculations=False)


def exact_mostly(n_rows: int, max_unexpected: int) -> float:
    """A `mostly` such that GX's test ``(n - u) / n >= mostly`` holds exactly when ``u <= max_unexpected``.

    The threshold sits half a row between the allowed and the first forbidden ratio, so float rounding
    (about 1e-16 relative) cannot move it across either: ``(n-k)/n >= (n-k-½)/n > (n-k-1)/n``.
    """
    if max_unexpected <= 0 or n_rows <= 0:
        return 1.0
    if max_unexpected >= n_rows:
        return 0.0
    return (n_rows - max_unexpected - 0.5) / n_rows


def _fmt(x: Any) -> str:
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


def _build_expectations(gxe, columns: dict, n_rows_expected: int, n_rows_actual: int) -> list:
    """The suite, in order; every expectation carries ``meta`` = {check, expected} for the report."""
    exps = [
        gxe.ExpectTableRowCountToEqual(
            value=int(n_rows_expected),
            meta={"check": "row_count", "expected": f"exactly {n_rows_expected} rows"}),
        gxe.ExpectTableColumnsToMatchSet(
            column_set=list(columns), exact_match=True,
            meta={"check": "columns", "expected": f"exactly the columns {sorted(columns)}"}),
    ]
    for col, decl in columns.items():
        kind = decl.get("kind")
        if kind not in ("categorical", "numeric", "passthrough"):
            raise ValueError(f"column {col!r}: kind must be categorical, numeric or passthrough, got {kind!r}")
        dtype = decl.get("dtype", "category" if kind == "categorical" else None)
        if dtype is not None:
            gx_type = _GX_TYPE_NAMES.get(str(dtype), str(dtype))
            exps.append(gxe.ExpectColumnValuesToBeOfType(
                column=col, type_=gx_type, meta={"check": "dtype", "expected": f"dtype {dtype} (GX type {gx_type})"}))
        elif kind == "numeric":
            exps.append(gxe.ExpectColumnValuesToBeInTypeList(
                column=col, type_list=NUMERIC_TYPE_LIST, meta={"check": "dtype", "expected": "a numeric dtype"}))
        k = int(decl.get("max_missing", 0))
        exps.append(gxe.ExpectColumnValuesToNotBeNull(
            column=col, mostly=exact_mostly(n_rows_actual, k),
            meta={"check": "missing", "max_missing": k, "expected": f"at most {k} missing values"}))
        if kind == "categorical":
            domain = list(decl["domain"])
            exps.append(gxe.ExpectColumnValuesToBeInSet(
                column=col, value_set=domain,
                meta={"check": "domain", "expected": f"values in the declared domain ({len(domain)} categories)"}))
        elif kind == "numeric":
            lo, hi = decl.get("min"), decl.get("max")
            if lo is not None or hi is not None:
                exps.append(gxe.ExpectColumnValuesToBeBetween(
                    column=col, min_value=lo, max_value=hi,
                    meta={"check": "range", "expected": f"values in [{_fmt(lo) if lo is not None else '-inf'}, "
                                                        f"{_fmt(hi) if hi is not None else 'inf'}]"}))
    return exps


def _exception_message(info: Any) -> str | None:
    """GX reports an exception either flat ({raised_exception, exception_message}) or per metric id."""
    if not isinstance(info, dict):
        return None
    if info.get("raised_exception"):
        return str(info.get("exception_message"))
    for v in info.values():
        if isinstance(v, dict) and v.get("raised_exception"):
            return str(v.get("exception_message"))
    return None


def _row(result, present: set) -> dict:
    cfg = result.expectation_config
    meta = dict(cfg.meta or {})
    res = dict(result.result or {})
    exc_msg = _exception_message(result.exception_info)
    column = cfg.kwargs.get("column")
    check = meta.get("check", cfg.type)
    unexpected = res.get("unexpected_count")
    sample = to_json(list(res.get("partial_unexpected_list") or [])[:_SAMPLE])
    observed = to_json(res.get("observed_value"))
    if column is not None and column not in present:
        detail = f"column {column!r} is not in the released table"
    elif exc_msg is not None:
        detail = f"could not be evaluated: {exc_msg[:300]}"
    elif check == "row_count":
        detail = f"{observed} rows, expected {cfg.kwargs.get('value')}"
    elif check == "columns":
        mism = (res.get("details") or {}).get("mismatched") or {}
        missing, extra = to_json(mism.get("missing", [])), to_json(mism.get("unexpected", []))
        detail = f"missing columns {missing}, unexpected columns {extra}" if (missing or extra) \
            else f"columns {observed}"
        sample = extra or missing
    elif check == "dtype":
        detail = f"dtype reported as {observed}; expected {meta.get('expected')}"
    elif check == "missing":
        detail = f"{unexpected} missing values, at most {meta.get('max_missing')} allowed"
    elif check == "domain":
        detail = f"{unexpected} values outside the declared domain, e.g. {sample}"
    elif check == "range":
        detail = f"{unexpected} values outside {meta.get('expected', '').removeprefix('values in ')}, e.g. {sample}"
    else:
        detail = f"observed {observed}, unexpected {unexpected}"
    return {"expectation": cfg.type, "column": column, "check": check, "success": bool(result.success),
            "unexpected_count": None if unexpected is None else int(unexpected), "observed_value": observed,
            "sample": sample, "expected": meta.get("expected"), "detail": detail}


def _run(gx, pbc, df: pd.DataFrame, exps: list, docs_dir: Path | None = None):
    """The suite on `df` in an in-memory context; with `docs_dir`, then a Data Docs site of the suite and its
    result written there (a File context rewrote its YAML on every change, and a Checkpoint only added
    freshness checks of what this function has just made)."""
    from great_expectations.data_context.types.base import DataContextConfig, InMemoryStoreBackendDefaults

    # no default Data Docs site (GX's own names a temporary folder, and logs it)
    ctx = gx.get_context(mode="ephemeral", project_config=DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False)))
    _quiet(ctx, pbc)
    bd = (ctx.data_sources.add_pandas(name="release").add_dataframe_asset(name="released")
          .add_batch_definition_whole_dataframe(name="whole"))
    suite = ctx.suites.add(gx.ExpectationSuite(name="released_table", expectations=exps))
    vd = ctx.validation_definitions.add(gx.ValidationDefinition(name="released_table", data=bd, suite=suite))
    result = vd.run(batch_parameters={"dataframe": df}, result_format="SUMMARY")
    if docs_dir is not None:
        ctx.add_data_docs_site(site_name=_DOCS_SITE, site_config={
            "class_name": "SiteBuilder",
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir)},
        })
        ctx.build_data_docs(site_names=[_DOCS_SITE])
    return result, suite


def validate_table(released: pd.DataFrame, columns: dict, n_rows_expected: int,
                   out_dir: Path | None = None) -> dict:
    """Validate the released table with a GX suite built in code from the declared columns.

    ``columns``: name -> {"kind": "categorical", "domain": [...], "max_missing": int}
                      | {"kind": "numeric", "min": float|None, "max": float|None, "max_missing": int}
                      | {"kind": "passthrough", "max_missing": int}
    Each entry may add ``"dtype"`` (default ``"category"`` for categorical columns, any numeric dtype
    for numeric ones, unchecked for pass-through ones).

    Returns a JSON-able dict {success, statistics, rows, n_expectations[, artifacts]}. With ``out_dir``
    it also writes gx_results.json, gx_suite.json and a Data Docs site in out_dir/data_docs/.
    """
    gx, gxe, pbc = _gx_modules()
    exps = _build_expectations(gxe, columns, n_rows_expected, len(released))
    if out_dir is None:
        result, suite = _run(gx, pbc, released, exps)
    else:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        docs_dir = (out_dir / "data_docs").resolve()
        if docs_dir.exists():  # a stale site would list pages of earlier runs
            shutil.rmtree(docs_dir)
        result, suite = _run(gx, pbc, released, exps, docs_dir)

    stats = {k: to_json(v) for k, v in dict(result.statistics).items()}
    if stats.get("evaluated_expectations") != len(exps):
        # GX drops expectations it cannot load without failing the run; never let that pass silently.
        raise RuntimeError(f"GX evaluated {stats.get('evaluated_expectations')} expectations, "
                           f"but the suite has {len(exps)}")
    out = {"success": bool(result.success), "statistics": stats, "n_expectations": len(exps),
           "rows": [_row(r, set(released.columns)) for r in result.results]}
    if out_dir is not None:
        (out_dir / "gx_results.json").write_text(
            json.dumps(to_json(result.to_json_dict()), indent=2) + "\n")
        (out_dir / "gx_suite.json").write_text(json.dumps(to_json(suite.to_json_dict()), indent=2) + "\n")
        index = docs_dir / "index.html"
        if not index.is_file():
            raise RuntimeError(f"GX Data Docs were not written: {index} is missing")
        # names relative to out_dir: this dict is published, and absolute paths would name the (staging)
        # folder on the release server
        out["artifacts"] = {"results": "gx_results.json", "suite": "gx_suite.json",
                            "data_docs": index.relative_to(docs_dir.parent).as_posix()}
    return out


# =================================================================================================
# 2. Statistical consistency of released counts with the channel
# =================================================================================================
def _chi2_sf(x: float, df: int) -> float:
    from scipy.special import chdtrc  # what scipy.stats.chi2.sf computes, without importing scipy.stats

    if df <= 0:
        return 1.0 if x <= 1e-9 else 0.0
    return float(chdtrc(df, x))


def _quad_dense(sigma: np.ndarray, d: np.ndarray, mu: np.ndarray) -> tuple[float, int, float]:
    """(dᵀ Σ⁺ d, rank Σ, relative size of d's component in the null space of Σ).

    Σ is first scaled to Σ̃ = D Σ D with D = diag(μ)^(-1/2); 0 ⪯ Σ̃ ⪯ I because Σ ⪯ diag(μ), so an
    absolute eigenvalue tolerance is meaningful. The quadratic form is unchanged for d in range(Σ).
    """
    s = 1.0 / np.sqrt(mu)
    st = sigma * s[:, None] * s[None, :]
    lam, vec = np.linalg.eigh((st + st.T) / 2.0)
    keep = lam > 1e-10
    dt = d * s
    proj = vec.T @ dt
    stat = float(np.sum(proj[keep] ** 2 / lam[keep]))
    null = float(np.sqrt(np.sum(proj[~keep] ** 2)))
    return stat, int(keep.sum()), null / (1.0 + float(np.linalg.norm(dt)))


def _quad_woodbury(delta: np.ndarray, U: np.ndarray, C: np.ndarray, Cinv: np.ndarray,
                   d: np.ndarray) -> float | None:
    """dᵀ (diag(δ) − U C Uᵀ)⁻¹ d in O(S·r²) by Woodbury; None when the structure is (near) singular.

    (D − U C Uᵀ)⁻¹ = D⁻¹ + D⁻¹U (C⁻¹ − Uᵀ D⁻¹ U)⁻¹ Uᵀ D⁻¹. Checked by the residual of the solve.
    """
    scale = float(np.max(np.abs(delta))) if delta.size else 0.0
    if delta.size == 0 or scale <= 0 or np.min(np.abs(delta)) <= 1e-12 * scale:
        return None
    Dinv_d = d / delta
    Dinv_U = U / delta[:, None]
    K = Cinv - U.T @ Dinv_U
    g = U.T @ Dinv_d
    try:
        if np.linalg.cond(K) > 1e12:
            return None
        h = np.linalg.solve(K, g)
    except np.linalg.LinAlgError:
        return None
    y = Dinv_d + Dinv_U @ h  # y = Σ⁻¹ d
    # residual of the solve: Σ y − d with Σ y = δ∘y − U C (Uᵀ y)
    sy = delta * y - U @ (C @ (U.T @ y))
    if np.linalg.norm(sy - d) > 1e-7 * (np.linalg.norm(d) + 1e-300) and np.linalg.norm(d) > 0:
        return None
    return float(d @ y)


def channel_consistency_test(source_counts: np.ndarray, released_counts: np.ndarray, channel,
                             level: float = 1e-3, method: str = "auto") -> dict:
    """Test H0: released counts N = Σ_x Multinomial(n_x, M_x) (the channel applied to every record).

    Under H0, E[N] = μ = Mᵀn and Cov[N] = Σ = Σ_x n_x (diag(M_x) − M_x M_xᵀ). Statistic
    (N − μ)ᵀ Σ⁺ (N − μ) ≈ χ²(rank Σ). Outputs with μ_z = 0 (hence zero variance) must have N_z = 0,
    and N must satisfy every deterministic constraint of H0 (its total equals the source's),
    otherwise the test fails at once with the reason.

    Family-(8) channels (``channel.keep``) never build an S×S matrix: with r_x = (1 − q_x)/(S − 1),
    c_x = q_x − r_x, M_x = r_x·1 + c_x·e_x and
        Σ = diag(μ − w) − a·11ᵀ − 1uᵀ − u1ᵀ,  a = Σ n_x r_x², u = n∘r∘c, w = n∘c²,
    i.e. a diagonal minus a rank-2 term. Σ1 = 0 (the total is fixed), so one released category is
    dropped (for d ⊥ 1 that gives exactly dᵀΣ⁺d) and the rest is inverted by Woodbury in O(S).
    Dense channels use an eigendecomposition when the support has at most DENSE_MAX outputs, else
    Woodbury with the rank-k term Mᵀ diag(n) M.

    ``method``: "auto", "dense" (force the dense computation, builds M) or "woodbury".
    """
    n = np.asarray(source_counts, dtype=float).ravel()
    N = np.asarray(released_counts, dtype=float).ravel()
    k, m = channel.n_inputs, channel.n_outputs
    name = "/".join(channel.variables) or "variable"
    if n.shape != (k,) or N.shape != (m,):
        raise ValueError(f"{name}: expected {k} source counts and {m} released counts, got {n.size} and {N.size}")
    if np.any(n < 0) or np.any(N < 0) or not (np.all(np.isfinite(n)) and np.all(np.isfinite(N))):
        raise ValueError(f"{name}: counts must be finite and non-negative")
    if method not in ("auto", "dense", "woodbury"):
        raise ValueError(f"method must be auto, dense or woodbury, got {method!r}")
    n_total, N_total = float(n.sum()), float(N.sum())
    what = (f"released counts of {name!r} ({m} categories, {N_total:,.0f} records) against the channel "
            f"{'keep-uniform' if channel.is_keep_uniform else f'dense {k}x{m}'} (ε = {channel.epsilon:.4g}) "
            f"applied to the source counts")

    def fail(reason: str, method_name: str) -> dict:
        return {"statistic": None, "df": None, "p_value": 0.0, "level": float(level), "passed": False,
                "method": method_name, "n_source": n_total, "n_released": N_total, "reason": reason,
                "deterministic": True, "message": f"Consistency test of the {what}: FAILED: {reason}"}

    if abs(N_total - n_total) > 0.5:
        return fail(f"the released counts total {N_total:,.0f} but the source has {n_total:,.0f} non-missing "
                    "records; the channel maps every record to exactly one category", "total-count check")

    use_keep = channel.is_keep_uniform and method != "dense"
    if use_keep:
        q = np.asarray(channel.keep, dtype=float)
        S = q.size
        r = (1.0 - q) / max(S - 1, 1)
        c = q - r
        mu = float(np.sum(n * r)) + n * c           # = channel.marginal(n), O(S)
        mu = np.maximum(mu, 0.0)
    else:
        M = np.asarray(channel.matrix, dtype=float)
        mu = n @ M
    scale = max(float(np.max(mu)) if mu.size else 0.0, 1.0)
    support = mu > 1e-12 * scale
    impossible = (~support) & (N > 0)
    if np.any(impossible):
        cats = [channel.output_categories[i] for i in np.flatnonzero(impossible)[:10]]
        return fail(f"{int(N[impossible].sum())} records were released in categories {cats} that have zero "
                    "probability under the channel given the source (expected count 0, variance 0)",
                    "zero-support check")
    idx = np.flatnonzero(support)
    d = (N - mu)[idx]
    ms = idx.size

    stat = df = None
    method_name = ""
    if use_keep and ms >= 2:
        a = float(np.sum(n * r * r))
        u = (n * r * c)[idx]
        w = (n * c * c)[idx]
        delta = mu[idx] - w
        drop = int(np.argmax(mu[idx]))           # dropping any one category is exact; keep the best-conditioned
        keep_mask = np.ones(ms, dtype=bool)
        keep_mask[drop] = False
        U = np.column_stack([np.ones(ms - 1), u[keep_mask]])
        C = np.array([[a, 1.0], [1.0, 0.0]])
        Cinv = np.array([[0.0, 1.0], [1.0, -a]])
        val = _quad_woodbury(delta[keep_mask], U, C, Cinv, d[keep_mask])
        if val is not None:
            stat, df, method_name = val, ms - 1, "mahalanobis-woodbury-keep-uniform"
        if stat is None:
            if ms > DENSE_MAX:
                raise ValueError(f"{name}: the keep-uniform covariance is singular beyond the total-count "
                                 f"direction and the support ({ms}) is too large for the dense fallback")
            if method == "woodbury":
                raise ValueError(f"{name}: Woodbury path not applicable (degenerate covariance)")
            # degenerate (e.g. deterministic inputs): dense on the small support, from the structure
            sig = np.diag(delta) - a - u[:, None] - u[None, :]
            stat, df, null = _quad_dense(sig, d, mu[idx])
            method_name = "mahalanobis-dense-pinv"
            if null > 1e-6:
                return fail("the released counts violate a deterministic constraint of the channel "
                            f"(component {null:.3g} outside the support of the covariance)", method_name)
    elif ms >= 2:
        nz = n > 0
        Ms = M[np.ix_(nz, idx)]
        if method != "woodbury" and ms <= DENSE_MAX:
            sig = np.diag(mu[idx]) - Ms.T @ (n[nz][:, None] * Ms)
            stat, df, null = _quad_dense(sig, d, mu[idx])
            method_name = "mahalanobis-dense-pinv"
            if null > 1e-6:
                return fail("the released counts violate a deterministic constraint of the channel "
                            f"(component {null:.3g} outside the support of the covariance)", method_name)
        else:
            drop = int(np.argmax(mu[idx]))
            keep_mask = np.ones(ms, dtype=bool)
            keep_mask[drop] = False
            val = _quad_woodbury(mu[idx][keep_mask], Ms[:, keep_mask].T, np.diag(n[nz]), np.diag(1.0 / n[nz]),
                                 d[keep_mask])
            if val is None:
                raise ValueError(f"{name}: covariance too degenerate for the low-rank path with {ms} outputs")
            stat, df, method_name = val, ms - 1, "mahalanobis-woodbury-lowrank"
    else:
        stat, df, method_name = 0.0, 0, "trivial (fewer than two possible outputs)"

    stat = max(float(stat), 0.0)
    p = _chi2_sf(stat, int(df))
    passed = bool(p >= level)
    verdict = "consistent" if passed else "NOT consistent"
    description = (f"Consistency test of the {what}: Mahalanobis statistic {stat:.4g} on {df} df "
                   "(χ² approximation)")
    msg = (f"{description}, p = {p:.3g} {'>=' if passed else '<'} level {level:g}: the release is "
           f"{verdict} with the channel{'.' if passed else _NOT_CONSISTENT}")
    return {"statistic": stat, "df": int(df), "p_value": p, "level": float(level), "passed": passed,
            "method": method_name, "n_source": n_total, "n_released": N_total, "reason": None if passed else
            f"p = {p:.3g} < {level:g}", "message": msg, "description": description}


_NOT_CONSISTENT = " (the data were not produced by this channel, or the source counts differ)."


def noise_consistency_test(source: np.ndarray, released: np.ndarray, channel, level: float = 1e-3) -> dict:
    """Test H0: released − source are i.i.d. draws of the channel's noise law (Kolmogorov–Smirnov, two-sided).

    Missing values must stay missing row by row (a change there fails at once). Uses source values,
    so the result stays in the private store.
    """
    x = np.asarray(source, dtype=float)
    z = np.asarray(released, dtype=float)
    name = "/".join(channel.variables) or "variable"
    base = {"level": level, "method": "kolmogorov-smirnov on released - source", "df": None}
    if x.shape != z.shape or not np.array_equal(np.isnan(x), np.isnan(z)):
        return {**base, "passed": False, "statistic": float("nan"), "p_value": 0.0, "deterministic": True,
                "reason": "missing values or row count changed", "message": f"{name}: rows or missingness changed"}
    d = np.sort((z - x)[~np.isnan(x)])
    statistic, p_value = ks_two_sided(d, channel.noise.cdf)
    passed = bool(p_value >= level)
    description = f"{name}: KS D = {statistic:.4g} on {d.size} differences"
    return {**base, "passed": passed, "statistic": statistic, "p_value": p_value,
            "reason": None if passed else f"p = {p_value:.3g} < {level:g}", "description": description,
            "message": f"{description}, p = {p_value:.3g}"}


# Above this many differences the one-sided p is Massart's bound, not scipy.special.smirnov's exact sum, which
# adds n terms: 0.3 s for the 200,000-row sample of a large release, where the bound is within 0.5 % of it.
EXACT_KS_ROWS = 20_000


def ks_two_sided(ordered: np.ndarray, cdf) -> tuple[float, float]:
    """(D, p) of the one-sample two-sided Kolmogorov–Smirnov test of the sorted sample `ordered` against `cdf`.
    p is twice the one-sided p, capped at 1 (a union bound over D+ and D-: at least the exact two-sided p, so the
    test keeps its level; the two differ by the chance that D+ and D- both reach D, negligible at small p). The
    one-sided p is exact (scipy.special.smirnov, the routine behind scipy.stats.ksone.sf; so p is
    scipy.stats.ks_1samp's method="approx") up to EXACT_KS_ROWS differences, and above that Massart's bound
    P(D+ >= d) <= exp(-2 n d^2) (the tight constant of the Dvoretzky–Kiefer–Wolfowitz inequality, Massart 1990,
    Ann. Probab. 18: it holds wherever exp(-2 n d^2) <= 1/2, and elsewhere p is 1 either way), never below the
    exact p and, above 20,000 differences, within 1.6 % of it wherever it is above 1e-8. scipy.stats itself is
    not imported: importing it costs the release's own process 0.4-0.6 s."""
    n = ordered.size
    if n == 0:
        return float("nan"), 1.0
    f = np.asarray(cdf(ordered), dtype=float)
    steps = np.arange(1, n + 1) / n
    statistic = float(max(np.max(steps - f), np.max(f - (steps - 1 / n))))
    if n > EXACT_KS_ROWS:
        one_sided = math.exp(-2.0 * n * statistic * statistic)
    else:
        from scipy.special import smirnov

        one_sided = float(smirnov(n, statistic))
    return statistic, float(min(1.0, 2 * one_sided))


def holm(results: list[dict], level: float) -> list[dict]:
    """Holm's step-down procedure over the p-values of a release's statistical checks, in place.

    The family-wise error rate (the chance that a correct release is refused by any check) is at most
    ``level``, whatever the dependence between the checks (Holm 1979). With p_(1) ≤ … ≤ p_(m), H_(k) is
    rejected iff p_(j) < level / (m − j + 1) for every j ≤ k; equivalently iff Holm's adjusted p-value
    max_{j≤k} min(1, (m − j + 1) p_(j)) is below ``level``. Every check gets ``p_value`` (raw, unchanged),
    ``holm_threshold`` (level / (m − rank + 1)), ``p_adjusted``, ``family_size`` (m), ``level`` (the
    family-wise level) and ``passed``. Results flagged ``deterministic`` (a count or missingness that H0
    makes impossible) and results without a p-value (exact checks) are left as they are and not counted.
    """
    family = [r for r in results if r.get("p_value") is not None and not r.get("deterministic")]
    m = len(family)
    order = sorted(range(m), key=lambda i: family[i]["p_value"])
    running = 0.0
    for rank, i in enumerate(order):
        r = family[i]
        p = float(r["p_value"])
        thr = level / (m - rank)
        running = max(running, min(1.0, (m - rank) * p))
        passed = bool(running >= level)
        r.update(level=float(level), holm_threshold=thr, p_adjusted=running, family_size=m, passed=passed,
                 reason=None if passed else (f"Holm-adjusted p = {running:.3g} < family-wise level {level:g} "
                                             f"(p = {p:.3g}, Holm threshold {thr:.3g}, {m} checks)"))
        if "description" in r:
            verdict = ("consistent with the channel." if passed else "NOT consistent with the channel" +
                       (_NOT_CONSISTENT if r.get("df") is not None else "."))
            r["message"] = (f"{r['description']}, p = {p:.3g}, Holm-adjusted p = {running:.3g} "
                            f"{'>=' if passed else '<'} family-wise level {level:g} over {m} checks: "
                            f"the release is {verdict}")
    return results


# =================================================================================================
# 3. The gate's failure message
# =================================================================================================
def failed_check_names(result: dict) -> str:
    """The gate's refusal as public facts: which checks failed, by name and column, without their statistics
    or figures (some are computed with the source's counts) and without stratum labels (categories of the
    source). `result` is the gate's verdict (run_gate_totals)."""
    names = []
    for r in result["statistical"]:
        if not r.get("passed"):
            what = r.get("check") or r.get("method") or "channel consistency"
            names.append(f"{what} on {r['variable']!r}" if r.get("variable") else what)
    for row in result["gx"]["rows"]:
        if not row.get("success"):
            names.append(f"{row.get('expectation')} on {row['column']!r}" if row.get("column")
                         else str(row.get("expectation")))
    names = list(dict.fromkeys(names))
    return (f"{len(names)} check{'s' if len(names) != 1 else ''} failed: {'; '.join(names)} (their statistics "
            "are on the terminal that started the run and in the private store's audit log)")


def gate_message(results: list[dict]) -> str:
    """One human-readable failure message naming every failed check (column, what failed, numbers).

    Accepts statistical results (from :func:`channel_consistency_test`, optionally with ``variable``
    and ``stratum``), GX summaries (a :func:`validate_table` output, or {"check": ..., "rows": [...]})
    and anything else with a ``message``.
    """
    parts: list[str] = []
    for res in results:
        if "rows" in res:
            for row in res["rows"]:
                if row.get("success"):
                    continue
                where = f"column {row['column']!r}" if row.get("column") else "table"
                parts.append(f"{where}: {row.get('expectation')} failed: {row.get('detail', '')}")
        elif "statistic" in res or "p_value" in res:
            if res.get("passed"):
                continue
            var = res.get("variable")
            where = f"variable {var!r}" if var else "channel consistency"
            if res.get("stratum") not in (None, "all"):
                where += f" (stratum {res['stratum']})"
            if res.get("method", "").startswith("kolmogorov"):
                parts.append(f"{where}: released values inconsistent with the published noise law: "
                             f"{res.get('message')} ({res.get('reason')})")
            elif res.get("df") is None:
                parts.append(f"{where}: released counts inconsistent with the channel: {res.get('reason')}")
            elif "holm_threshold" in res:
                parts.append(f"{where}: released counts inconsistent with the channel: statistic "
                             f"{res['statistic']:.4g} on {res['df']} df, {res['reason']} ({res.get('method')})")
            else:
                parts.append(f"{where}: released counts inconsistent with the channel: statistic "
                             f"{res['statistic']:.4g} on {res['df']} df, p = {res['p_value']:.3g} < level "
                             f"{res['level']:g} ({res.get('method')})")
        elif not res.get("passed", res.get("success", False)):
            parts.append(str(res.get("message") or res))
    if not parts:
        return ""
    return f"Validation gate failed ({len(parts)} check{'s' if len(parts) != 1 else ''}): " + "; ".join(parts)
