"""Reading the source (its checks and errors), choosing every variable's channels through its family,
and the budget they spend.

Everything derived from the source here (profile, seeds) is confidential; only channels and
what is computed from the released table may be published.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import math
import re
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from pram_lib.core.channel import Channel
from pram_lib.core.guarantee import Public, spent_by_key
from pram_lib.core.model import (MISSING, NO_STRATUM, Assignment, GroupProfile, NumericProfile, Profile,  # noqa: F401
                                 VariableProfile, from_release_scale, keyed_generator, stratum_label, to_release_scale)
from pram_lib.families import family_of
from pram_lib.families.base import NotKept
from pram_lib.families.categorical import ESTIMATE_COLUMNS, estimate_frame, missing_as_category  # noqa: F401
from pram_lib.families.group import group_codes, group_marginals  # noqa: F401
from pram_lib.families.noise import THETA_STEP, estimate_distributions, numeric_column  # noqa: F401
from pram_lib.ops.audit import sha256_file
from pram_lib.ops.panel import PanelError, PanelStore
from pram_lib.pipeline.formats import check_labels, release_labels
from pram_lib.spec import ReleaseSpec, SpecError


# -- read ---------------------------------------------------------------------------------------
def needed_columns(spec: ReleaseSpec, key: bool = True) -> list[str]:
    """The source columns a release reads; without `key`, not a longitudinal key (pass 1 does not profile it)."""
    cols = [c for v in spec.variables for c in v.names] + list(spec.passthrough)
    cols += [spec.longitudinal.key] if spec.longitudinal and key else []
    return list(dict.fromkeys(cols))


UNREADABLE = (EOFError, zlib.error, gzip.BadGzipFile, lzma.LZMAError)  # a truncated or corrupt compressed file
_FIELDS = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")
_OPEN_QUOTE = re.compile(r"EOF inside string starting at row (\d+)")


def csv_options(spec: ReleaseSpec, dtypes: dict) -> dict:
    """pandas.read_csv options of both engines. Every column is read (then the unnamed ones are dropped):
    with `usecols=` pandas' C reader silently ignores extra fields in a row instead of refusing the row.
    Only the spec's `source.missing_values` are missing (a category "NA" is a value)."""
    return dict(dtype=dtypes, encoding="utf-8", keep_default_na=False, na_values=list(spec.source.missing_values))


def source_read_error(spec: ReleaseSpec, exc: BaseException, path: Path) -> SpecError:
    """One located SpecError for a source that cannot be read (the same in every engine; never retried).
    What pandas says may quote the data, so it goes to `found` only."""
    if isinstance(exc, SpecError):
        return exc
    if isinstance(exc, UnicodeDecodeError):
        return spec.error(("source", "path"), f"the source is not UTF-8 text (byte {exc.start})", str(path),
                          "convert it to UTF-8, e.g. iconv -f latin1 -t utf-8")
    m = _FIELDS.search(str(exc))
    if m:
        return spec.error(("source",), f"cannot read the source {path}: line {m[2]} has {m[3]} fields, the "
                          f"header has {m[1]}", str(path), "quote the fields that contain the delimiter (\"a,b\"), "
                          "or fix that line of the file")
    m = _OPEN_QUOTE.search(str(exc))
    if m:  # pandas counts rows from 0 at the header: row r is line r + 1
        return spec.error(("source",), f"cannot read the source {path}: a quote opened on line {int(m[1]) + 1} "
                          "is never closed", str(path), "close the quote on that line (or double a quote inside a "
                          "quoted field: \"\")")
    if isinstance(exc, UNREADABLE):
        return spec.error(("source", "path"), f"the compressed source {path} is truncated or corrupt",
                          f"{type(exc).__name__}: {exc}", "copy the file again, whole (compare its size or "
                          "checksum with the original), or point to the uncompressed file")
    if isinstance(exc, pd.errors.EmptyDataError):
        return spec.error(("source",), f"cannot read the source {path}: the file is empty (not even a header)",
                          str(path), "point to the complete file")
    if isinstance(exc, pd.errors.ParserError):
        return spec.error(("source",), f"cannot read the source {path}: not well-formed CSV", f"{path}: {exc}",
                          "fix the file's quoting (an unclosed quote runs to the end of the file)")
    return spec.error(("source",), f"cannot read the source {path} with the declared types",
                      f"{path}: {exc}", "check `source.dtypes` and the file's contents")


