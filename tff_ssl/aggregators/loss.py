"""Loss-based aggregation (the L-DAWA paper's "Loss" baseline, its ref. [10]): beta_k = softmax(-L_k).

    Delta = sum_k exp(-L_k) Delta_k / sum_k exp(-L_k)

L_k is the client's mean training loss over its local steps. Clients with lower loss count more; with
losses that differ by tens (CCO / Barlow Twins losses are in the hundreds) the softmax gives one
client nearly all the weight, which `max_weight` reports. Computed exactly as a softmax, in one
mergeable aggregation: running weighted means kept relative to their largest -L_k, rescaled to the
larger one when two are merged (`base.merge_softmax`), so nothing overflows or underflows to 0/0 and
the round runs across TFF workers too.
"""

from __future__ import annotations

from tff_ssl.aggregators.base import StrategyFactory


class LossFactory(StrategyFactory):
  """Mean of the client updates weighted by softmax(-L_k) of the clients' mean local losses."""

  weighting = "loss"
