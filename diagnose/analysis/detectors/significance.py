"""The one-sided tests the detectors judge by, giving scipy.stats' p-values:
the binomial and the Mann-Whitney U (straggler's intermittent path), Spearman's
rank correlation (workload_imbalance).

Why not scipy.stats: importing it costs 0.6-0.7 s of CPU in every process that
analyzes, and 13 of the 20 recorded runs' analyses reach one of these tests (the
end of every `diagnose run`, every `diagnose analyze`); scipy.special, which
holds the distributions these need, costs 0.1 s. tests/analysis/test_significance.py
compares every function with scipy.stats on random and tied samples.
"""

from math import comb, sqrt

import numpy as np


def binomial_greater(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): scipy.stats.binomtest(k, n, p,
    alternative="greater").pvalue (the regularized incomplete beta I_p(k, n-k+1))."""
    from scipy.special import betainc

    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return float(min(1.0, betainc(k, n - k + 1, p)))


def average_ranks(values) -> tuple[np.ndarray, np.ndarray]:
    """(ranks from 1, ties averaged; the size of each group of equal values)."""
    values = np.asarray(values, dtype=np.float64)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts  # ranks before each distinct value
    return (first + (counts + 1) / 2.0)[inverse], counts


def mann_whitney_greater(x, y) -> float:
    """One-sided Mann-Whitney U (x stochastically greater than y), as
    scipy.stats.mannwhitneyu(x, y, alternative="greater"): exact when a sample has
    at most 8 values and none are tied, else the normal approximation with the tie
    correction and the continuity correction."""
    from scipy.special import ndtr

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n1, n2 = len(x), len(y)
    ranks, ties = average_ranks(np.concatenate([x, y]))
    u = float(ranks[:n1].sum() - n1 * (n1 + 1) / 2)
    if (n1 > 8 and n2 > 8) or (ties > 1).any():
        n = n1 + n2
        spread = sqrt(n1 * n2 / 12 * ((n + 1) - float((ties**3 - ties).sum()) / (n * (n - 1))))
        with np.errstate(divide="ignore", invalid="ignore"):
            z = (u - n1 * n2 / 2 - 0.5) / np.float64(spread)
        return float(np.clip(ndtr(-z), 0.0, 1.0))
    return min(1.0, _exact_u_at_least(int(round(u)), n1, n2))


def _exact_u_at_least(u: int, n1: int, n2: int) -> float:
    """P(U >= u) without ties: the count of orderings with each U is a coefficient of
    the Gaussian binomial [n1+n2 choose n1] in q, prod_i (1 - q^(n2+i)) / (1 - q^i),
    over C(n1+n2, n1) orderings (exact integers)."""
    m, big = min(n1, n2), max(n1, n2)
    counts = [1] + [0] * (m * big)
    for i in range(1, m + 1):
        for j in range(len(counts) - 1, big + i - 1, -1):  # times (1 - q^(big+i))
            counts[j] -= counts[j - big - i]
        for j in range(i, len(counts)):  # over (1 - q^i)
            counts[j] += counts[j - i]
    return sum(counts[max(u, 0) :]) / comb(n1 + n2, n1)


def spearman_greater(a, b) -> tuple[float, float]:
    """(rho, one-sided p for rho > 0) as scipy.stats.spearmanr(a, b,
    alternative="greater"): Pearson's r of the average ranks, its p from Student's t
    with n - 2 degrees of freedom. NaN for fewer than 2 values or a constant input."""
    from scipy.special import stdtr

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n = len(a)
    if n <= 1 or (a == a[0]).all() or (b == b[0]).all():
        return float("nan"), float("nan")
    rho = np.corrcoef(average_ranks(a)[0], average_ranks(b)[0])[0, 1]  # (a numpy float: 1/0 is inf)
    dof = n - 2
    with np.errstate(divide="ignore", invalid="ignore"):
        t = rho * np.sqrt(np.clip(dof / ((rho + 1.0) * (1.0 - rho)), 0, None))
    return float(rho), float(stdtr(dof, -t))
