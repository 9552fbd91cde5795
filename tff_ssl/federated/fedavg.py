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
from tff_ssl.data.augment import AugmentConfig
from tff_ssl.federated import common
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


class FedAvgSSLProcess(common.ServerLoop):
  """FedAvg rounds with a within-client SSL loss; same interface as `DCCOProcess`.

    run_round: (<w@SERVER, aggregator_state@SERVER, seed@SERVER, data@CLIENTS>
                -> <aggregator_state@SERVER, update@SERVER, loss@SERVER>)
  """

  def __init__(self, model: FunctionalModel, image_shape: Sequence[int],
               server_optimizer: tff.learning.optimizers.Optimizer,
               config: FedAvgSSLConfig = FedAvgSSLConfig(),
               aggregation_factory: tff.aggregators.WeightedAggregationFactory | None = None):
    self.config = config
    w_type = common.weights_type(model)
    data_type = common.client_input_type(image_shape)
    factory = aggregation_factory if aggregation_factory is not None else tff.aggregators.MeanFactory()
    if not isinstance(factory, tff.aggregators.WeightedAggregationFactory):
      raise TypeError(f"aggregation_factory must be a tff.aggregators.WeightedAggregationFactory "
                      f"(updates are weighted by N_k); got {type(factory).__name__}")
    aggregator = factory.create(w_type, tff.TensorType(np.float32))
    agg_state_type = aggregator.initialize.type_signature.result
    cfg = config
    loss_fn = config.loss_fn()

    @tff.tensorflow.computation(w_type, common.SEED_TYPE, data_type)
    def client_update(weights, seed, data):
      initial = list(weights)
      current = list(weights)
      local_opt = common.client_optimizer(cfg.client_optimizer, cfg.client_learning_rate)
      opt_state = local_opt.initialize(tuple(tf.TensorSpec(w.shape, w.dtype) for w in current))
      first_loss = None
      for step in range(cfg.local_steps):
        step_seed = seed if step == 0 else tf.random.experimental.stateless_fold_in(seed, step)
        v1, v2 = common.views(data, step_seed, cfg.augment)
        with tf.GradientTape() as tape:
          tape.watch(current)
          f, g = common.encode_views(model, current, v1, v2)
          loss = loss_fn(f, g)
        grads = tape.gradient(loss, current)
        opt_state, current = local_opt.next(opt_state, tuple(current), tuple(grads))
        current = list(current)
        first_loss = loss if first_loss is None else first_loss
      return ([a - b for a, b in zip(initial, current)], common.num_examples(data), first_loss)

    @tff.federated_computation(tff.FederatedType(w_type, tff.SERVER), agg_state_type,
                               tff.FederatedType(common.SEED_TYPE, tff.SERVER),
                               tff.FederatedType(data_type, tff.CLIENTS))
    def run_round(weights, aggregator_state, seed, data):
      out = tff.federated_map(client_update, (tff.federated_broadcast(weights),
                                              tff.federated_broadcast(seed), data))
      aggregated = aggregator.next(aggregator_state, out[0], out[1])
      return collections.OrderedDict(aggregator_state=aggregated.state, update=aggregated.result,
                                     loss=tff.federated_mean(out[2], weight=out[1]))

    self.client_update = client_update
    self.run_round = run_round
    self.aggregator = aggregator
    super().__init__(model, server_optimizer, aggregator)

  def next(self, state: common.ServerState, clients: list[dict]):
    if not clients:
      raise ValueError("a FedAvg round needs at least one client")
    small = [len(c["ids"]) for c in clients if len(c["ids"]) < 2]
    if small:
      raise ValueError(f"a within-client {self.config.loss} loss needs >= 2 images per client; got "
                       f"a client with {small[0]}. Use DCCO for one-image clients")
    seed = common.round_seed(self.config.seed, state.round_num)
    out = self.run_round(state.weights, state.aggregator_state, seed, clients)
    return self.finish_round(state, out["update"], out["loss"], len(clients),
                             out["aggregator_state"])
