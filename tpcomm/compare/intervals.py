"""Intervals for B - A from the runs' own spread: within each repeat of a level, a block bootstrap; between
repeats (`tpcomm attribute --repeat N` runs each level N times, minutes apart), their spread; one
simultaneous band over all the differences of a level.

Within a repeat: each bootstrap draw takes the repeat's blocks (samples.py: whole requests where the split
rests on them, else runs of consecutive decode steps) with replacement and recomputes the level's statistics
exactly as the headline is computed (mean period and mean terms over decode pairs, the p50 of the per-request
delivery), so within a draw the terms still add up to the per-token time.

Between repeats: on a shared host the per-token time moves by more between two windows a minute apart than
any one window's own spread shows (measured here: docs/compare.md). Where a side has several repeats, each
side's value is the mean over its repeats, and the spread of the repeats around their side's mean (pooled
over both sides, df = repeats - 2) estimates the covariance between windows; what it holds beyond the
within-repeat bootstrap is the between-window part, added to each draw as a multivariate-t draw with that
covariance (the t's df carries the uncertainty of an estimate from a few repeats). With one repeat per side
nothing estimates it, and the intervals say they hold the within-run spread only.

Simultaneous band: a level states several differences at once (per-token time, compute, transfer, wait,
collectives, host gap, delivery, tok/s); judged one by one at 95% each, one of them would look changed in
about a quarter of A/A comparisons. With se_k the draws' standard deviation of difference k, c = the LEVEL
quantile over draws of max_k |d*_k - d_k| / se_k, and each interval is d_k +- c se_k: all intervals of a
level cover together with probability LEVEL. A statistic whose within-repeat draws' tails are unlike the
others' (a median with rare jumps: _own_tails) is left out of c and gets its own draws' interval (basic
bootstrap, not symmetric, not c x se) at a Bonferroni share of 1 - LEVEL, the band's c then taken at the
rest's share: together still LEVEL at least. A difference is resolved
when its interval excludes 0.

Units: ms (per token) and tok/s, as named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tpcomm.compare.samples import LevelSample, estimates, term_estimates

LEVEL = 0.95
REPLICATES = 4000
SEED = 20  # fixed: the same two runs always give the same intervals


@dataclass
class Interval:
    diff: float
    lo: float
    hi: float
    se: float

    @property
    def resolved(self) -> bool:
        return self.lo > 0 or self.hi < 0


@dataclass
class Band:
    intervals: dict[str, Interval]
    critical_value: float
    between_df: int  # 0: one repeat per side, the between-repeat spread is not in the intervals
    between_ms: float | None  # the between-repeat standard deviation of the per-token time (ms), when estimated
    # Statistics whose draws' tails are unlike the others' (_own_tails): each has its own draws' interval at
    # a 1 / (statistics with spread) share of 1 - LEVEL, and the shared band's c leaves them out.
    own_tails: list[str] = field(default_factory=list)


def replicates(sample: LevelSample, rng: np.random.Generator, n: int = REPLICATES) -> dict[str, np.ndarray]:
    """n bootstrap draws of one repeat's statistics (samples.estimates names them; plus "delivery")."""
    k = sample.blocks
    idx = rng.integers(0, k, size=(n, k))
    weights = np.bincount((idx + np.arange(n)[:, None] * k).ravel(), minlength=n * k).reshape(n, k).astype(float)
    out = estimates(sample, weights)
    rows = sample.delivery_rows
    if rows is not None and not sample.delivery_rows_joint and len(rows) >= 2:
        # above C=1 the term's requests share steps: drawn on their own, as the closure's compared requests are
        m = len(rows)
        ridx = rng.integers(0, m, size=(n, m))
        rw = np.bincount((ridx + np.arange(n)[:, None] * m).ravel(), minlength=n * m).reshape(n, m).astype(float)
        out.update(term_estimates(rows, rw))
    d = sample.delivery_ms
    if d.size >= 2 and np.isfinite(d).all():  # one request's p50 has no spread to draw from
        # Jointly with the engine's blocks where each block is a request; else the compared requests on their own.
        didx = idx if sample.delivery_joint else rng.integers(0, d.size, size=(n, d.size))
        out["delivery"] = np.percentile(d[didx], 50, axis=1)
    return out


