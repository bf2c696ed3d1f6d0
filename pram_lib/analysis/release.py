"""Open a published release for analysis: tables, means and regressions corrected for its channels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from pram_lib.analysis.change import ChangeEstimate, change_between
from pram_lib.analysis.means import MeanEstimate, estimate_mean
from pram_lib.analysis.regress import RegressionResult, regress
from pram_lib.analysis.source import ReleaseData, ReleaseError, data_files
from pram_lib.analysis.tables import TableEstimate, estimate_table


class Release(ReleaseData):
    """A published release opened for analysis (see :func:`open_release`)."""

    def table(self, variables: Sequence[str] | str, by: Sequence[str] | str | None = None,
              confidence: float = 0.95, mle: bool = False) -> TableEstimate:
        """The estimated true joint distribution of categorical `variables` (within each cell of `by`); with
        `mle`, also the maximum-likelihood estimate."""
        return estimate_table(self, _names(variables), _names(by), confidence, mle)

    def mean(self, variable: str, by: Sequence[str] | str | None = None, confidence: float = 0.95,
             scale: str = "original") -> MeanEstimate:
        """The estimated true mean and variance of a continuous `variable` (within each true cell of `by`)."""
        return estimate_mean(self, variable, _names(by), confidence, scale)

    def change(self, later: "Release", variable: Sequence[str] | str, confidence: float = 0.95) -> ChangeEstimate:
        """The change of `variable` (shares, or the mean of a noised column; two categorical variables: their
        two-way table) from this release to `later`, a release of the same population (see
        pram_lib.analysis.change)."""
        return change_between(self, later, variable, confidence)

    def regress(self, formula: str | None = None, *, y: str | None = None, x: Sequence[str] | None = None,
                family: str = "gaussian", confidence: float = 0.95, success: str | None = None,
                reference: dict | None = None) -> RegressionResult:
        """A regression corrected for the channels, the naive fit beside (see pram_lib.analysis.regress);
        `reference` = {covariate: category} codes a covariate against that category (default: its first)."""
        return regress(self, formula, y=y, x=x, family=family, confidence=confidence, success=success,
                       reference=reference)


def _names(v) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    return [str(x) for x in v]


def open_release(folder: str | Path, *, verify: bool = True) -> Release:
    """Open a release folder for analysis. With `verify` (the default) every file is first checked against
    manifest.json (SHA-256), so an altered or incomplete release is refused."""
    import pyarrow.parquet as pq

    folder = Path(folder)
    cj = folder / "channels.json"
    if not cj.is_file():
        raise ReleaseError(f"{folder}: no channels.json; give the folder of a published release "
                           "(it holds channels.json, manifest.json and the data)")
    if verify:
        from pram_lib.ops.verify import verify_release

        for ok, message in verify_release(folder):
            if ok is False:
                raise ReleaseError(f"{message}; the release is not as published (open it with verify=False, "
                                   "or --no-verify, only if you know why)")
    try:
        doc = json.loads(cj.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ReleaseError(f"{cj}: cannot be read as JSON ({e})") from None
    files = data_files(folder)
    try:
        names = list(pq.ParquetFile(files[0]).schema_arrow.names)
    except (OSError, ValueError) as e:
        raise ReleaseError(f"{files[0]}: cannot be read as Parquet ({e}); the release is damaged") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("channels"), list):
        raise ReleaseError(f"{cj}: has no list `channels`; is it a pram-release channels.json?")
    return Release(folder, doc, files, names)
