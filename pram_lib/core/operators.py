"""A categorical channel's linear algebra, written once: the estimator (pram_lib.core.estimate), the published
channel's check (pram_lib.core.codec), the analyst's tables (pram_lib.analysis) and the planner all use these
operators.

Conventions: M[x, z] = P(released z | true x), k true and m released cells, rows sum to 1; the moment
estimator is p̂ = G m̂ with G = M^{-T} (square) or the least-squares left inverse (M M^T)^{-1} M of M^T
(m > k); its covariance is n Cov(p̂) = G diag(m) G^T − p p^T at m = M^T p (multinomial sampling), so
n Var(p̂_x) = ((G∘G) m)_x − p_x².

Three forms, one interface (:class:`ChannelOperators`):

- :class:`KaryRR`: K-ary randomized response, M = d I + q 11^T (q = (1 − keep)/(K − 1), d = keep − q):
  closed forms, O(K);
- :class:`KeepUniformOperators`: family (8), a keep probability per category, M = diag(d) + r 1^T: O(S)
  inversion and variances (pivoted Sherman–Morrison);
- :class:`DenseOperators`: any k × m matrix (SVD condition, inverse or QR left inverse).

Each acts on a vector or along one axis of a tensor (``axis``), so a table's channel, the Kronecker product
of its axes' channels, is applied one axis at a time (:func:`apply_each`, :func:`kron_share_variance`) and
never built.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import null_space, solve_triangular

DEFAULT_MAX_CONDITION = 1e12


class NonIdentifiableError(ValueError):
    """The channel matrix is (numerically) singular: the true distribution cannot be estimated."""


def along(a: np.ndarray, t: np.ndarray, axis: int) -> np.ndarray:
    """Apply the matrix a (rows: the new axis length) along `axis` of t: Σ_j a[i, j] t[..j..]."""
    return np.moveaxis(np.tensordot(a, t, axes=([1], [axis])), 0, axis)


def gradient(ops, mhat, p):
    """g_x = ∂ℓ/∂p_x = Σ_z M_xz m̂_z / (M^T p)_z; the simplex MLE has g <= 1, with g = 1 on its support."""
    live = mhat > 0
    mp = ops.mt(p)
    ratio = np.zeros_like(mhat)
    ratio[live] = mhat[live] / mp[live]
    return ops.mu(ratio)


class ChannelOperators:
    """One channel's operators. A form defines ``k``, ``m``, ``matrix()``, ``inverse_matrix()``, ``condition()``;
    the tensor methods below default to the dense matrices and each form overrides them with its fast path."""

    k: int   # true cells
    m: int   # released cells

    def matrix(self) -> np.ndarray:
        """M, k × m."""
        raise NotImplementedError

    def inverse_matrix(self) -> np.ndarray:
        """G, k × m: p̂ = G m̂."""
        raise NotImplementedError

    def condition(self) -> float:
        raise NotImplementedError

    # -- along an axis (a vector is axis 0) ---------------------------------------------------------
    def forward(self, t: np.ndarray, axis: int = 0) -> np.ndarray:
        """Σ_x M[x, z] t[..x..] (M^T p: the released distribution of a true one)."""
        return along(self.matrix().T, np.asarray(t, dtype=float), axis)

    def adjoint(self, u: np.ndarray, axis: int = 0) -> np.ndarray:
        """Σ_z M[x, z] u[..z..]."""
        return along(self.matrix(), np.asarray(u, dtype=float), axis)

    def invert(self, u: np.ndarray, axis: int = 0) -> np.ndarray:
        """Σ_z G[x, z] u[..z..] (the moment estimate from released shares)."""
        return along(self.inverse_matrix(), np.asarray(u, dtype=float), axis)

    def invert_squared(self, u: np.ndarray, axis: int = 0) -> np.ndarray:
        """Σ_z G[x, z]² u[..z..] (the diagonal of G diag(u) G^T)."""
        return along(self.inverse_matrix() ** 2, np.asarray(u, dtype=float), axis)

    def invert_transpose(self, h: np.ndarray, axis: int = 0) -> np.ndarray:
        """Σ_x G[x, z] h[..x..]."""
        return along(self.inverse_matrix().T, np.asarray(h, dtype=float), axis)

    # -- the estimator's variance ----------------------------------------------------------------------
    def mt(self, p: np.ndarray) -> np.ndarray:
        return self.forward(p)

    def mu(self, u: np.ndarray) -> np.ndarray:
        return self.adjoint(u)

    def var_diag(self, m: np.ndarray, p: np.ndarray) -> np.ndarray:
        """n Var(p̂_x) = ((G∘G) m)_x − p_x² at released shares m."""
        return self.invert_squared(m) - np.asarray(p, dtype=float) ** 2

    def cov(self, m: np.ndarray, p: np.ndarray) -> np.ndarray:
        """n Cov(p̂) = G diag(m) G^T − p p^T."""
        g = self.inverse_matrix()
        return (g * m) @ g.T - np.outer(p, p)

    def share_variance(self, p: np.ndarray, n: float) -> np.ndarray:
        """Var(p̂_x) of each share's unbiased estimate from n records whose true distribution is p."""
        p = np.asarray(p, dtype=float)
        return np.maximum(self.var_diag(self.mt(p), p), 0.0) / n

    def variance_coefficients(self) -> np.ndarray:
        """C (k × k) with n Var(p̂_x) = (C p)_x − p_x² for every true p: C = (G∘G) M^T, column z the variance
        terms of a population all at z."""
        zero = np.zeros(self.k)
        return np.column_stack([self.var_diag(self.mt(e), zero) for e in np.eye(self.k)])


