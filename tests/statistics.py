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


def pooled_chi_square_pvalue(counts, probs, min_expected: float = 5.0) -> float:
  """Chi-square p-value after pooling cells whose expected count is below `min_expected`."""
  counts = np.asarray(counts, np.float64)
  probs = np.asarray(probs, np.float64)
  probs = probs / probs.sum()
  expected = probs * counts.sum()
  small = expected < min_expected
  if small.any():
    counts = np.append(counts[~small], counts[small].sum())
    probs = np.append(probs[~small], probs[small].sum())
  return chi_square_pvalue(counts, probs)