def differences(a: list[LevelSample], b: list[LevelSample], seed: int = SEED, n: int = REPLICATES) -> Band:
    """The band of B - A for every statistic all repeats of both sides have (each side: mean over its repeats)."""
    rng = np.random.default_rng(seed)
    raw_a = [replicates(s, rng, n) for s in a]
    raw_b = [replicates(s, rng, n) for s in b]
    names = [k for k in raw_a[0] if all(k in d for d in raw_a + raw_b) and all(k in s.point for s in a + b)]
    pa = np.array([[s.point[k] for k in names] for s in a])  # (repeats, names)
    pb = np.array([[s.point[k] for k in names] for s in b])
    point = pb.mean(axis=0) - pa.mean(axis=0)
    da = [_centred(s, d, names) for s, d in zip(a, raw_a)]
    db = [_centred(s, d, names) for s, d in zip(b, raw_b)]
    dev = np.mean(db, axis=0) - np.mean(da, axis=0)  # (n, names): within-repeat spread of B - A, centred on 0
    # A bootstrap over K blocks has normal-like tails; the mean of K blocks has t-like ones (K - 1 df). One
    # chi-square scale per draw (all names alike, so their correlation stays) gives the draws Welch's df.
    v = [np.var(d[:, 0]) / len(a) ** 2 for d in da] + [np.var(d[:, 0]) / len(b) ** 2 for d in db]
    k = [s.blocks for s in a + b]
    df_within = sum(v) ** 2 / sum(x**2 / (kk - 1) for x, kk in zip(v, k)) if sum(v) > 0 else 0.0
    if df_within > 0:
        dev = dev * np.sqrt(df_within / rng.chisquare(df_within, size=n))[:, None]
    within = dev  # the within-repeat part alone: what _own_tails judges
    df = len(a) + len(b) - 2
    between_sd = None
    if df > 0:
        # A statistic that never varies on a side (transfer and wait without collectives, TP 1) has no spread
        # between that side's repeats either: the between part applies per side where it varies.
        va, vb = _varies(da), _varies(db)
        cov = _between_cov(pa, pb, da, db, va, vb)
        per_side = np.outer(va, va) / len(a) + np.outer(vb, vb) / len(b)
        # Multivariate t: one chi-square scale per draw carries the uncertainty of the covariance's estimate.
        z = rng.multivariate_normal(np.zeros(len(names)), cov * per_side, size=n, method="eigh")
        dev = dev + z * np.sqrt(df / rng.chisquare(df, size=n))[:, None]
        if names[0] == "per_token":
            between_sd = float(np.sqrt(max(cov[0, 0], 0.0)))
    # Each difference's scale: half its central 68% range (the standard error for normal draws; finite for the
    # heavy tails a few repeats give); c makes the band of scale multiples cover LEVEL of the draws at once.
    lo_q, hi_q = np.nanquantile(dev, [0.158655, 0.841345], axis=0)
    scale = (hi_q - lo_q) / 2
    scale = np.where(scale > 0, scale, np.nanstd(dev, axis=0))
    spread = scale > 0
    own = _own_tails(within, spread)
    shared = spread & ~own
    alpha = 1 - LEVEL
    c = 0.0
    if shared.any():
        # The shared band and each statistic with its own tails split 1 - LEVEL by their counts: together they
        # cover LEVEL at least (the union bound).
        zmax = np.nanmax(np.abs(dev[:, shared]) / scale[shared], axis=1)
        c = float(np.nanquantile(zmax, 1 - alpha * shared.sum() / spread.sum()))
    ivs = {}
    for i, k in enumerate(names):
        lo, hi = point[i] - c * scale[i], point[i] + c * scale[i]
        if own[i]:  # the basic bootstrap interval at this statistic's share: its own draws' tails
            q = alpha / spread.sum() / 2
            d_lo, d_hi = np.nanquantile(dev[:, i], [q, 1 - q])
            lo, hi = point[i] - d_hi, point[i] - d_lo
        ivs[k] = Interval(float(point[i]), float(lo), float(hi), float(scale[i]))
    return Band(ivs, c, df, between_sd, [k for i, k in enumerate(names) if own[i]])


