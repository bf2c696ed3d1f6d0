"""The two-sided normal quantile every interval in the project uses (the one place it is computed)."""

from __future__ import annotations

from scipy.special import ndtri   # scipy.stats.norm.ppf without importing scipy.stats


def z_value(confidence: float) -> float:
    """z with P(|N(0, 1)| <= z) = confidence: Φ⁻¹((1 + confidence)/2) (1.959964 at 0.95). ValueError unless
    0 < confidence < 1."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1 (e.g. 0.95), got {confidence!r}")
    return float(ndtri(0.5 + confidence / 2.0))
