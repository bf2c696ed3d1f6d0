"""The one Channel abstraction: a randomisation channel that carries its own privacy guarantee.

Convention everywhere: ``M[x, z] = P(Z = z | X = x)`` (rows = true value, rows sum to 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from pram_lib.core.codec import PublishedCategorical, EntryError, decode_entry, encode_categorical
from pram_lib.core.epsilon import dense_epsilon, gamma_of, keep_uniform_column_extremes, keep_uniform_epsilon  # noqa: F401
from pram_lib.core.guarantee import LDP
from pram_lib.core.operators import ChannelOperators, DenseOperators, KeepUniformOperators
from pram_lib.core.perturb import sample_dense, sample_keep_uniform

MISSING = -1  # code of a missing value; it stays missing through every channel


def _frozen(a: np.ndarray | None) -> np.ndarray | None:
    if a is None:
        return None
    a = np.array(a, dtype=float)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class Channel:
    """A categorical perturbation channel; everything in it may be published.

    Exactly one of ``keep`` (family (8): keep x w.p. keep[x], else uniform over the other S-1
    categories; stored in O(S)) or ``dense`` (a general k×m row-stochastic matrix) is set.
    """

    variables: tuple[str, ...]
    categories: tuple[Any, ...]
    method: str
    objective: float = float("nan")
    keep: np.ndarray | None = None
    dense: np.ndarray | None = None
    output_categories: tuple[Any, ...] | None = None
    certified: bool = True
    details: dict = field(default_factory=dict)
    epsilon: float = field(init=False)

    def __post_init__(self) -> None:
        if (self.keep is None) == (self.dense is None):
            raise ValueError("Channel needs exactly one of keep= (family (8)) or dense= (general matrix)")
        object.__setattr__(self, "variables", tuple(self.variables))
        object.__setattr__(self, "categories", tuple(self.categories))
        object.__setattr__(self, "keep", _frozen(self.keep))
        object.__setattr__(self, "dense", _frozen(self.dense))
        k = len(self.categories)
        if self.keep is not None:
            if self.keep.shape != (k,):
                raise ValueError(f"keep has shape {self.keep.shape}, expected ({k},) for {k} categories")
            if self.output_categories is not None and tuple(self.output_categories) != self.categories:
                raise ValueError("a family-(8) channel releases the same categories it reads")
            object.__setattr__(self, "output_categories", self.categories)
            eps = keep_uniform_epsilon(self.keep)
        else:
            out = self.categories if self.output_categories is None else tuple(self.output_categories)
            object.__setattr__(self, "output_categories", out)
            if self.dense.shape != (k, len(out)):
                raise ValueError(f"matrix has shape {self.dense.shape}, expected ({k}, {len(out)})")
            eps = dense_epsilon(self.dense)
        object.__setattr__(self, "epsilon", eps)

    # -- privacy ---------------------------------------------------------------------------
    @property
    def guarantee(self) -> LDP:
        """ε-LDP per record, ε the largest log-ratio within a column of the matrix."""
        return LDP(self.epsilon)

    @property
    def gamma(self) -> float:
        """Chai–Nayak parity bound γ = e^ε (every Bayes factor lies in [1/γ, γ])."""
        return gamma_of(self.epsilon)

    # -- structure ---------------------------------------------------------------------------
    @property
    def n_inputs(self) -> int:
        return len(self.categories)

    @property
    def n_outputs(self) -> int:
        return len(self.output_categories)

    @property
    def is_keep_uniform(self) -> bool:
        return self.keep is not None

    @property
    def operators(self) -> ChannelOperators:
        """Its linear algebra (pram_lib.core.operators): M^T p, the inversion, the estimator's variances."""
        return KeepUniformOperators(self.keep) if self.keep is not None else DenseOperators(self.dense)

    @property
    def matrix(self) -> np.ndarray:
        """The dense matrix M[x, z]; built on demand for family (8) (O(S^2) memory)."""
        return np.array(self.dense) if self.dense is not None else self.operators.matrix()

    def marginal(self, p: Sequence[float]) -> np.ndarray:
        """Distribution of the released value when the true one has distribution p: m = M^T p."""
        return self.operators.mt(np.asarray(p, dtype=float))

    # -- data path ----------------------------------------------------------------------------
    def perturb_codes(self, codes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Perturb integer codes 0..k-1 (MISSING = -1 stays missing); returns output codes (int64)."""
        codes = np.asarray(codes)
        if self.keep is not None:  # the kernel checks the range in its pass
            return sample_keep_uniform(codes, self.keep, rng)
        if codes.size and (codes.max() >= self.n_inputs or codes.min() < MISSING):
            raise ValueError(f"codes must lie in [-1, {self.n_inputs - 1}]")
        return sample_dense(codes, self.dense, rng)

    def perturb(self, values: Any, rng: np.random.Generator) -> Any:
        """Perturb labels (pandas Series / array of category labels; missing stays missing).

        An integer numpy array is taken as codes and codes are returned.
        """
        if isinstance(values, np.ndarray) and np.issubdtype(values.dtype, np.integer):
            return self.perturb_codes(values, rng)
        series = values if isinstance(values, pd.Series) else pd.Series(values)
        codes = encode(series, self.categories, name=",".join(self.variables))
        out = self.perturb_codes(codes, rng)
        return pd.Series(
            pd.Categorical.from_codes(out, categories=list(self.output_categories)),
            index=series.index,
            name=series.name,
        )

    def estimate(self, released_counts: Sequence[float], level: float = 0.95):
        """Estimate of the true distribution from released counts, intervals at `level` (see pram_lib.core.estimate)."""
        from pram_lib.core.estimate import estimate_distribution

        return estimate_distribution(self, released_counts, level=level)

    # -- publication ----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """What a release publishes about this channel (JSON-ready)."""
        return encode_categorical(self.variables, self.categories, self.output_categories, self.keep, self.dense,
                                  self.epsilon, self.method, self.certified, self.objective, self.details)

    @classmethod
    def from_dict(cls, d: dict) -> "Channel":
        """Inverse of to_dict (an analyst rebuilds the published channel); an entry that is not a valid channel is
        refused (pram_lib.core.codec.EntryError, naming the field)."""
        e = decode_entry(d)
        if not isinstance(e, PublishedCategorical):
            raise EntryError("entry.family", "", f"is {d['family']!r}, not a categorical channel (keep-uniform, dense)")
        return cls.from_entry(e)

    @classmethod
    def from_entry(cls, e: "PublishedCategorical") -> "Channel":
        """The channel a read entry (pram_lib.core.codec.decode_entry) publishes."""
        kw = dict(variables=e.variables, categories=e.categories, method=e.method, objective=e.objective,
                  certified=e.certified, details=e.details)
        if e.keep is not None:
            return cls(keep=e.keep, **kw)
        return cls(dense=e.matrix, output_categories=e.output_categories, **kw)

    def __repr__(self) -> str:
        kind = "keep-uniform" if self.keep is not None else f"dense {self.n_inputs}x{self.n_outputs}"
        return (f"Channel({'/'.join(self.variables) or '?'}: {kind}, S={self.n_inputs}, "
                f"eps={self.epsilon:.4g}, gamma={self.gamma:.4g}, method={self.method!r})")


Channel.alpha = property(lambda self: self.epsilon, doc="α of the PRAM paper; the same number as ε.")


def encode(values: pd.Series, categories: Sequence[Any], name: str = "") -> np.ndarray:
    """Map labels to codes 0..k-1 (missing -> -1). Unknown labels raise, naming them."""
    cats = list(categories)
    if isinstance(values.dtype, pd.CategoricalDtype) and list(values.cat.categories) == cats:
        return values.cat.codes.to_numpy(dtype=np.int64)
    codes = pd.Categorical(values, categories=cats).codes.astype(np.int64)
    bad = (codes == -1) & values.notna().to_numpy()
    if bad.any():
        unknown = sorted(map(str, pd.unique(values[bad])))[:10]
        raise ValueError(
            f"variable {name!r}: values {unknown} are not among the channel's categories {cats[:20]}; "
            "add them to the declared domain or recode them"
        )
    return codes
