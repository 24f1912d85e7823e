"""The conditional logit behind the answer-identity probe, fitted many problems at a time.

A conditional logit scores candidate ``c`` of item ``n`` by ``w · z_nc`` and takes the softmax over
the item's candidates; the gold is candidate 0. The identity probe fits it with a handful of
weights (``K ≤ 4``, bounded ``w ≥ 0``) on a few dozen items, and its inner cross-validation does
so for every (outer fold, inner fold, L2 strength): sixty fits per (group, ratio), all on subsets
of the same items. So the fits are batched — problem ``b`` is a 0/1 mask ``A[b]`` over one padded
item set, with its own L2 strength and its own standardisation — and solved together by projected
Newton (Bertsekas 1982, with an ε-active set) on the exact gradient and Hessian, which for ``K``
weights is a ``K × K`` solve per step. It converges to machine precision in a few steps, where
L-BFGS-B (what this replaced) stopped at its default tolerances.

Shapes: ``N`` items, ``C`` candidates (padded), ``K`` features, ``B`` problems.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Armijo sufficient-decrease constant of the projected line search
_ARMIJO = 1e-4
#: the ε of the ε-active set: bound variables within this of 0 whose gradient pushes them out
_EPS_ACTIVE = 1e-3


def pad(feats: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Items of ``[n_i, K]`` → ``[N, C, K]`` zero-padded, with the ``[N, C]`` mask of real candidates."""
    C, K = max(f.shape[0] for f in feats), feats[0].shape[1]
    X, M = np.zeros((len(feats), C, K)), np.zeros((len(feats), C), bool)
    for i, f in enumerate(feats):
        X[i, : len(f)], M[i, : len(f)] = f, True
    return X, M


def gold_credit(S: np.ndarray, M: np.ndarray) -> np.ndarray:
    """Scores ``[..., N, C]`` → the gold's credit ``[..., N]``: 1 for the strict top, 1/k in a k-way tie, else 0.

    Ties as :func:`numpy.isclose` (rtol 1e-9, atol 1e-12) to the top score; padded candidates
    (``M`` false) never count.
    """
    S = np.where(M, S, -np.inf)
    top = S.max(-1, keepdims=True)
    tied = M & (np.abs(S - top) <= 1e-12 + 1e-9 * np.abs(top))  # [..., N, C]
    return np.where(tied[..., 0], 1.0 / tied.sum(-1), 0.0)


