"""FedAvg with a within-client SSL loss (the FedAvg-CCO and FedAvg-SimCLR baselines of DCCO, Table 1).

    SERVER  w, seed_r, aggregator state                      CLIENTS k = 1..K  (N_k >= 2 images each)
    ─────────────────────────────────────────────────────────────────────────────────────────────
      w, seed_r ──federated_broadcast──►  for s in 1..S: views of x_k keyed by (seed_r, s, ids_k)
                                                          L = loss(F, G) within the client's batch
                                                          w_k ← w_k − η ∇L
                                          Δ_k = w − w_k,  weight N_k
      Δ = aggregator(Δ_k, N_k)  ◄─────────  (default tff.aggregators.MeanFactory: N_k-weighted mean)
    server: w ← server_optimizer(w, gradient=Δ)

The update aggregation is any weighted `tff.aggregators` factory, so the strategy papers' aggregators
plug in here. One federated computation per round (`run_round`); the server optimizer step runs on the
server in Python. We do not use `tff.learning.templates.compose_learning_process`: its client work
consumes `tf.data` batches of (x, y) through a `tff.learning` model with a supervised loss, while the
SSL client update here takes the client's images as one tensor, makes two views and needs no labels.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import losses
from tff_ssl.losses import per_client
from tff_ssl.data.augment import AugmentConfig
from tff_ssl.federated import common, grouping
from tff_ssl.federated.functional import FunctionalModel


@dataclasses.dataclass(frozen=True)
class FedAvgSSLConfig:
  loss: str = "cco"  # "cco" or "nt_xent"
  cco_lambda: float = losses.cco.DEFAULT_LAMBDA
  temperature: float = losses.ntxent.DEFAULT_TEMPERATURE
  client_optimizer: str = "sgd"
  client_learning_rate: float = 1.0
  local_steps: int = 1
  augment: AugmentConfig = AugmentConfig.dcco_cifar()
  seed: int = 0

  def __post_init__(self):
    if self.loss not in losses.LOSSES:
      raise ValueError(f"unknown loss {self.loss!r}; choose one of {sorted(losses.LOSSES)}")
    common.check_client_training(self.local_steps, self.client_optimizer,
                                 self.client_learning_rate)

  def loss_fn(self):
    kwargs = {"lambd": self.cco_lambda} if self.loss == "cco" else {"temperature": self.temperature}
    return losses.get_loss(self.loss, **kwargs)


def _local_training(model: FunctionalModel, cfg: FedAvgSSLConfig, loss_fn, weights, seed, data):
  """A client's local steps on its own images (new views at each step): (Delta_k, first-step loss)."""

  def loss_of(current, step):
    step_seed = seed if step == 0 else tf.random.experimental.stateless_fold_in(seed, step)
    v1, v2 = common.views(data, step_seed, cfg.augment)
    return loss_fn(*common.encode_views(model, current, v1, v2))

  return common.local_training(weights, cfg.local_steps, cfg.client_optimizer,
                               cfg.client_learning_rate, loss_of)


