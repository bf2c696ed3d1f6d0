"""The analyst's side: open a release and estimate tables, means and regressions from it, and the change
between two releases of one population, corrected for their published channels (no Prefect here)."""

from pram_lib.analysis.change import ChangeEstimate, change_between
from pram_lib.analysis.release import Release, open_release
from pram_lib.analysis.source import ReleaseError

__all__ = ["open_release", "Release", "ReleaseError", "change_between", "ChangeEstimate"]
