"""One conversion to what strict JSON can hold, for everything the project publishes or stores."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd


def to_json(x: Any) -> Any:
    """numpy scalars and arrays to Python, ±inf to "inf"/"-inf", NaN and missing to None, containers element by
    element (dict keys as strings), anything else to its str()."""
    if isinstance(x, dict):
        return {str(k): to_json(v) for k, v in x.items()}
    if isinstance(x, np.ndarray):
        return [to_json(v) for v in x.tolist()]
    if isinstance(x, (list, tuple, set)):
        return [to_json(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    try:
        if pd.isna(x):
            return None
    except (TypeError, ValueError):
        pass
    return str(x)