def fit_batch(X: np.ndarray, M: np.ndarray, A: np.ndarray, l2: np.ndarray | Sequence[float], *,
              nonnegative: bool = True, max_iter: int = 100) -> np.ndarray:
    """Weights ``[B, K]`` (on the features' own scale) of B conditional-logit fits on one padded item set.

    ``X [N, C, K]`` features with the gold at ``c = 0`` and ``M [N, C]`` its real candidates (see
    :func:`pad`); ``A [B, N]`` (bool) the items of each problem; ``l2 [B]`` its L2 strength.
    Problem ``b`` standardises the features by their standard deviation ``sd_b`` over its items'
    candidates (1 where that is 0), then maximises
    ``Σ_{n ∈ A_b} log softmax_c(w · x_nc / sd_b)[0] − l2_b/2 ‖w‖²``, with ``w ≥ 0`` when
    ``nonnegative``; it returns ``w / sd_b``. Each problem needs at least one item.
    """
    A = np.asarray(A, bool)
    Af = A.astype(float)  # [B, N]
    B, K = len(A), X.shape[2]
    lam = np.broadcast_to(np.asarray(l2, float), (B,))
    # standardisation per problem, over the candidate rows of its items (as np.std over them)
    R = Af[:, :, None] * M[None]  # [B, N, C] 1 where a row counts
    cnt = np.maximum(R.sum((1, 2)), 1.0)[:, None]  # [B, 1]
    mean = np.einsum("bnc,nck->bk", R, X) / cnt  # [B, K]
    var = np.einsum("bnc,bnck->bk", R, (X[None] - mean[:, None, None, :]) ** 2) / cnt
    sd = np.sqrt(var)
    sd = np.where(sd > 0, sd, 1.0)  # [B, K]
    Z = X[None] / sd[:, None, None, :]  # [B, N, C, K]
    ZZ = Z[..., :, None] * Z[..., None, :]  # [B, N, C, K, K]
    Z0 = np.einsum("bn,bnk->bk", Af, Z[:, :, 0])  # Σ_n gold features  [B, K]
    eye = np.eye(K)

    def objective(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s = np.where(M, np.einsum("bnck,bk->bnc", Z, w), -np.inf)  # [B, N, C]
        m = s.max(-1, keepdims=True)
        e = np.exp(s - m)
        tot = e.sum(-1)  # [B, N]
        f = (Af * (m[..., 0] + np.log(tot) - s[..., 0])).sum(1) + 0.5 * lam * (w * w).sum(1)  # [B]
        return f, e / tot[..., None], s

    def derivatives(w: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pa = p * Af[..., None]  # [B, N, C] item-masked softmax
        zbar = np.einsum("bnc,bnck->bnk", p, Z)  # [B, N, K] expected feature under the softmax
        g = np.einsum("bn,bnk->bk", Af, zbar) - Z0 + lam[:, None] * w  # [B, K]
        H = (np.einsum("bnc,bnckl->bkl", pa, ZZ) - np.einsum("bn,bnk,bnl->bkl", Af, zbar, zbar)
             + lam[:, None, None] * eye)  # [B, K, K]
        return g, H

    w = np.zeros((B, K))
    f, p, _ = objective(w)
    g, H = derivatives(w, p)
    done = np.zeros(B, bool)
    for _ in range(max_iter):
        pg = w - np.maximum(w - g, 0.0) if nonnegative else g  # projected gradient  [B, K]
        done |= np.abs(pg).max(1) <= 1e-13 * (1.0 + np.abs(f))
        if done.all():
            break
        if nonnegative:
            eps = np.minimum(_EPS_ACTIVE, np.linalg.norm(pg, axis=1))[:, None]
            act = (w <= eps) & (g > 0)  # held at the bound this step  [B, K]
        else:
            act = np.zeros((B, K), bool)
        free = ~act
        # Newton on the free variables, a diagonally scaled gradient step on the held ones
        diag = np.diagonal(H, axis1=1, axis2=2)
        Hr = np.where(free[:, :, None] & free[:, None, :], H, 0.0) + np.where(act, diag, 0.0)[:, :, None] * eye
        d = -np.linalg.solve(Hr, g[..., None])[..., 0]  # [B, K]
        t = np.ones(B)
        moved = done.copy()
        w_new, f_new, p_new = w.copy(), f.copy(), p.copy()
        for _ in range(60):
            cand = w + t[:, None] * d
            if nonnegative:
                cand = np.maximum(cand, 0.0)
            fc, pc, _ = objective(cand)
            decrease = -t * (g * d * free).sum(1) + (g * (w - cand) * act).sum(1)  # predicted, ≥ 0
            # the Armijo rule; near the optimum the decrease falls below f's rounding, where a full
            # Newton step that does not raise f beyond it is taken
            ok = ~moved & ((fc <= f - _ARMIJO * decrease)
                           | ((t == 1.0) & (decrease <= 1e-13 * (1.0 + np.abs(f)))
                              & (fc <= f + 1e-13 * (1.0 + np.abs(f)))))
            w_new[ok], f_new[ok], p_new[ok] = cand[ok], fc[ok], pc[ok]
            moved |= ok
            if moved.all():
                break
            t = np.where(moved, t, 0.5 * t)
        done |= ~moved  # no decrease left to find: f is at its rounding
        w, f, p = w_new, f_new, p_new
        g, H = derivatives(w, p)
    return w / sd
