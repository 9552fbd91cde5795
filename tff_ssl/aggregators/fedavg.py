"""FedAvg (McMahan et al., 2017): clients weighted by their number of examples, beta_k = N_k / N.

    Delta = sum_k N_k Delta_k / sum_k N_k

The L-DAWA paper's baseline and the default of every FedAvg-style run here. Unlike a bare
`tff.aggregators.MeanFactory` it takes the `ClientInfo` weight, so it composes and measures like the
other strategies (and reports `max_weight`, the largest N_k / N).
"""

from __future__ import annotations

from tff_ssl.aggregators.base import StrategyFactory


class FedAvgFactory(StrategyFactory):
  """Sample-weighted mean of the client updates (FedAvg)."""

  weighting = "examples"
