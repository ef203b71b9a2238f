"""Goodness-of-fit helpers for the statistical sampling tests."""

import numpy as np
from scipy import stats


def chi_square_pvalue(counts, probs) -> float:
  """Pearson chi-square p-value of `counts` against `probs`; mass outside the support is 0."""
  counts = np.asarray(counts, np.float64)
  probs = np.asarray(probs, np.float64)
  probs = probs / probs.sum()
  if counts[probs <= 0].sum() > 0:
    return 0.0
  n = counts.sum()
  expected = probs[probs > 0] * n
  stat = ((counts[probs > 0] - expected) ** 2 / expected).sum()
  return float(stats.chi2.sf(stat, df=int((probs > 0).sum()) - 1))
