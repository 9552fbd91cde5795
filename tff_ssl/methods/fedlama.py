"""FedLAMA (Lee et al., 2021, "Layer-wise adaptive model aggregation for scalable federated learning",
arXiv 2110.10302): the EUC row of L-DAWA's Table 2 ([19] there).

L-DAWA groups [19] with FedU as methods that "use Euclidean distance (between the client's model and the
global model) as an indicator to partially or entirely update the layers of the client models", with
FedAvg aggregation on the server, and gives no settings for it. FedLAMA aggregates each layer at its
own interval: layers on which the clients agree closely are aggregated less often; in between, each
client keeps training its own copy of them.

    every layer l has an interval tau_l in {tau', phi tau'} rounds (all tau' at first)
    round r: every client trains its whole model; the server aggregates (FedAvg, N_k-weighted) the
             layers with (r + 1) % tau_l == 0 and keeps the others' global value; for an aggregated
             layer it measures the discrepancy d_l = sum_k p_k ||u_l - x_{k,l}||^2 (p_k = N_k / N,
             u_l their mean) and keeps d_l / tau_l (per round since the layer's last aggregation)
    a client starts a round from the global value of a layer aggregated in or since its last round,
             and from its own copy of any other layer (a new client: the global model)
    every phi tau' rounds (when every layer is aggregated): sort the layers by discrepancy per
             parameter, ascending; walking up the list, add each layer to the relaxed set, with
             delta = its share of the total discrepancy and lambda = its share of the parameters,
             both cumulative, until 1 - lambda < delta (that layer included); the relaxed layers get
             tau_l = phi tau', the others tau'

Units. FedLAMA counts tau' in local iterations; here a round is the run's local training (E epochs),
so tau' = `interval` rounds (default 1: the other rows' schedule) and phi = `phi` (default 2). Layers
are Keras layers (a convolution's kernel, a GroupNorm's scale and offset, a dense layer's kernel and
bias together: `aggregators.ModelLayout`). The discrepancy is computed from the uploads in one pass:
with Delta_k = w_g - x_k, sum_k p_k ||x_k - u||^2 = sum_k p_k ||Delta_k||^2 - ||sum_k p_k Delta_k||^2.
FedLAMA assumes every client takes part in every round (cross-silo, as L-DAWA's Table 2); with client
sampling a layer is aggregated over the round's clients and a client takes the global value of every
layer aggregated since its last round. The simulation uploads every layer every round; the measurement
`fedlama_synced` is the fraction of the parameters FedLAMA would send. The public code adjusts the
intervals of convolution and dense kernels only and only after the first 6 adjustment periods; the
paper's per-layer rule is the default here.

FedLAMA is a server stage (`FedLAMAStage`) of the FedAvg process, so it composes with other stages:
`--fedfoa` adds FedFoA's feature-correlation bank and alignment (its clients' state wraps FedLAMA's).
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import tensorflow as tf

from tff_ssl import aggregators, privacy
from tff_ssl.aggregators import ClientInfo
from tff_ssl.federated import client_state as client_state_lib
from tff_ssl.federated import fedavg_process, masks
from tff_ssl.federated import server_step
from tff_ssl.federated.server_stage import ServerStage
from tff_ssl.methods import addons, fedavg
from tff_ssl.config_fields import Field
from tff_ssl.method import Method


@dataclasses.dataclass(frozen=True)
class FedLAMAConfig:
  """interval: tau', the base aggregation interval in rounds; phi: the interval increase factor
  (the relaxed layers' interval is phi tau'; the intervals are adjusted every phi tau' rounds)."""

  interval: int = 1
  phi: int = 2

  def __post_init__(self):
    INTERVAL.check(self.interval)
    PHI.check(self.phi)

  @property
  def period(self) -> int:
    """Rounds between interval adjustments."""
    return self.interval * self.phi


def relaxed_layers(discrepancy: np.ndarray, sizes: np.ndarray) -> np.ndarray:
  """FedLAMA's choice of the layers to aggregate less often (module docstring): a boolean per layer.

  discrepancy: each layer's d_l per round (summed over its parameters); sizes: its parameter count.
  """
  discrepancy = np.asarray(discrepancy, np.float64)
  sizes = np.asarray(sizes, np.float64)
  order = np.argsort(discrepancy / sizes, kind="stable")
  total_d, total_size = discrepancy.sum(), sizes.sum()
  relaxed = np.zeros(len(sizes), bool)
  acc_d = acc_size = 0.0
  for l in order:
    acc_d += discrepancy[l]
    acc_size += sizes[l]
    relaxed[l] = True
    delta = acc_d / total_d if total_d > 0 else 0.0
    if 1.0 - acc_size / total_size < delta:
      break
  return relaxed


KEY = "fedlama"  # The stage's entry in the method state and the broadcast context.


class LayerStaleness(client_state_lib.ClientState):
  """A FedLAMA client's own model between its rounds.

  The state (one client): `last_round`, the round it last took part in (-1: never), and `own`, its
  trained tensors after that round. The broadcast context (under KEY): `round` (this round) and
  `last_sync`, per tensor the last round whose aggregation covered it (-1: none yet).
  """

  def __init__(self, mask: masks.TensorMask):
    self.mask = mask

  def spec(self, model):
    return collections.OrderedDict(last_round=tf.TensorSpec([], tf.float32),
                                   own=list(self.mask.select(model.weight_specs)))

  def initial(self, model):
    out = super().initial(model)
    out["last_round"] = np.float32(-1.0)
    return out

  def context_spec(self, model):
    return collections.OrderedDict([(KEY, collections.OrderedDict(
        round=tf.TensorSpec([], tf.float32),
        last_sync=tf.TensorSpec([len(self.mask.indices)], tf.float32)))])

  def begin(self, state, weights, context=None):
    context = context[KEY]
    returning = tf.greater_equal(state["last_round"], 0.0)
    trained = self.mask.select(list(weights))
    # Keep the own copy of a tensor not aggregated in or since the client's last round.
    start = [tf.where(tf.logical_and(returning, context["last_sync"][t] < state["last_round"]),
                      own, glob)
             for t, (own, glob) in enumerate(zip(state["own"], trained))]
    return self.mask.merge(start, list(weights))

  def end(self, state, weights, delta, num_examples, loss, ssl_state=None, context=None):
    del state, num_examples, loss, ssl_state
    return collections.OrderedDict(last_round=tf.identity(context[KEY]["round"]),
                                   own=[w - d for w, d in zip(weights, delta)])


class DiscrepancyFactory(aggregators.FedAvgFactory):
  """FedAvg that also measures, per layer, sum_k p_k ||Delta_k^(l)||^2 (`layer_sq`, p_k = N_k / N),
  from which the server gets FedLAMA's discrepancy."""

  def __init__(self, group_index, num_groups: int):
    super().__init__()
    self._group_index = tuple(group_index)
    self._num_groups = num_groups

  @property
  def needs_client_updates(self) -> bool:
    return True

  def stats_spec(self, value_specs):
    spec = super().stats_spec(value_specs)
    spec.update(examples=tf.TensorSpec([], tf.float32),
                layer_sq=tf.TensorSpec([self._num_groups], tf.float32))
    return spec

  def client_terms(self, update, info: ClientInfo, round_num):
    scale, log_weight, stats = super().client_terms(update, info, round_num)
    n = tf.cast(info.num_examples, tf.float32)
    squares = tf.stack([tf.reduce_sum(tf.square(u)) for u in update])
    stats.update(examples=n, layer_sq=n * tf.math.unsorted_segment_sum(
        squares, tf.constant(self._group_index), self._num_groups))
    return scale, log_weight, stats

  def finish(self, stats):
    out = super().finish(stats)
    out["layer_sq"] = stats["layer_sq"] / stats["examples"]
    return out


class FedLAMAStage(ServerStage):
  """FedLAMA's server stage (`federated.server_stage`, module docstring): the per-layer intervals,
  their discrepancies and each tensor's last aggregation round as its part of the method state; the
  clients keep their own model (`LayerStaleness`); FedAvg with the discrepancy measure
  (`DiscrepancyFactory`); a layer not aggregated this round keeps its global value.

  Method state: `interval` (per layer, rounds), `discrepancy` (per layer, d_l per round at its last
  aggregation), `last_sync` (per exchanged tensor, the last round that aggregated it; -1: none).
  """

  key = KEY
  client_state_role = "provides"  # The clients' own model.
  changes_update = True  # The layers not aggregated keep their global value.
  chooses_aggregation = True  # FedAvg with the discrepancy measure.

  def __init__(self, model, lama: FedLAMAConfig):
    self.mask = masks.TensorMask.require_all(model, "FedLAMA")
    layout = aggregators.ModelLayout.from_model(model, "layer")
    self.lama = lama
    self.group_index = np.array(layout.group_index)
    self.layer_names = layout.names
    self.sizes = np.zeros(len(layout.names))
    for t, spec in enumerate(model.weight_specs):
      self.sizes[self.group_index[t]] += int(np.prod(spec.shape))

  def initial_state(self):
    return collections.OrderedDict(
        interval=np.full(len(self.sizes), self.lama.interval, np.int32),
        discrepancy=np.zeros(len(self.sizes), np.float32),
        last_sync=np.full(len(self.group_index), -1.0, np.float32))

  def synced(self, part, round_num: int) -> np.ndarray:
    """Per layer: whether round `round_num` aggregates it (`part`: the stage's method state)."""
    return (round_num + 1) % np.asarray(part["interval"]) == 0

  def context(self, part, round_num):
    return collections.OrderedDict(round=np.float32(round_num),
                                   last_sync=np.asarray(part["last_sync"], np.float32))

  def client_state(self, inner, model):
    del model
    if inner is not None:
      raise ValueError(f"FedLAMA's clients keep their own model between rounds; it cannot also keep "
                       f"{type(inner).__name__}'s state")
    return LayerStaleness(self.mask)

  def aggregation(self, factory):
    if factory is not None:
      raise ValueError(f"FedLAMA aggregates with FedAvg and measures each layer's discrepancy; it "
                       f"takes no aggregation strategy (got {type(factory).__name__})")
    return DiscrepancyFactory(self.group_index, len(self.layer_names))

  def before_optimizer(self, part, round_num, update, out):
    r, ms = round_num, part
    interval = np.asarray(ms["interval"])
    layers = self.synced(part, r)
    tensors = layers[self.group_index]
    kept = [np.asarray(u) if keep else np.zeros_like(u) for u, keep in zip(update, tensors)]
    mean_sq = np.asarray(out["measurements"]["layer_sq"], np.float64)
    agg_sq = np.zeros(len(self.sizes))
    np.add.at(agg_sq, self.group_index,
              [float(np.sum(np.square(np.asarray(u, np.float64)))) for u in update])
    d = np.maximum(mean_sq - agg_sq, 0.0) / interval
    discrepancy = np.where(layers, d, np.asarray(ms["discrepancy"])).astype(np.float32)
    last_sync = np.where(tensors, np.float32(r), np.asarray(ms["last_sync"])).astype(np.float32)
    if (r + 1) % self.lama.period == 0:  # Every layer was aggregated this round.
      relaxed = relaxed_layers(discrepancy, self.sizes)
      interval = np.where(relaxed, self.lama.interval * self.lama.phi,
                          self.lama.interval).astype(np.int32)
    new_part = collections.OrderedDict(interval=interval, discrepancy=discrepancy,
                                       last_sync=last_sync)
    measurements = collections.OrderedDict(
        fedlama_synced=np.float32(self.sizes[layers].sum() / self.sizes.sum()),
        fedlama_relaxed_layers=np.float32(np.sum(interval > self.lama.interval)))
    return kept, new_part, measurements

  def after_optimizer(self, part, round_num, old_weights, new_weights):
    # A layer not aggregated keeps its global value exactly, whatever the server optimizer.
    tensors = self.synced(part, round_num)[self.group_index]
    return [w if keep else np.asarray(old)
            for w, old, keep in zip(new_weights, old_weights, tensors)]


INTERVAL = Field("fedlama_interval", 1, "FedLAMA (L-DAWA's EUC): the base aggregation interval of "
                 "every layer, in rounds.", lower=1)
PHI = Field("fedlama_phi", 2, "FedLAMA: the relaxed layers' interval is phi times the base one; the "
            "intervals are re-chosen every phi base intervals.", lower=1,
            note="1: every layer at the base interval")
# FedAvg's fields but its aggregation strategy's (FedLAMA aggregates in its own way), and its own.
FIELDS = tuple(f for f in fedavg.FIELDS if f not in aggregators.FIELDS + privacy.FIELDS
               + addons.SERVER_FIELDS) + (INTERVAL, PHI)


def lama_config(config) -> FedLAMAConfig:
  return FedLAMAConfig(interval=config.fedlama_interval, phi=config.fedlama_phi)


def _validate(config):
  """FedAvg's typed configs and FedLAMA's."""
  return fedavg.process_config(config) + (lama_config(config),)


def build(config, model, image_shape, context=None) -> fedavg_process.FedAvgSSLProcess:
  """The FedAvg process with FedLAMA's stage (and FedFoA's after it, with `--fedfoa`)."""
  del context  # The server trains on nothing of its own; one aggregation a round.
  fedavg_config, _, simulation, addon_stages, lama = config.parsed
  mask = masks.TensorMask.require_all(model, "FedLAMA")
  stages = (FedLAMAStage(model, lama),) + addon_stages.of(model, mask)
  return fedavg_process.FedAvgSSLProcess(model, image_shape,
                                 server_step.server_optimizer_for(config, model.names), fedavg_config,
                                 simulation=simulation, mask=mask, stages=stages)


METHOD = Method(
    name="fedlama", kind="federated", fields=FIELDS, ssl=fedavg.METHOD.ssl, validate=_validate,
    build=build, divergence_hint=fedavg.divergence_hint,
    min_samples=fedavg.METHOD.min_samples,
    no_privacy=("it aggregates each layer at an interval chosen from the clients' un-noised "
                "per-layer divergences, and its clients keep the layers not aggregated"),
    summary="FedLAMA (L-DAWA's EUC): layer-wise adaptive aggregation intervals; clients keep the "
            "layers not aggregated.")