class FedAvgSSLProcess(common.ServerLoop):
  """FedAvg rounds with a within-client SSL loss; same interface as `DCCOProcess`.

    run_round: (<w@SERVER, aggregator_state@SERVER, seed@SERVER, data@CLIENTS>
                -> <aggregator_state@SERVER, update@SERVER, loss@SERVER>)

  `data` is one client (reference mode) or one group of clients (grouped mode, the default; see
  `grouping`). Each real client's result enters the aggregation as `client_weighting(Delta_k, N_k, L_k,
  w)` -> (v_k, w_k) (default: (Delta_k, N_k)); a slot hands `aggregation_factory` the weighted mean of
  its clients' v_k with weight sum w_k, so a weighted-mean factory gives the same result in both modes.
  """

  def __init__(self, model: FunctionalModel, image_shape: Sequence[int],
               server_optimizer: tff.learning.optimizers.Optimizer,
               config: FedAvgSSLConfig = FedAvgSSLConfig(),
               aggregation_factory: tff.aggregators.WeightedAggregationFactory | None = None,
               simulation: grouping.Simulation = grouping.Simulation(),
               client_weighting: grouping.ClientWeighting | None = None):
    self.config = config
    self.simulation = simulation
    w_type = common.weights_type(model)
    data_type = (grouping.group_input_type(image_shape) if simulation.grouped
                 else common.client_input_type(image_shape))
    factory = aggregation_factory if aggregation_factory is not None else tff.aggregators.MeanFactory()
    if not isinstance(factory, tff.aggregators.WeightedAggregationFactory):
      raise TypeError(f"aggregation_factory must be a tff.aggregators.WeightedAggregationFactory "
                      f"(updates are weighted by N_k); got {type(factory).__name__}")
    aggregator = factory.create(w_type, tff.TensorType(np.float32))
    agg_state_type = aggregator.initialize.type_signature.result
    cfg = config
    loss_fn = config.loss_fn()
    weighting = client_weighting if client_weighting is not None else grouping.ClientWeighting()
    batched = (simulation.grouped and simulation.batch_one_step and cfg.local_steps == 1 and
               weighting.example_weighted and cfg.loss in per_client.PER_CLIENT_LOSSES)
    per_client_loss = (per_client.PER_CLIENT_LOSSES[cfg.loss](
        **({"lambd": cfg.cco_lambda} if cfg.loss == "cco" else {"temperature": cfg.temperature}))
                       if batched else None)

    def batched_group_update(weights, seed, data):
      # sum_k N_k Delta_k = eta grad(sum_k N_k L_k) for one (first) step of the client optimizer.
      n = tf.cast(data.sizes, tf.float32)
      v1, v2 = common.views(data, seed, cfg.augment)

      def mean_loss(current, step):
        del step  # One step.
        f, g = common.encode_views(model, current, v1, v2)
        return tf.reduce_sum(n * per_client_loss(f, g, data.sizes)) / tf.reduce_sum(n)

      delta, loss = common.local_training(weights, 1, cfg.client_optimizer,
                                          cfg.client_learning_rate, mean_loss)
      return delta, tf.reduce_sum(n), loss

    def looped_group_update(weights, seed, data):
      def one_client(images, ids, acc):
        client = {"images": images, "ids": ids}
        delta, loss = _local_training(model, cfg, loss_fn, weights, seed, client)
        n = common.num_examples(client)
        value, weight = weighting(delta, n, loss, list(weights))
        return ([s + weight * v for s, v in zip(acc[0], value)], acc[1] + weight,
                acc[2] + n * loss, acc[3] + n)

      zero = tf.constant(0.0)
      sums = grouping.fold_clients(data, one_client,
                                   ([tf.zeros_like(w) for w in weights], zero, zero, zero))
      return [s / sums[1] for s in sums[0]], sums[1], sums[2] / sums[3], sums[3]

    @tff.tensorflow.computation(w_type, common.SEED_TYPE, data_type)
    def client_update(weights, seed, data):
      if not simulation.grouped:
        delta, loss = _local_training(model, cfg, loss_fn, weights, seed, data)
        n = common.num_examples(data)
        value, weight = weighting(delta, n, loss, list(weights))
        return value, weight, loss, n
      if batched:
        value, n, loss = batched_group_update(weights, seed, data)
        return value, n, loss, n
      return looped_group_update(weights, seed, data)

    @tff.federated_computation(tff.FederatedType(w_type, tff.SERVER), agg_state_type,
                               tff.FederatedType(common.SEED_TYPE, tff.SERVER),
                               tff.FederatedType(data_type, tff.CLIENTS))
    def run_round(weights, aggregator_state, seed, data):
      out = tff.federated_map(client_update, (tff.federated_broadcast(weights),
                                              tff.federated_broadcast(seed), data))
      aggregated = aggregator.next(aggregator_state, out[0], out[1])
      return collections.OrderedDict(aggregator_state=aggregated.state, update=aggregated.result,
                                     loss=tff.federated_mean(out[2], weight=out[3]))

    self.client_update = client_update
    self.run_round = run_round
    self.aggregator = aggregator
    super().__init__(model, server_optimizer, aggregator)

  def compute_update(self, state: common.ServerState, clients: list[dict]) -> dict:
    """The round's aggregated update, mean client loss and new aggregator state, before the server
    optimizer step."""
    if not clients:
      raise ValueError("a FedAvg round needs at least one client")
    small = [len(c["ids"]) for c in clients if len(c["ids"]) < 2]
    if small:
      raise ValueError(f"a within-client {self.config.loss} loss needs >= 2 images per client; got "
                       f"a client with {small[0]}. Use DCCO for one-image clients")
    seed = common.round_seed(self.config.seed, state.round_num)
    data = (grouping.pack(clients, self.simulation.group_size) if self.simulation.grouped
            else clients)
    return dict(self.run_round(state.weights, state.aggregator_state, seed, data))

  def next(self, state: common.ServerState, clients: list[dict]):
    out = self.compute_update(state, clients)
    return self.finish_round(state, out["update"], out["loss"], len(clients),
                             out["aggregator_state"])
