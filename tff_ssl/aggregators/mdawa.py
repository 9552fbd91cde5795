"""M-DAWA: model-level divergence-aware weight aggregation (Rehman et al., 2023, eq. 3).

    w_g^{r+1} = (1 / K) sum_k delta_k w_k,   delta_k = cos(w_g^r, w_k) over the whole flattened model

L-DAWA with a single group holding every tensor (normalization tensors included: the paper's M-DAWA
angle is that of the whole model). The paper measured it 78x slower than FedAvg (22.65 s vs 0.29 s,
Table 1), from flattening the model; here the cosine comes from per-tensor partial sums, so it costs
what L-DAWA costs (`bin/benchmark --aggregation`).
"""

from __future__ import annotations

import tensorflow_federated as tff

from tff_ssl.aggregators.base import ModelLayout
from tff_ssl.aggregators.ldawa import LDAWAFactory


class MDAWAFactory(LDAWAFactory):
  """Divergence-aware aggregation with one angle for the whole model of `num_tensors` tensors."""

  def __init__(self, num_tensors: int, *, weighting: str = "uniform",
               fedavg_warmup_rounds: int = 0,
               inner: tff.aggregators.WeightedAggregationFactory | None = None):
    super().__init__(ModelLayout(("model",) * num_tensors, (False,) * num_tensors),
                     weighting=weighting, fedavg_warmup_rounds=fedavg_warmup_rounds, inner=inner)
