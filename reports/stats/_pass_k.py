"""pass^k: the chance that k independent trials of one sample all succeed."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def pass_hat_k(n: NDArray[np.float64], c: NDArray[np.float64]) -> dict[str, float]:
    """The mean over samples of the unbiased estimator of ``p^k``, for k from 1 to ``max(n)``.

    τ-bench's pass^k (Yao et al., "τ-bench", 2024, §3): per sample with ``n`` trials of which
    ``c`` succeeded, ``C(c, k) / C(n, k)`` estimates ``p^k`` without bias (drawing k of the
    n trials without replacement); the value for k is its mean over the samples with
    ``n ≥ k``.

    Args:
        n: Trials per sample (at least one sample, each ``n ≥ 1``).
        c: Successes per sample, whole numbers.

    Returns:
        ``{"1": ..., "2": ..., ...}``.
    """
    # C(c, k) / C(n, k) = Π_{j<k} (c - j) / (n - j): one running product per sample,
    # so every k costs one vector step (no big binomials).
    ratio = np.ones_like(n)
    values: dict[str, float] = {}
    for k in range(1, int(n.max()) + 1):
        ok = n >= k
        ratio = np.where(
            ok, ratio * np.clip(c - (k - 1), 0, None) / np.where(ok, n - (k - 1), 1), 0
        )
        values[str(k)] = float(ratio[ok].mean())
    return values