class Identity(ChannelOperators):
    """An unperturbed (public or passthrough) column: M = G = I."""

    def __init__(self, k: int):
        self.k = self.m = int(k)

    def matrix(self):
        return np.eye(self.k)

    inverse_matrix = matrix

    def condition(self) -> float:
        return 1.0

    def forward(self, t, axis=0):
        return np.asarray(t, dtype=float)

    adjoint = invert = invert_squared = invert_transpose = forward

    def __repr__(self) -> str:
        return f"Identity({self.k})"


class KaryRR(ChannelOperators):
    """K-ary randomized response: keep the true cell w.p. `keep`, else each other cell w.p. q = (1 − keep)/(K − 1).

    M = d I + q 11^T, d = keep − q (rows sum to d + K q = 1), so M^{-1} = (I − q 11^T)/d and
    G∘G = ((1 − 2q) I + q² 11^T)/d²: n Var(p̂_x) = ((1 − 2q) m_x + q² Σ m)/d² − p_x². All O(K) per fibre.
    Singular at keep = 1/K (d = 0); M is symmetric with eigenvalues d and 1, so cond₂ M = 1/|d|."""

    def __init__(self, k: int, keep: float):
        self.k = self.m = int(k)
        self.keep = float(keep)
        self.q = (1.0 - self.keep) / (self.k - 1) if self.k > 1 else 0.0
        self.d = self.keep - self.q

    def matrix(self):
        return self.d * np.eye(self.k) + self.q

    def inverse_matrix(self):
        return (np.eye(self.k) - self.q) / self.d

    def condition(self) -> float:
        return 1.0 / abs(self.d) if self.d != 0 else float("inf")

    def why_singular(self) -> str:
        return f"keep = {self.keep!r} is 1/K for K = {self.k}: every row of M is uniform"

    @staticmethod
    def _affine(t, axis, a, b):
        t = np.asarray(t, dtype=float)
        return a * t + b * t.sum(axis=axis, keepdims=True)

    def forward(self, t, axis=0):
        return self._affine(t, axis, self.d, self.q)

    adjoint = forward

    def invert(self, u, axis=0):
        return self._affine(u, axis, 1.0 / self.d, -self.q / self.d)

    invert_transpose = invert

    def invert_squared(self, u, axis=0):
        return self._affine(u, axis, (1.0 - 2.0 * self.q) / self.d ** 2, (self.q / self.d) ** 2)

    def on_factor(self, cells: int) -> "KaryRR":
        """The channel seen on a factor of the cells (`cells` divides K, e.g. some attributes of a cluster): K-RR
        on K' = cells cells with keep' = keep + (K/K' − 1) q (the true cell's K/K' − 1 siblings sharing its
        factor value each add q)."""
        cells = int(cells)
        if cells < 1 or self.k % cells:
            raise ValueError(f"{cells} cells are not a factor of the {self.k} cells")
        return KaryRR(cells, self.keep + (self.k // cells - 1) * self.q)

    def coefficients(self) -> tuple[float, float]:
        """(C[x, x], C[x, z ≠ x]) of :meth:`variance_coefficients`: C = (G∘G) M = ((1 − 2q) M + q² 11^T)/d²;
        (1, 0) for one category (its share is 1, known exactly)."""
        if self.k < 2:
            return 1.0, 0.0
        q, d = self.q, self.d
        return ((1.0 - 2.0 * q) * self.keep + q * q) / d ** 2, ((1.0 - 2.0 * q) * q + q * q) / d ** 2

    def variance_coefficients(self) -> np.ndarray:
        diag, off = self.coefficients()
        return off + (diag - off) * np.eye(self.k)

    def __repr__(self) -> str:
        return f"KaryRR({self.k}, keep={self.keep!r})"


class KeepUniformOperators(ChannelOperators):
    """Family (8) in O(S): M = diag(d) + r 1^T, rows sum to 1 so r = (1 − d)/S.

    Inversion with a pivot k = argmin |d_k| (stable also when one d_k = 0, i.e. q_k = 1/S, where M is still
    invertible): M^T p = m reads d_j p_j + c = m_j with c = r·p, and 1^T p = 1^T m = T. Eliminating p_k,
        c = g·m,  g_k = (1 − d_k)/δ,  g_j = d_k (1/d_j − 1)/δ  (j ≠ k),  δ = 1 + d_k Σ_{j≠k} 1/d_j,
        p_j = (m_j − c)/d_j (j ≠ k),  p_k = T − Σ_{j≠k} p_j.
    Without pivoting (all d_k ≠ 0) this is pram_dp.md's c = Σ r_k m_k/d_k / (1 + Σ r_k/d_k); δ = d_k S γ
    with γ = 1 + Σ r/d = Σ(1/d)/S, so det M = Π d · Σ(1/d) / S and M is singular iff δ = 0 (or two d's are 0).

    So G = M^{-T} = diag(h) − h g^T + e_k w^T with h_j = 1/d_j (h_k = 0), w = 1 − h + A g, A = Σ_j h_j
    (Sherman–Morrison in disguise). Then with W = Σ m_i g_i^2:
        n Var(p̂_j) = h_j^2 (m_j (1 − 2 g_j) + W) − p̂_j^2      (j ≠ k)
        n Var(p̂_k) = Σ_i m_i w_i^2 − p̂_k^2.
    ||M||_∞ = 1 and ||M^{-1}||_∞ = ||G||_1 (max column sum of |G|), also O(S).
    """

    def __init__(self, keep: np.ndarray):
        q = np.asarray(keep, dtype=float)
        s = q.size
        self.q, self.s = q, s
        self.k = self.m = s
        self.d = (s * q - 1.0) / max(s - 1, 1)      # one category: M = [1], nothing to estimate
        self.r = (1.0 - q) / max(s - 1, 1)
        self.pivot = int(np.argmin(np.abs(self.d)))
        self.n_zero = int(np.sum(self.d == 0.0))

    # M^T p and M u
    def mt(self, p: np.ndarray) -> np.ndarray:
        return self.d * p + float(self.r @ p)

    def mu(self, u: np.ndarray) -> np.ndarray:
        return self.d * u + self.r * float(u.sum())

    def grad(self, mhat: np.ndarray, p: np.ndarray) -> np.ndarray:
        return gradient(self, mhat, p)

    def newton_direction(self, mhat, p, idx, g):
        """Newton step on the support idx in O(|idx|).

        On A, H_AA = Λ + U C U^T with Λ = diag(d² w), w = m̂/μ², U = [d∘w, r], C = [[0, 1], [1, Σw]]
        (from M = diag(d) + r 1^T). With B = [U, 1], η = (C U^T Δ, ν), E = blockdiag(C^{-1}, 0) the
        bordered system becomes ΛΔ + Bη = g, B^T Δ = Eη. Where Λ_x > 0 (set P), Δ_x = (g_x − B_x η)/Λ_x;
        where Λ_x = 0 (set Z: unobserved output or d_x = 0) the rows read B_x η = g_x, and Δ_Z only enters
        through σ = B_Z^T Δ_Z. So (η, σ) solve the small system K η − σ = B_P^T Λ_P^{-1} g_P, B_Z η = g_Z,
        σ ⊥ null(B_Z), with K = B_P^T Λ_P^{-1} B_P + E; then Δ_Z is the minimum-norm solution of
        B_Z^T Δ_Z = σ.
        """
        live = mhat > 0
        mu = self.mt(p)
        w = np.zeros_like(mhat)
        w[live] = mhat[live] / mu[live] ** 2
        sw = float(w.sum())
        d, r = self.d[idx], self.r[idx]
        wa = w[idx]
        lam = d * d * wa
        B = np.column_stack([d * wa, r, np.ones(idx.size)])
        E = np.array([[-sw, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
        top = lam.max() if lam.size else 0.0
        P = lam > 1e-12 * top if top > 0 else np.zeros(idx.size, dtype=bool)
        Z = ~P
        gA = g[idx]
        BP, li = B[P], 1.0 / lam[P]
        K = BP.T @ (BP * li[:, None]) + E
        rhs = BP.T @ (gA[P] * li)
        delta = np.zeros(idx.size)
        if not Z.any():
            eta = np.linalg.lstsq(K, rhs, rcond=None)[0]
        else:
            BZ = B[Z]
            u, sv, vt = np.linalg.svd(BZ, full_matrices=False)
            rank = int(np.sum(sv > sv[0] * 1e-12)) if sv.size and sv[0] > 0 else 0
            null = null_space(vt[:rank]).T if rank else np.eye(3)  # basis of null(B_Z) in R^3
            rows = [np.hstack([K, -np.eye(3)]), np.hstack([BZ, np.zeros((BZ.shape[0], 3))])]
            if null.shape[0]:
                rows.append(np.hstack([np.zeros((null.shape[0], 3)), null]))
            big = np.vstack(rows)
            b = np.concatenate([rhs, gA[Z], np.zeros(null.shape[0])])
            sol = np.linalg.lstsq(big, b, rcond=None)[0]
            eta, sigma = sol[:3], sol[3:]
            # minimum-norm Δ_Z with B_Z^T Δ_Z = σ
            delta[Z] = u[:, :rank] @ ((vt[:rank] @ sigma) / sv[:rank])
        delta[P] = li * (gA[P] - BP @ eta)
        return delta

    def _parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        d, k = self.d, self.pivot
        h = np.zeros(self.s)
        mask = np.ones(self.s, dtype=bool)
        mask[k] = False
        with np.errstate(divide="ignore"):
            h[mask] = 1.0 / d[mask]
        a = float(h.sum())
        delta = 1.0 + d[k] * a
        with np.errstate(divide="ignore", invalid="ignore"):
            g = d[k] * (h - 1.0) / delta
            g[k] = (1.0 - d[k]) / delta
        w = 1.0 - h + a * g
        return h, g, w

    def condition(self) -> float:
        return float(keep_condition(self.q)[0])

    def why_singular(self) -> str:
        if self.n_zero >= 2:
            return (f"{self.n_zero} categories have keep probability exactly 1/S, so their rows of M are "
                    f"identical (uniform) and rank M <= {self.s - self.n_zero + 1} < {self.s}")
        return (f"det M = Π d_k · Σ_k (1/d_k) / S with d_k = (S q_k − 1)/(S − 1), and "
                f"Σ 1/d_k = {float(np.sum(1.0 / self.d)):.3g} ≈ 0 relative to Σ |1/d_k| = "
                f"{float(np.sum(np.abs(1.0 / self.d))):.3g}")

    def matrix(self) -> np.ndarray:
        m = np.repeat(self.r[:, None], self.s, axis=1)
        np.fill_diagonal(m, self.q)
        return m

    def inverse_matrix(self) -> np.ndarray:
        """G = diag(h) − h g^T + e_k w^T (k the pivot), O(S²) memory."""
        h, g, w = self._parts()
        out = np.diag(h) - np.outer(h, g)
        out[self.pivot] += w
        return out

    def forward(self, t, axis=0):
        return self.mt(t) if np.ndim(t) == 1 else super().forward(t, axis)

    def adjoint(self, u, axis=0):
        return self.mu(u) if np.ndim(u) == 1 else super().adjoint(u, axis)

    def invert_squared(self, u, axis=0):
        return self.var_diag(u, np.zeros(self.s)) if np.ndim(u) == 1 else super().invert_squared(u, axis)

    def invert(self, m: np.ndarray, axis: int = 0) -> np.ndarray:
        if np.ndim(m) != 1:
            return super().invert(m, axis)
        h, g, _ = self._parts()
        c = float(g @ m)
        p = h * (m - c)
        p[self.pivot] = 0.0
        p[self.pivot] = float(m.sum()) - float(p.sum())
        return p

    def var_diag(self, m: np.ndarray, p: np.ndarray) -> np.ndarray:
        h, g, w = self._parts()
        big_w = float(m @ (g * g))
        v = h * h * (m * (1.0 - 2.0 * g) + big_w)
        v[self.pivot] = float(m @ (w * w))
        return v - p * p

    def cov(self, m: np.ndarray, p: np.ndarray) -> np.ndarray:
        """n Cov = G diag(m) G^T − p p^T in O(S^2), from G = H + e_k w^T, H = diag(h) − h g^T."""
        h, g, w = self._parts()
        k = self.pivot
        big_w = float(m @ (g * g))
        hmg = h * m * g
        out = np.diag(h * h * m) - np.outer(hmg, h) - np.outer(h, hmg) + big_w * np.outer(h, h)
        hdw = h * m * w - h * float(g @ (m * w))  # H diag(m) w
        out[:, k] += hdw
        out[k, :] += hdw
        out[k, k] += float(m @ (w * w))
        out -= np.outer(p, p)
        return out


def keep_condition(keep: np.ndarray) -> np.ndarray:
    """∞-norm condition numbers of family-(8) matrices, one per row of ``keep`` (N, S), vectorised: O(N·S).

    ||M||_∞ = 1 and ||M^{-1}||_∞ = ||G||_1 from the pivoted inverse of :class:`KeepUniformOperators`; inf where M is
    singular (two or more keep probabilities at 1/S, or δ = 0)."""
    q = np.atleast_2d(np.asarray(keep, dtype=float))
    n, s = q.shape
    if s < 2:
        return np.full(n, np.inf)
    d = (s * q - 1.0) / (s - 1)
    rows = np.arange(n)
    k = np.argmin(np.abs(d), axis=1)
    dk = d[rows, k]
    with np.errstate(divide="ignore", invalid="ignore"):
        h = 1.0 / d
        h[rows, k] = 0.0
        a = h.sum(axis=1)
        delta = 1.0 + dk * a
        g = dk[:, None] * (h - 1.0) / delta[:, None]
        g[rows, k] = (1.0 - dk) / delta
        w = 1.0 - h + a[:, None] * g
        habs = np.abs(h).sum(axis=1)
        col = np.abs(g) * (habs[:, None] - np.abs(h)) + np.abs(h) * np.abs(1.0 - g) + np.abs(w)
        col[rows, k] = np.abs(g[rows, k]) * habs + np.abs(w[rows, k])
        cond = col.max(axis=1)
    bad = (np.sum(d == 0.0, axis=1) >= 2) | ~np.all(np.isfinite(g), axis=1) | ~np.all(np.isfinite(h), axis=1) \
        | ~np.isfinite(cond)
    return np.where(bad, np.inf, cond)


class DenseOperators(ChannelOperators):
    """General k×m matrix: SVD for rank/condition, inverse (square) or pseudo-inverse (m > k)."""

    def __init__(self, matrix: np.ndarray):
        self.M = np.asarray(matrix, dtype=float)
        self.kin, self.kout = self.M.shape
        self.k, self.m = self.M.shape
        self._g = self._g2 = None

    def mt(self, p: np.ndarray) -> np.ndarray:
        return p @ self.M

    def mu(self, u: np.ndarray) -> np.ndarray:
        return self.M @ u

    def condition(self) -> float:
        if self.kout < self.kin:
            return float("inf")
        sv = np.linalg.svd(self.M, compute_uv=False)
        self.rank = int(np.sum(sv > sv[0] * max(self.M.shape) * np.finfo(float).eps))
        return float(sv[0] / sv[-1]) if sv[-1] > 0 else float("inf")

    def why_singular(self) -> str:
        if self.kout < self.kin:
            return (f"it has only {self.kout} output categories for {self.kin} true ones, so M^T "
                    "cannot have full column rank")
        rank = getattr(self, "rank", None)
        return f"rank M = {rank} < {self.kin} (numerical rank, SVD)"

    def grad(self, mhat: np.ndarray, p: np.ndarray) -> np.ndarray:
        return gradient(self, mhat, p)

    def newton_direction(self, mhat, p, idx, g):
        """Δ on the support idx from the dense bordered system (LU; lstsq if H is singular)."""
        live = mhat > 0
        Ml = self.M[np.ix_(idx, np.nonzero(live)[0])]
        mu = self.mt(p)[live]
        na = idx.size
        K = np.zeros((na + 1, na + 1))
        K[:na, :na] = (Ml * (mhat[live] / mu**2)) @ Ml.T
        K[:na, na] = K[na, :na] = 1.0
        rhs = np.concatenate([g[idx], [0.0]])
        try:
            sol = np.linalg.solve(K, rhs)
            if not np.all(np.isfinite(sol)) or np.abs(K @ sol - rhs).max() > 1e-8 * (1 + np.abs(rhs).max()):
                raise np.linalg.LinAlgError
        except np.linalg.LinAlgError:
            sol = np.linalg.lstsq(K, rhs, rcond=None)[0]
        return sol[:na]

    def G(self) -> np.ndarray:
        """M^{-T} (square) or the least-squares left inverse L = (M M^T)^{-1} M of M^T, via QR: M^T = QR,
        L = R^{-1} Q^T (same as pinv(M^T) at full column rank, without an SVD)."""
        if self._g is None:
            mt = self.M.T
            if self.kin == self.kout:
                self._g = np.linalg.inv(mt)
            else:
                qm, rm = np.linalg.qr(mt)
                self._g = solve_triangular(rm, qm.T)
        return self._g

    def matrix(self) -> np.ndarray:
        return self.M

    def inverse_matrix(self) -> np.ndarray:
        return self.G()

    def forward(self, t, axis=0):
        return self.mt(t) if np.ndim(t) == 1 else along(self.M.T, t, axis)

    def adjoint(self, u, axis=0):
        return self.mu(u) if np.ndim(u) == 1 else along(self.M, u, axis)

    def invert_squared(self, u, axis=0):
        if self._g2 is None:
            self._g2 = self.G() ** 2
        return along(self._g2, np.asarray(u, dtype=float), axis)

    def invert(self, m: np.ndarray, axis: int = 0) -> np.ndarray:
        if np.ndim(m) != 1:
            return along(self.G(), m, axis)
        if self.kin == self.kout:
            return np.linalg.solve(self.M.T, m)
        return self.G() @ m

    def var_diag(self, m: np.ndarray, p: np.ndarray) -> np.ndarray:
        return self.invert_squared(m) - p * p

    def cov(self, m: np.ndarray, p: np.ndarray) -> np.ndarray:
        g = self.G()
        return (g * m) @ g.T - np.outer(p, p)


def operators_of(channel) -> ChannelOperators:
    """The operators of a published or built channel (pram_lib.core.channel.Channel): family (8) in O(S), else
    dense. A channel with one category has nothing to estimate (NonIdentifiableError)."""
    if channel.keep is not None:
        if channel.n_inputs < 2:
            name = ",".join(map(str, channel.variables)) or "?"
            raise NonIdentifiableError(f"variable {name!r}: a channel needs at least 2 categories")
        return KeepUniformOperators(channel.keep)
    return DenseOperators(channel.dense)


def share_variance(channel, p, n: float) -> np.ndarray | None:
    """Var of each share's unbiased estimate for n records drawn from p (the planner's figure); None when the
    estimator would refuse the channel as singular."""
    ops = usable_operators(channel)
    return None if ops is None else ops.share_variance(p, n)


def variance_coefficients(channel) -> np.ndarray | None:
    """C with n Var(p̂_x) = (C p)_x − p_x² for every true p; None when the estimator would refuse the channel."""
    ops = usable_operators(channel)
    return None if ops is None else ops.variance_coefficients()


def usable_operators(channel, max_condition: float = DEFAULT_MAX_CONDITION) -> ChannelOperators | None:
    """:func:`operators_of`, or None where the estimator would refuse the channel as singular (the planner's
    question: is there an estimate whose variance to plan?)."""
    try:
        ops = operators_of(channel)
    except NonIdentifiableError:
        return None
    cond = ops.condition()
    return ops if np.isfinite(cond) and cond <= max_condition else None


# ------------------------------------------------------------------------------------------------
# a table: the Kronecker product of its axes' channels, applied one axis at a time
# ------------------------------------------------------------------------------------------------
def apply_each(t: np.ndarray, axes: list[ChannelOperators], how: str) -> np.ndarray:
    """Apply every axis's operator `how` (a ChannelOperators tensor method name: forward, adjoint, invert,
    invert_squared, invert_transpose) along its axis; t has one leading axis per channel (trailing axes, if
    any, are left alone). The result is (⊗_t A_t) applied to t, the product never built."""
    for i, a in enumerate(axes):
        t = getattr(a, how)(t, i)
    return t


def kron_inverse(axes: list[ChannelOperators]) -> np.ndarray:
    """The dense G of the whole table (product of true cells × product of released cells), row-major."""
    g = np.ones((1, 1))
    for a in axes:
        g = np.kron(g, a.inverse_matrix())
    return g


def kron_share_variance(P: np.ndarray, axes: list[ChannelOperators], n: float) -> np.ndarray:
    """Var of each cell's unbiased estimate for a true table P (one axis per channel, the axes perturbed
    independently): n Var = (⊗ G_t∘G_t)(⊗ M_t^T) P − P² (G∘G of a Kronecker product is the product of the
    G_t∘G_t); O(cells) per axis for K-ary RR."""
    P = np.asarray(P, dtype=float)
    return np.maximum(apply_each(apply_each(P, axes, "forward"), axes, "invert_squared") - P * P, 0.0) / n


# ------------------------------------------------------------------------------------------------
# the largest variance over every truth (the planner's worst case), from the variance coefficients
# ------------------------------------------------------------------------------------------------
def split_coefficients(C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a_x = C[x, x], A_x = max_{z ≠ x} C[x, z]) per share x, C from
    :meth:`ChannelOperators.variance_coefficients`."""
    a = np.diag(C).copy()
    off = np.where(np.eye(len(a), dtype=bool), -np.inf, C)
    return a, off.max(axis=1)


def worst_variance(a, A, s: float) -> np.ndarray:
    """n × the largest Var(p̂_x) over every truth p with p_x ≥ s. With p_x = t, n Var = a t + Σ_{z≠x} C[x, z] p_z
    − t² is largest with the other 1 − t on the z of largest C[x, z] (A): f(t) = A(1 − t) + a t − t², a concave
    parabola, largest at t = clip((a − A)/2, s, 1)."""
    a, A = np.asarray(a, dtype=float), np.asarray(A, dtype=float)
    t = np.clip((a - A) / 2.0, s, 1.0)
    return np.maximum(A * (1.0 - t) + a * t - t * t, 0.0)


def worst_relative_variance(a, A, s: float) -> np.ndarray:
    """n × the largest Var(p̂_x)/p_x² over every truth with p_x ≥ s > 0: f(t)/t² = A u² + (a − A) u − 1 with
    u = 1/t in [1, 1/s] is convex in u (A ≥ 0), so it is largest at t = s or t = 1."""
    a, A = np.asarray(a, dtype=float), np.asarray(A, dtype=float)
    at_s = (A * (1.0 - s) + a * s - s * s) / (s * s)
    return np.maximum(np.maximum(at_s, a - 1.0), 0.0)