def check_columns(spec: ReleaseSpec, header: list[str]) -> None:
    """Refuse, located in the spec, a variable or passthrough column the source header lacks."""
    present = set(header)
    for i, v in enumerate(spec.variables):
        for c, loc, kind in family_of(v).released_names(v, i):
            if kind == "a variable" and c not in present:
                raise spec.error(loc, "column not in the source", c, f"use one of {sorted(present)[:30]}")
    for j, c in enumerate(spec.passthrough):
        if c not in present:
            raise spec.error(("passthrough", j), "column not in the source", c, f"use one of {sorted(present)[:30]}")
    if spec.longitudinal and spec.longitudinal.key not in present:
        raise spec.error(("longitudinal", "key"), "column not in the source", spec.longitudinal.key,
                         f"use one of {sorted(present)[:30]}")


# -- choose channels -------------------------------------------------------------------------------
def choose_channels(spec: ReleaseSpec, profile: Profile, seed: int) -> list[Assignment]:
    """Every variable's channels: a longitudinal population's kept ones (`keep_or_choose`), the others chosen by
    its family from the profile; then the leakage guard, the budget and what the statistical-package formats can
    hold."""
    kept = kept_channels(spec)
    out = [a for i, v in enumerate(spec.variables)
           for a in keep_or_choose(spec, i, v, profile, seed, kept.get(v.key))]
    check_budget(spec, out)
    if "sav" in spec.formats:
        check_labels(spec, release_labels(spec, profile, out))
    return out


def kept_channels(spec: ReleaseSpec) -> dict[str, dict]:
    """A longitudinal population's channels, each as the release that chose it published it ({} for a release
    without `longitudinal:` or with `channels: choose`, and before a population's first release)."""
    if spec.longitudinal is None or spec.longitudinal.channels != "keep":
        return {}
    try:
        return PanelStore(spec.resolve(spec.private_store), spec.population.key).kept_channels()
    except PanelError as exc:
        raise spec.error(("population", "key"), str(exc), spec.population.key,
                         "restore the file from the private store's backup, or delete it: every channel is then "
                         "chosen afresh at the next release, and a changed one charges every record") from None


def keep_or_choose(spec: ReleaseSpec, i: int, v, profile: Profile, seed: int, record: dict | None) -> list[Assignment]:
    """The variable's channel kept from the population's release that chose it (`record`: that release, the
    digest of the spec entry then, and the channel's law) when its spec entry is unchanged and the family can
    rebuild exactly that law on this profile; else chosen from this profile, saying why the kept one was not."""
    family = family_of(v)
    why = ""
    if record is not None:
        if record["spec"] != variable_digest(spec, v):
            why = "its spec entry (or a public file it names) changed"
        else:
            try:
                kept = family.keep(spec, i, v, profile, record["law"], record["release"])
            except NotKept as exc:
                why = str(exc)
            except SpecError:
                raise
            except (KeyError, TypeError, ValueError) as exc:   # a law the store holds damaged: chosen afresh
                why = f"its kept law could not be read ({type(exc).__name__})"
            else:
                if law_json(family.channel_law(spec, v, kept)) == law_json(record["law"]):
                    return kept
                why = "it could not be rebuilt exactly from the law kept"
    chosen = family.choose(spec, i, v, profile, seed)
    return [replace(a, rechosen=why) for a in chosen] if why else chosen


def variable_digest(spec: ReleaseSpec, v) -> str:
    """SHA-256 of a variable's spec entry and of the public files it names (a prior's reference table): what a
    kept channel was chosen from besides the source."""
    doc = v.model_dump(mode="json")
    h = hashlib.sha256(json.dumps(doc, sort_keys=True).encode())
    for name in sorted(_named_files(doc)):
        path = spec.resolve(name)
        h.update(sha256_file(path).encode() if path.is_file() else b"-")
    return h.hexdigest()


