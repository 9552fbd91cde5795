"""Uniform averaging: every client counts alike, beta_k = 1 / K, whatever its number of examples.

    Delta = (1 / K) sum_k Delta_k
"""

from __future__ import annotations

from tff_ssl.aggregators.base import StrategyFactory


class UniformFactory(StrategyFactory):
  """Unweighted mean of the client updates."""

  weighting = "uniform"
