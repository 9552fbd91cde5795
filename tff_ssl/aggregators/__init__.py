"""Aggregation strategies as `tff.aggregators` factories, and their registry by name.

  fedavg        FedAvg: beta_k = N_k / N                                    (fedavg.py)
  uniform       beta_k = 1 / K                                              (uniform.py)
  loss          beta_k = softmax(-L_k)                                      (loss.py)
  mdawa         M-DAWA: (1/K) delta_k w_k, one angle for the whole model    (mdawa.py)
  ldawa         L-DAWA: (1/K) delta_k^(l) w_k^(l), an angle per layer       (ldawa.py)
  ldawa_fedavg  L-DAWA_FedAvg: (N_k / N) delta_k^(l) w_k^(l)
  ldawa_loss    L-DAWA_Loss: softmax(-L_k) delta_k^(l) w_k^(l)

With --dp (`tff_ssl.privacy`) the aggregation is DP-FedAvg's clipped, noised, uniform mean
(private.py) in place of the strategy: fedavg (on clients of equal size, where N_k / N = 1 / K) and
uniform compose with it; the others weigh or scale a client by what would raise its sensitivity, and
are refused. --secure_aggregation / --compression replace the weighted mean's sums (TFF's
`tff.learning.secure_aggregator` / `compression_aggregator`) of any strategy that does not compute
its mean itself.

Every factory is a `StrategyFactory` (base.py): a per-client stage and a weighted mean, taking the
clients' `ClientInfo` as its weight, usable in both simulation modes of the FedAvg process.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import tensorflow_federated as tff

from tff_ssl.aggregators.base import (FEDAVG_WARMUP_ROUNDS, GRANULARITIES, GRANULARITY,
                                      MEASURE_DIVERGENCE, SCALE_NORMALIZATION, WEIGHTINGS,
                                      ClientInfo, Contribution, ModelLayout, StrategyFactory,
                                      client_info_type)
from tff_ssl.aggregators.fedavg import FedAvgFactory
from tff_ssl.aggregators.ldawa import LDAWAFactory
from tff_ssl.aggregators.loss import LossFactory
from tff_ssl.aggregators.mdawa import MDAWAFactory
from tff_ssl.aggregators.private import PrivateFactory
from tff_ssl.aggregators.uniform import UniformFactory
from tff_ssl.config_fields import Field
from tff_ssl.privacy import PrivacyConfig
from tff_ssl.federated import masks


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
  privacy: PrivacyConfig = PrivacyConfig()
  equal_clients: bool = True  # Every client holds as many images (the partition's fixed size).

  def __post_init__(self):
    AGGREGATOR.check(self.name)
    GRANULARITY.check(self.granularity)
    FEDAVG_WARMUP_ROUNDS.check(self.fedavg_warmup_rounds)

  def check_options(self) -> None:
    """Raises ValueError if an option is set that this strategy does not read."""
    options = {"granularity": (self.granularity != "layer", "layerwise"),
               "scale_normalization": (self.scale_normalization, "layerwise"),
               "fedavg_warmup_rounds": (self.fedavg_warmup_rounds != 0, "divergence_aware"),
               "measure_divergence": (self.measure_divergence, "measures_on_request")}
    for name, (set_, reads) in options.items():
      readers = [a for a, s in AGGREGATORS.items() if getattr(s, reads)]
      if set_ and self.name not in readers:
        field = "aggregator_granularity" if name == "granularity" else name
        raise ValueError(f"{field} is not used by aggregator {self.name!r}; it is read by "
                         f"{readers}")
    self.check_privacy()

  def check_privacy(self) -> None:
    """Raises ValueError (one line, saying why) where the strategy does not compose with the
    privacy settings."""
    p, strategy = self.privacy, AGGREGATORS[self.name]
    if p.enabled:
      if strategy.no_dp:
        raise ValueError(f"--dp refuses --aggregator={self.name}: {strategy.no_dp}; "
                         f"use --aggregator=uniform")
      if strategy.weighs_by_examples and not self.equal_clients:
        raise ValueError("--dp averages clipped updates uniformly (DP-FedAvg: a client's N_k "
                         "would scale its sensitivity), which is not FedAvg's N_k / N on clients "
                         "of unequal size; use --aggregator=uniform")
      if self.measure_divergence:
        raise ValueError("--dp refuses --measure_divergence: it releases each client's cosine to "
                         "the global model without noise; remove it")
    elif (p.secure_aggregation or p.compression != "none") and strategy.self_weighted:
      flag = "--secure_aggregation" if p.secure_aggregation else f"--compression={p.compression}"
      raise ValueError(f"{flag} refuses --aggregator={self.name}: its softmax(-L_k) mean is one "
                       f"running aggregation of its own, not a sum TFF's factories can replace")

  def inner(self):
    """The weighted mean's factory: TFF's secure or compressed mean, or None (the plain one)."""
    p = self.privacy
    if p.secure_aggregation:
      return tff.learning.secure_aggregator(zeroing=False, clipping=False, weighted=True)
    if p.compression != "none":
      return tff.aggregators.MeanFactory(value_sum_factory=p.record_sum_factory(0.0))
    return None

  def build(self, model, mask=None) -> StrategyFactory:
    """The factory for a `FunctionalModel` (whose layers L-DAWA's angles follow), over the tensors a
    process exchanges (`mask`, a `federated.masks.TensorMask`; default all)."""
    if self.privacy.enabled:
      self.check_privacy()
      factory = PrivateFactory(self.privacy, self.privacy.sigma)
    else:
      factory = AGGREGATORS[self.name].build(
          self, ModelLayout.from_model(model, self.granularity, mask))
    factory.wire = self.privacy  # What the process's other uploads must respect (reports).
    return factory


def _ldawa(weighting: str) -> Callable[[AggregatorConfig, ModelLayout], StrategyFactory]:
  return lambda c, layout: LDAWAFactory(
      layout, weighting=weighting,
      scale_normalization=c.scale_normalization, fedavg_warmup_rounds=c.fedavg_warmup_rounds,
      inner=c.inner())


@dataclasses.dataclass(frozen=True)
class Strategy:
  """A strategy's registry entry: its factory from (config, layout of the exchanged tensors), and
  what it reads and refuses.

  divergence_aware: scales each client by its cosine to the global model (measured always; reads
    --fedavg_warmup_rounds); the others measure it on request (--measure_divergence).
  layerwise: an angle per layer (reads --aggregator_granularity and --scale_normalization).
  no_dp: why --dp refuses it ("": DP-FedAvg's clipped uniform mean replaces it).
  weighs_by_examples: its weights are N_k / N (under --dp only where clients are of equal size).
  self_weighted: computes its weighted mean itself (secure and compressed sums cannot replace it).
  """

  build: Callable[[AggregatorConfig, ModelLayout], StrategyFactory]
  divergence_aware: bool = False
  layerwise: bool = False
  no_dp: str = ""
  weighs_by_examples: bool = False
  self_weighted: bool = False

  @property
  def measures_on_request(self) -> bool:
    return not self.divergence_aware


_DAWA = ("it scales each client's layers by their cosine to the global model, a per-client factor "
         "the clip does not bound")
_SOFTMAX = "it weighs clients by softmax(-L_k)"

AGGREGATORS: dict[str, Strategy] = {
    "fedavg": Strategy(lambda c, layout: FedAvgFactory(measure_divergence=c.measure_divergence,
                                                       inner=c.inner()),
                       weighs_by_examples=True),
    "uniform": Strategy(lambda c, layout: UniformFactory(measure_divergence=c.measure_divergence,
                                                         inner=c.inner())),
    "loss": Strategy(lambda c, layout: LossFactory(measure_divergence=c.measure_divergence),
                     no_dp=f"{_SOFTMAX}, so one client's loss moves every other's weight",
                     self_weighted=True),
    "mdawa": Strategy(lambda c, layout: MDAWAFactory(len(layout.groups),
                                                     fedavg_warmup_rounds=c.fedavg_warmup_rounds,
                                                     inner=c.inner()),
                      divergence_aware=True, no_dp=_DAWA),
    "ldawa": Strategy(_ldawa("uniform"), divergence_aware=True, layerwise=True, no_dp=_DAWA),
    "ldawa_fedavg": Strategy(_ldawa("examples"), divergence_aware=True, layerwise=True,
                             no_dp=_DAWA),
    "ldawa_loss": Strategy(_ldawa("loss"), divergence_aware=True, layerwise=True,
                           no_dp=f"{_SOFTMAX} and {_DAWA[3:]}", self_weighted=True),
}

AGGREGATOR = Field("aggregator", "fedavg", "FedAvg-style: the aggregation strategy "
                   "(tff_ssl.aggregators).", choices=lambda: AGGREGATORS)
# The config fields of the strategies (read by the FedAvg-style methods).
FIELDS = (AGGREGATOR, GRANULARITY, SCALE_NORMALIZATION, FEDAVG_WARMUP_ROUNDS, MEASURE_DIVERGENCE)