def _named_files(doc) -> set[str]:
    if isinstance(doc, dict):
        return {x for k, x in doc.items() if k == "file" and isinstance(x, str)} | \
            {f for x in doc.values() for f in _named_files(x)}
    if isinstance(doc, list):
        return {f for x in doc for f in _named_files(x)}
    return set()


def law_json(law: list[dict]) -> str:
    """A channel law as JSON, keys sorted: what its fingerprint hashes and the population keeps."""
    return json.dumps(law, sort_keys=True, default=str)


def channel_laws(spec: ReleaseSpec, assignments: list[Assignment]) -> dict[str, list[dict]]:
    """Each variable's channel law (its family's `channel_law`: the published entries less what they say of the
    source), as JSON reads it back."""
    return {v.key: json.loads(law_json(family_of(v).channel_law(spec, v, [a for a in assignments
                                                                           if a.column == v.key])))
            for v in spec.variables}


def law_fingerprint(law: list[dict]) -> str:
    """A channel law hashed: a record's memoized draws are keyed by it, so a changed law is a new draw."""
    return hashlib.sha256(law_json(law).encode()).hexdigest()[:16]


def spent_by_variable(assignments: list[Assignment]) -> dict[str, float]:
    """ε per record per DP variable: max over its (disjoint) strata, plus the prior's ε0.

    Noise channels are not differential privacy and are left out (reported with their own measure);
    so are variables the spec marks public (no privacy claimed; listed as unprotected).
    """
    return spent_by_key((a.column, a.guarantee) for a in assignments)


MATRIX_LIMIT = 32   # categories up to which a channel's matrix is kept in the ledger (its exact privacy loss)


def privacy_recipe(assignments: list[Assignment], level: float) -> list[dict]:
    """What the release published, for the ledger's composed accounting (pram_lib.ops.ledger.loss_of): per DP
    variable its channel's matrix (public: in channels.json) when it has one stratum, no DP prior and at most
    MATRIX_LIMIT categories, else its ε (an ε-LDP bound); and the gate's level β."""
    out: list[dict] = []
    for column, eps in spent_by_variable(assignments).items():
        mine = [a for a in assignments if a.column == column]
        a = mine[0]
        if (len(mine) == 1 and not a.prior_spent and isinstance(a.channel, Channel)
                and len(a.channel.categories) <= MATRIX_LIMIT):   # a group's channel: its ε bound
            out.append({"variable": column, "matrix": a.channel.matrix.tolist(), "epsilon": eps})
        else:
            out.append({"variable": column, "ldp": eps})
    return out + [{"gate": level}]


def public_variables(assignments: list[Assignment]) -> list[str]:
    """Variables the spec marks public (released through a channel but with no privacy claimed)."""
    return list(dict.fromkeys(a.column for a in assignments if isinstance(a.guarantee, Public)))


def check_budget(spec: ReleaseSpec, assignments: list[Assignment]) -> None:
    """The leakage guard (ε = ∞ only on variables marked public) and the per-release budget."""
    from pram_lib.spec import LEAK_FIX, leak_problem

    spent = spent_by_variable(assignments)
    for col, eps in spent.items():
        if not math.isfinite(eps):
            raise spec.error(spec.variable_loc(col), leak_problem(col), col, LEAK_FIX.format(col=col))
    total = sum(spent.values())
    if total > spec.budget + 1e-9:
        detail = ", ".join(f"{c}={e:.4g}" for c, e in spent.items())
        raise spec.error(("budget",), f"the chosen channels spend ε = {total:.4g} per record ({detail}), over "
                         "the budget", spec.budget, "raise `budget:` or lower the variables' levels")


# -- estimate (from the release only) ----------------------------------------------------------------
def expected_tvd(estimates: pd.DataFrame) -> dict[str, float]:
    """E[TVD(estimate, truth)] ≈ ½ Σ se·√(2/π) per variable (normal approximation; release-only)."""
    out = {}
    for (var, _), g in estimates.groupby(["variable", "stratum"], sort=False):
        t = 0.5 * float(np.sum(g["se"].to_numpy()) * math.sqrt(2 / math.pi))
        out[var] = max(out.get(var, 0.0), t)
    return out


