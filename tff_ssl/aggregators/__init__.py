"""Aggregation strategies as `tff.aggregators` factories, and their registry by name.

  fedavg        FedAvg: beta_k = N_k / N                                    (fedavg.py)
  uniform       beta_k = 1 / K                                              (uniform.py)
  loss          beta_k = softmax(-L_k)                                      (loss.py)
  mdawa         M-DAWA: (1/K) delta_k w_k, one angle for the whole model    (mdawa.py)
  ldawa         L-DAWA: (1/K) delta_k^(l) w_k^(l), an angle per layer       (ldawa.py)
  ldawa_fedavg  L-DAWA_FedAvg: (N_k / N) delta_k^(l) w_k^(l)
  ldawa_loss    L-DAWA_Loss: softmax(-L_k) delta_k^(l) w_k^(l)

Every factory is a `StrategyFactory` (base.py): a per-client stage and a weighted mean, taking the
clients' `ClientInfo` as its weight, usable in both simulation modes of the FedAvg process.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from tff_ssl.aggregators.base import (FEDAVG_WARMUP_ROUNDS, GRANULARITIES, GRANULARITY,
                                      MEASURE_DIVERGENCE, SCALE_NORMALIZATION, WEIGHTINGS,
                                      ClientInfo, Contribution, ModelLayout, StrategyFactory,
                                      client_info_type)
from tff_ssl.aggregators.fedavg import FedAvgFactory
from tff_ssl.aggregators.ldawa import LDAWAFactory
from tff_ssl.aggregators.loss import LossFactory
from tff_ssl.aggregators.mdawa import MDAWAFactory
from tff_ssl.aggregators.uniform import UniformFactory
from tff_ssl.config_fields import Field


@dataclasses.dataclass(frozen=True)
class AggregatorConfig:
  """A strategy by name and its options; `build(model)` makes the factory for a model.

  granularity / scale_normalization: L-DAWA's layers ("layer": Keras layers, "tensor": each tensor)
    and whether normalization tensors are scaled too (the authors' code). Read by the L-DAWA family.
  fedavg_warmup_rounds: first rounds aggregated by plain FedAvg (the authors' code). DAWA family.
  measure_divergence: report the mean cosine between client and global models (the paper's Fig. 4)
    with a strategy that does not compute it anyway (the DAWA family always does).
  """

  name: str = "fedavg"
  granularity: str = "layer"
  scale_normalization: bool = False
  fedavg_warmup_rounds: int = 0
  measure_divergence: bool = False

  def __post_init__(self):
    AGGREGATOR.check(self.name)
    GRANULARITY.check(self.granularity)
    FEDAVG_WARMUP_ROUNDS.check(self.fedavg_warmup_rounds)

  def check_options(self) -> None:
    """Raises ValueError if an option is set that this strategy does not read."""
    options = {"granularity": (self.granularity != "layer", LAYERWISE),
               "scale_normalization": (self.scale_normalization, LAYERWISE),
               "fedavg_warmup_rounds": (self.fedavg_warmup_rounds != 0, DIVERGENCE_AWARE),
               "measure_divergence": (self.measure_divergence,
                                      tuple(a for a in AGGREGATORS if a not in DIVERGENCE_AWARE))}
    for name, (set_, readers) in options.items():
      if set_ and self.name not in readers:
        field = "aggregator_granularity" if name == "granularity" else name
        raise ValueError(f"{field} is not used by aggregator {self.name!r}; it is read by "
                         f"{list(readers)}")

  def build(self, model, mask=None) -> StrategyFactory:
    """The factory for a `FunctionalModel` (whose layers L-DAWA's angles follow), over the tensors a
    process exchanges (`mask`, a `federated.common.TensorMask`; default all)."""
    return AGGREGATORS[self.name](self, ModelLayout.from_model(model, self.granularity, mask))


def _ldawa(weighting: str) -> Callable[[AggregatorConfig, ModelLayout], StrategyFactory]:
  return lambda c, layout: LDAWAFactory(
      layout, weighting=weighting,
      scale_normalization=c.scale_normalization, fedavg_warmup_rounds=c.fedavg_warmup_rounds)


# name -> (config, layout of the exchanged tensors) -> factory.
AGGREGATORS: dict[str, Callable[[AggregatorConfig, ModelLayout], StrategyFactory]] = {
    "fedavg": lambda c, layout: FedAvgFactory(measure_divergence=c.measure_divergence),
    "uniform": lambda c, layout: UniformFactory(measure_divergence=c.measure_divergence),
    "loss": lambda c, layout: LossFactory(measure_divergence=c.measure_divergence),
    "mdawa": lambda c, layout: MDAWAFactory(len(layout.groups),
                                            fedavg_warmup_rounds=c.fedavg_warmup_rounds),
    "ldawa": _ldawa("uniform"),
    "ldawa_fedavg": _ldawa("examples"),
    "ldawa_loss": _ldawa("loss"),
}
# Options each strategy reads (any other non-default option is an error for it).
DIVERGENCE_AWARE = ("mdawa", "ldawa", "ldawa_fedavg", "ldawa_loss")
LAYERWISE = ("ldawa", "ldawa_fedavg", "ldawa_loss")

AGGREGATOR = Field("aggregator", "fedavg", "FedAvg-style: the aggregation strategy "
                   "(tff_ssl.aggregators).", choices=lambda: AGGREGATORS)
# The config fields of the strategies (read by the FedAvg-style methods).
FIELDS = (AGGREGATOR, GRANULARITY, SCALE_NORMALIZATION, FEDAVG_WARMUP_ROUNDS, MEASURE_DIVERGENCE)
