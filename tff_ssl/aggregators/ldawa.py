"""L-DAWA: layer-wise divergence-aware weight aggregation (Rehman et al., 2023, eq. 4-6, Alg. 1).

    w_g^{r+1}(l) = sum_k beta_k delta_k^(l) w_k^(l),   delta_k^(l) = cos(w_g^r(l), w_k^(l))   (eq. 2)

    L-DAWA          beta_k = 1 / K                                                         (eq. 4)
    L-DAWA_FedAvg   beta_k = N_k / N                                                       (eq. 5)
    L-DAWA_Loss     beta_k = softmax(-L_k)                                                 (eq. 6)

In update form (what the FedAvg process aggregates; server SGD at learning rate 1 gives eq. 4-6
exactly): client k contributes v_k(l) = w_g(l) - delta_k^(l) w_k(l) = (1 - delta) w_g + delta Delta_k
with weight beta_k, so that w_g - sum_k beta_k v_k = sum_k beta_k delta_k^(l) w_k(l). Since the
deltas are at most 1, the new global layer is shrunk toward 0 as much as the clients diverge.

A "layer" is a Keras layer (its kernel and bias together) by default (`ModelLayout.from_model`), or
each tensor (`granularity="tensor"`). Paper behaviour is the default; the authors' public code
differs, and its behaviours are options (`../shared/notes/methods.md`):
  * `scale_normalization=True`: normalization tensors are scaled by their own delta too (the code
    scales every tensor of >= 1 dimension, BatchNorm statistics included). The paper's delta is an
    angle between layers' weights; by default GroupNorm's scale and offset take the plain weighted
    mean (delta = 1). With GroupNorm there are no running statistics to scale.
  * `fedavg_warmup_rounds=R`: the first R rounds are plain FedAvg (N_k-weighted, no deltas); the code
    does so until the server holds a third saved global model.
The cosine is capped at 1 and not floored at 0, in the paper and the code alike; a zero-norm layer
has delta = 1 (`divergence.py`).

Measurements: `layer_delta` (per layer, the mean of delta_k^(l) over the round's clients),
`model_delta` (the mean of the whole-model cosine, the paper's Fig. 4), `fedavg_warmup` (1 in
warm-up rounds), and the base class's `clients` and `max_weight`.
"""

from __future__ import annotations

import collections
from typing import Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl.aggregators import divergence
from tff_ssl.aggregators.base import (FEDAVG_WARMUP_ROUNDS, ClientInfo, ModelLayout, StrategyFactory, base_log_weight,
                                      check_weighting)


class LDAWAFactory(StrategyFactory):
  """Layer-wise divergence-aware aggregation over the groups of `layout` (see the module docstring).

  Args:
    layout: which layer each weight tensor belongs to (`ModelLayout.from_model(model)`), and which
      tensors are normalization parameters.
    weighting: "uniform" (L-DAWA), "examples" (L-DAWA_FedAvg) or "loss" (L-DAWA_Loss).
    scale_normalization: scale normalization tensors by their delta too (the authors' code).
    fedavg_warmup_rounds: plain FedAvg for this many first rounds (the authors' code: 2).
    inner: the weighted-mean factory (default `tff.aggregators.MeanFactory()`).
  """

  transforms_update = True

  def __init__(self, layout: ModelLayout, *, weighting: str = "uniform",
               scale_normalization: bool = False, fedavg_warmup_rounds: int = 0,
               inner: tff.aggregators.WeightedAggregationFactory | None = None):
    super().__init__(inner=inner)
    check_weighting(weighting)
    FEDAVG_WARMUP_ROUNDS.check(fedavg_warmup_rounds)
    self.layout = layout
    self.weighting = weighting
    self.scale_normalization = scale_normalization
    self.fedavg_warmup_rounds = fedavg_warmup_rounds

  def _check(self, update) -> None:
    if len(update) != len(self.layout.groups):
      raise ValueError(f"the layout describes {len(self.layout.groups)} tensors but the model has "
                       f"{len(update)}; build it from the same model")

  def stats_spec(self, value_specs) -> collections.OrderedDict:
    spec = collections.OrderedDict(clients=tf.TensorSpec([], tf.float32))
    spec["model_delta"] = tf.TensorSpec([], tf.float32)
    spec["layer_delta"] = tf.TensorSpec([len(self.layout.names)], tf.float32)
    spec["fedavg_warmup"] = tf.TensorSpec([], tf.float32)
    return spec

  def client_terms(self, update: Sequence[tf.Tensor], info: ClientInfo, round_num):
    update, model = list(update), list(info.model)
    self._check(update)
    sums = divergence.partial_sums(update, model)
    deltas = divergence.group_cosines(sums, self.layout.group_index, len(self.layout.names))
    scaled = [not norm or self.scale_normalization for norm in self.layout.normalization]
    warmup = tf.cast(round_num, tf.int32) < self.fedavg_warmup_rounds
    scale = [tf.where(warmup, 1.0, deltas[i]) if s else tf.constant(1.0)
             for i, s in zip(self.layout.group_index, scaled)]
    log_weight = tf.where(warmup, base_log_weight("examples", info.num_examples, info.loss),
                          base_log_weight(self.weighting, info.num_examples, info.loss))
    stats = collections.OrderedDict(
        clients=tf.constant(1.0), model_delta=divergence.model_cosine(sums), layer_delta=deltas,
        fedavg_warmup=tf.cast(warmup, tf.float32))
    return scale, log_weight, stats

  def finish(self, stats) -> collections.OrderedDict:
    clients = stats["clients"]
    layer = stats["layer_delta"] / clients
    return collections.OrderedDict(
        clients=clients, model_delta=stats["model_delta"] / clients,
        layer_delta=collections.OrderedDict(
            (name, layer[i]) for i, name in enumerate(self.layout.names)),
        fedavg_warmup=stats["fedavg_warmup"] / clients)