# A statistic whose draws' 95th |deviation| percentile, in its own scale, is this many times the typical
# statistic's has tails the shared band does not fit (ODD_TAIL: see _own_tails).
ODD_TAIL = 2.0


def _own_tails(within: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """Per statistic: True where its within-repeat draws have tails unlike the others', so it gets an interval
    from its own draws and stays out of the shared band's critical value (`spread`: the statistics whose draws
    vary at all).

    Judged on the within-repeat draws (the bootstrap of each repeat's blocks), not after the between-repeat t
    draw is added: with 1 repeat against 2 (df 1) that draw is Cauchy-like, and a statistic whose spread is
    mostly between repeats cleared the bar by chance in 9-27% of synthetic comparisons, its interval then
    5-10x wider than the band's (a review's simulation, 2026-12-06).

    The shared band scales one critical value c by each statistic's central spread, which fits statistics
    alike in shape (all share the between-repeat t draw). A median of near-equal values with rare jumps (the
    closure's p50 delivery over a few requests) is not: at C=4 on a recorded request-id run its draws' 95th
    |deviation| percentile was 12.9 of its central half-range against 1.9-2.0 for every other statistic, and as
    the largest |z| in most draws it set c = 13.4 for all ten (3.3 at C=1 and C=2), four times too wide."""
    out = np.zeros(len(spread), dtype=bool)
    lo_q, hi_q = np.nanquantile(within, [0.158655, 0.841345], axis=0)
    scale = (hi_q - lo_q) / 2
    judged = spread & (scale > 0)
    if judged.sum() < 3:
        return out
    tail = np.nanquantile(np.abs(within[:, judged]) / scale[judged], LEVEL, axis=0)
    out[np.flatnonzero(judged)] = tail > ODD_TAIL * np.median(tail)
    return out


def _varies(devs: list[np.ndarray]) -> np.ndarray:
    """Per statistic: 1.0 where any repeat of the side shows spread, else 0.0."""
    return np.array([float(any(np.ptp(d[:, i]) > 0 for d in devs)) for i in range(devs[0].shape[1])])


def _centred(sample: LevelSample, draws: dict[str, np.ndarray], names: list[str]) -> np.ndarray:
    """One repeat's draws as deviations from their mean (n, names), scaled by sqrt(K / (K - 1)): a bootstrap
    over K blocks gives the variance of a mean times (K - 1) / K."""
    d = np.column_stack([draws[k] for k in names])
    k = sample.blocks
    return (d - d.mean(axis=0)) * np.sqrt(k / (k - 1))


def _between_cov(
    pa: np.ndarray, pb: np.ndarray, da: list[np.ndarray], db: list[np.ndarray], va: np.ndarray, vb: np.ndarray
) -> np.ndarray:
    """The between-repeat covariance of one repeat's statistics: the repeats' covariance around their side's
    mean, pooled over the sides where both statistics vary, less the mean within-repeat (bootstrap) covariance
    that it also holds; clipped to be positive semi-definite (a between part below the within part's noise is
    taken as none)."""
    k = pa.shape[1]
    prod, dfs, inner, reps = np.zeros((k, k)), np.zeros((k, k)), np.zeros((k, k)), np.zeros((k, k))
    for p, devs, v in ((pa, da, va), (pb, db, vb)):
        both = np.outer(v, v)
        d = p - p.mean(axis=0)
        prod += both * (d.T @ d)
        dfs += both * (len(p) - 1)
        for x in devs:
            inner += both * np.atleast_2d(np.cov(x, rowvar=False))
            reps += both
    pooled = np.divide(prod, dfs, out=np.zeros_like(prod), where=dfs > 0)
    inner = np.divide(inner, reps, out=np.zeros_like(inner), where=reps > 0)
    w, vec = np.linalg.eigh(np.where(dfs > 0, pooled - inner, 0.0))
    return (vec * np.clip(w, 0, None)) @ vec.T
