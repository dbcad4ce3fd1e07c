"""The detectors' one-sided tests (diagnose/analysis/detectors/significance.py) give
scipy.stats' p-values: the module exists so that an analysis does not import
scipy.stats (0.6-0.7 s of CPU per process), not to change a single verdict."""

import numpy as np
import pytest
from scipy import stats

from diagnose.analysis.detectors.significance import binomial_greater, mann_whitney_greater, spearman_greater

CASES = 400


def _samples(rng, n):
    values = rng.normal(rng.normal(), 1.0, n)
    return np.round(values, 1) if rng.random() < 0.3 else values  # a third tied


def test_binomial_is_scipys():
    rng = np.random.default_rng(1)
    for _ in range(CASES):
        n, p = int(rng.integers(1, 300)), float(rng.uniform(0.01, 0.99))
        k = int(rng.integers(0, n + 1))
        want = stats.binomtest(k, n, p, alternative="greater").pvalue
        assert binomial_greater(k, n, p) == pytest.approx(want, abs=1e-12), (k, n, p)


def test_mann_whitney_is_scipys_exact_and_asymptotic_with_ties():
    rng = np.random.default_rng(2)
    methods = set()
    for _ in range(CASES):
        n1, n2 = int(rng.integers(1, 15)), int(rng.integers(1, 60))
        x, y = _samples(rng, n1), rng.normal(0.0, 1.0, n2)
        if rng.random() < 0.5:
            x, y = y, x
        got, want = mann_whitney_greater(x, y), stats.mannwhitneyu(x, y, alternative="greater").pvalue
        assert got == pytest.approx(want, abs=1e-12), (x, y)
        tied = len(np.unique(np.concatenate([x, y]))) < len(x) + len(y)
        methods.add("asymptotic" if (len(x) > 8 and len(y) > 8) or tied else "exact")
    assert methods == {"exact", "asymptotic"}


def test_spearman_is_scipys():
    rng = np.random.default_rng(3)
    for _ in range(CASES):
        n = int(rng.integers(3, 200))
        a = _samples(rng, n)
        b = a * rng.uniform(-1, 1) + _samples(rng, n)
        if (a == a[0]).all() or (b == b[0]).all():
            continue
        want = stats.spearmanr(a, b, alternative="greater")
        rho, p = spearman_greater(a, b)
        assert (rho, p) == pytest.approx((want.statistic, want.pvalue), abs=1e-12)
    assert spearman_greater([1, 2, 3, 4], [2, 3, 5, 9]) == (1.0, 0.0)


def test_an_analysis_does_not_import_scipy_stats(tmp_path):
    import shutil
    import subprocess
    import sys

    from tests.support.jobs import REPO, fixture_path

    shutil.copytree(fixture_path("runs", "straggler"), tmp_path / "run")
    probe = (
        "import sys; from diagnose.cli.after_run import analyze_run; "
        f"analyze_run([{str(tmp_path / 'run')!r}], outputs=False, warn=print); "
        "print('scipy.stats' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split()[-1] == "False", out.stdout + out.stderr
