"""The analyst's side: open a release and estimate tables, means and regressions from it, corrected for its
published channels (no Prefect here)."""

from pram_lib.analysis.release import Release, open_release
from pram_lib.analysis.source import ReleaseError

__all__ = ["open_release", "Release", "ReleaseError"]
