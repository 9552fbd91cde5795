"""FedAvg-style federated SSL: any client SSL method (`tff_ssl.ssl`) with any aggregation strategy
(`tff_ssl.aggregators`).

    SERVER  w, seed_r, aggregator state                      CLIENTS k = 1..K
    ─────────────────────────────────────────────────────────────────────────────────────────────
      w, seed_r ──federated_broadcast──►  local training from w: E epochs over x_k in batches of B
                                          (full batch: one step per epoch); new views each step,
                                          keyed by (seed_r, step, ids_k); loss = the SSL method's
                                          (BYOL: target = EMA of the online weights over the steps)
                                          Delta_k = w - w_k,  info_k = <N_k, mean loss L_k, w>
      Delta, measurements = aggregator(Delta_k, info_k)  ◄──  (default FedAvg: N_k-weighted mean)
    server: w ← server_optimizer(w, gradient=Delta)

The DCCO paper's FedAvg baselines (CCO / contrastive with within-client losses, one full-batch local
step) and the L-DAWA paper's cross-silo runs (SimCLR / Barlow Twins, E = 10 epochs of batch 256, SGD
with momentum and weight decay, strategies FedAvg / Loss / L-DAWA...) are both this process. One
federated computation per round (`run_round`); the server optimizer step runs on the server in
Python. We do not use `tff.learning.templates.compose_learning_process`: its client work consumes
`tf.data` batches of (x, y) through a `tff.learning` model with a supervised loss, while an SSL client
takes its images as one tensor, makes two views and needs no labels.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import aggregators, losses
from tff_ssl import ssl as ssl_lib
from tff_ssl.aggregators import ClientInfo
from tff_ssl.data.augment import AugmentConfig
from tff_ssl.federated import common, grouping
from tff_ssl.federated.functional import FunctionalModel

DEFAULT_TARGET_DECAY = 0.99  # BYOL's target EMA within local training (FedEMA's setting).


@dataclasses.dataclass(frozen=True)
class FedAvgSSLConfig:
  """The clients' side of a FedAvg-style round.

  local_steps: local epochs; with local_batch_size = 0 (the whole client as one batch) an epoch is
    one step. With local_batch_size = B > 0 an epoch is floor(N_k / B) steps over a fresh shuffle
    (a last partial batch is dropped, as SSL training loaders do, unless it is the client's only one).
  client_weight_decay: coupled L2 weight decay on the client's gradients (the L-DAWA paper: 1e-4).
  """

  ssl: str = "barlow_twins"
  cco_lambda: float = losses.cco.DEFAULT_LAMBDA
  temperature: float = losses.ntxent.DEFAULT_TEMPERATURE
  target_decay: float = DEFAULT_TARGET_DECAY
  client_optimizer: str = "sgd"
  client_learning_rate: float = 1.0
  client_weight_decay: float = 0.0
  local_steps: int = 1
  local_batch_size: int = 0
  augment: AugmentConfig = AugmentConfig.dcco_cifar()
  seed: int = 0

  def __post_init__(self):
    ssl_lib.get(self.ssl)
    common.check_client_training(self.local_steps, self.client_optimizer,
                                 self.client_learning_rate)
    if self.local_batch_size < 0 or self.local_batch_size == 1:
      raise ValueError(f"local_batch_size must be 0 (full batch) or >= 2; got "
                       f"{self.local_batch_size}")
    if self.client_weight_decay < 0:
      raise ValueError(f"client_weight_decay must be >= 0; got {self.client_weight_decay}")
    if not 0 <= self.target_decay < 1:
      raise ValueError(f"target_decay must be in [0, 1); got {self.target_decay}")

  @property
  def method(self) -> ssl_lib.SSLMethod:
    return ssl_lib.get(self.ssl)


def _outputs(model: FunctionalModel, method: ssl_lib.SSLMethod, weights, target, v1, v2
             ) -> ssl_lib.Outputs:
  """The SSL method's view outputs; `target` None: the online projections stand in (first step)."""
  outs = common.encode_outputs(model, weights, v1, v2)
  (z1, z2), (p1, p2) = outs[0], (outs[1] if method.predictor else (None, None))
  t1 = t2 = None
  if method.ema_target:
    t1, t2 = (z1, z2) if target is None else common.encode_outputs(model, target, v1, v2)[0]
  return ssl_lib.Outputs(z1, z2, p1, p2, t1, t2)


def _ema(target, current, decay: float):
  return [decay * t + (1.0 - decay) * c for t, c in zip(target, current)]


def _full_batch_training(model, cfg: FedAvgSSLConfig, weights, seed, data):
  """E full-batch steps on the client's images (new views at each step)."""
  method = cfg.method
  target = [None]  # BYOL: None while the target equals the broadcast (= online) weights.

  def loss_of(current, step):
    step_seed = seed if step == 0 else tf.random.experimental.stateless_fold_in(seed, step)
    v1, v2 = common.views(data, step_seed, cfg.augment)
    return method.loss(_outputs(model, method, current, target[0], v1, v2), cfg)

  def after_step(current):
    if method.ema_target:
      target[0] = _ema(list(weights) if target[0] is None else target[0], current,
                       cfg.target_decay)

  return common.local_training(weights, cfg.local_steps, cfg.client_optimizer,
                               cfg.client_learning_rate, loss_of, after_step,
                               cfg.client_weight_decay)


def _minibatch_training(model, cfg: FedAvgSSLConfig, weights, seed, data):
  """E epochs of steps on batches of `local_batch_size`, each epoch over a seeded shuffle.

  A `tf.while_loop` (the number of steps depends on N_k) built in a `tf.function`, so the TF1 graph
  of a TFF computation keeps no per-iteration intermediates.
  """
  method = cfg.method
  opt = common.client_optimizer(cfg.client_optimizer, cfg.client_learning_rate)
  specs = tuple(tf.TensorSpec(w.shape, w.dtype) for w in weights)

  @tf.function
  def train(weights, images, ids, seed):
    n = tf.shape(ids)[0]
    batch = tf.minimum(cfg.local_batch_size, n)
    per_epoch = tf.maximum(1, n // batch)
    total = cfg.local_steps * per_epoch
    shuffle_seed = tf.random.experimental.stateless_fold_in(seed, 1 << 30)  # Apart from views'.

    def body(step, current, target, opt_state, first, loss_sum):
      epoch, b = step // per_epoch, step % per_epoch
      order = tf.argsort(tf.random.stateless_uniform(
          [n], tf.random.experimental.stateless_fold_in(shuffle_seed, epoch)))
      idx = order[b * batch:(b + 1) * batch]
      client = {"images": tf.gather(images, idx), "ids": tf.gather(ids, idx)}
      v1, v2 = common.views(client, tf.random.experimental.stateless_fold_in(seed, step),
                            cfg.augment)
      with tf.GradientTape() as tape:
        tape.watch(current)
        loss = method.loss(_outputs(model, method, current, target if method.ema_target else None,
                                    v1, v2), cfg)
      grads = tape.gradient(loss, current)
      if cfg.client_weight_decay:
        grads = [g + cfg.client_weight_decay * w for g, w in zip(grads, current)]
      opt_state, new = opt.next(opt_state, tuple(current), tuple(grads))
      new = list(new)
      if method.ema_target:
        target = _ema(target, new, cfg.target_decay)
      first = tf.where(tf.equal(step, 0), loss, first)  # (`==` is identity in TFF's graphs.)
      return step + 1, new, target, opt_state, first, loss_sum + loss

    current = list(weights)
    _, trained, _, _, first, loss_sum = tf.while_loop(
        lambda step, *_: step < total, body,
        (tf.constant(0), current, list(current), opt.initialize(specs), tf.constant(0.0),
         tf.constant(0.0)), parallel_iterations=1)
    return ([a - b for a, b in zip(current, trained)], first,
            loss_sum / tf.cast(total, tf.float32))

  return train(list(weights), grouping.field(data, "images"), grouping.field(data, "ids"), seed)


def local_training(model: FunctionalModel, cfg: FedAvgSSLConfig, weights, seed, data):
  """A client's local training on its own images: (Delta_k, first-step loss, mean loss)."""
  if cfg.local_batch_size:
    return _minibatch_training(model, cfg, weights, seed, data)
  return _full_batch_training(model, cfg, weights, seed, data)


class FedAvgSSLProcess(common.ServerLoop):
  """FedAvg-style rounds; same interface as `DCCOProcess`.

    run_round: (<w@SERVER, aggregator_state@SERVER, seed@SERVER, data@CLIENTS>
                -> <aggregator_state, update, loss, measurements>@SERVER)

  `aggregation_factory`: a `tff_ssl.aggregators.StrategyFactory` (default FedAvg), whose weight
  argument is each client's `ClientInfo`. In reference mode (one real client per TFF client slot)
  any weighted `tff.aggregators` factory over that weight works, e.g. TFF's
  `clipping_factory(norm, aggregators.LDAWAFactory(...))`. In grouped mode (the default) a slot
  carries many real clients, runs the strategy's per-client stage for each of them and hands the
  server stage one folded `Contribution` (`aggregators.base`): the same result as reference mode,
  which is why grouped mode takes a `StrategyFactory` itself (a TFF factory wrapped around it would
  see a slot's partial sum, not a client).
  """

  def __init__(self, model: FunctionalModel, image_shape: Sequence[int],
               server_optimizer: tff.learning.optimizers.Optimizer,
               config: FedAvgSSLConfig = FedAvgSSLConfig(),
               aggregation_factory: tff.aggregators.WeightedAggregationFactory | None = None,
               simulation: grouping.Simulation = grouping.Simulation()):
    self.config = config
    self.simulation = simulation
    cfg, method = config, config.method
    if method.predictor and len(model.output_dims) != 2:
      raise ValueError(f"{method.name} needs a model with a predictor head (outputs: projection, "
                       f"prediction); this one has {len(model.output_dims)} output(s)")
    w_type = common.weights_type(model)
    specs = list(model.weight_specs)
    info_type = aggregators.client_info_type(w_type)
    data_type = (grouping.group_input_type(image_shape) if simulation.grouped
                 else common.client_input_type(image_shape))
    factory = aggregation_factory if aggregation_factory is not None else (
        aggregators.FedAvgFactory())
    if simulation.grouped:
      if not isinstance(factory, aggregators.StrategyFactory):
        raise ValueError(f"the grouped simulation runs the aggregation strategy's per-client stage "
                         f"inside each client slot, so it needs a tff_ssl.aggregators strategy; got "
                         f"{type(factory).__name__}. Use simulation mode 'reference' for other "
                         f"tff.aggregators factories")
      aggregator = factory.create_grouped(w_type)
    else:
      try:
        aggregator = factory.create(w_type, info_type)
      except TypeError as e:
        raise ValueError(f"aggregation_factory must weigh clients by their ClientInfo "
                         f"(tff_ssl.aggregators); {type(factory).__name__} failed: {e}") from None
    agg_state_type = aggregator.initialize.type_signature.result
    batched = (simulation.grouped and simulation.batch_one_step and cfg.local_steps == 1 and
               not cfg.local_batch_size and not factory.needs_client_updates)

    def batched_group_update(weights, seed, data):
      # One (first) step of the client optimizer is linear in the gradient, so
      # sum_k b_k Delta_k / sum_k b_k = eta grad(sum_k b_k L_k / sum_k b_k), with b_k from the
      # per-client losses at the broadcast weights (held fixed): one batched forward/backward pass.
      n = tf.cast(data.sizes, tf.float32)
      v1, v2 = common.views(data, seed, cfg.augment)
      per_client = {}

      def objective(current, step):
        del step  # One step.
        losses_k = method.per_client_loss(_outputs(model, method, current, None, v1, v2),
                                          data.sizes, cfg)
        log_b = tf.stop_gradient(aggregators.base.base_log_weight(factory.weighting, n, losses_k))
        b = tf.exp(log_b - tf.reduce_max(log_b))
        per_client.update(losses=losses_k, log_b=log_b)
        return tf.reduce_sum(b * losses_k) / tf.reduce_sum(b)

      delta, _, _ = common.local_training(weights, 1, cfg.client_optimizer,
                                          cfg.client_learning_rate, objective,
                                          weight_decay=cfg.client_weight_decay)
      log_b, losses_k = per_client["log_b"], per_client["losses"]
      top = tf.reduce_max(log_b)
      contribution = aggregators.Contribution(
          delta, top + tf.math.log(tf.reduce_sum(tf.exp(log_b - top))), top,
          collections.OrderedDict(clients=tf.cast(tf.shape(n)[0], tf.float32)))
      return contribution, tf.reduce_sum(n * losses_k) / tf.reduce_sum(n), tf.reduce_sum(n)

    def looped_group_update(weights, seed, data, round_num):
      def one_client(images, ids, acc):
        client = {"images": images, "ids": ids}
        delta, first_loss, mean_loss = local_training(model, cfg, weights, seed, client)
        n = common.num_examples(client)
        scale, log_weight, stats = factory.client_terms(
            delta, ClientInfo(n, mean_loss, list(weights)), round_num)
        return (factory.accumulate(acc[0], delta, scale, log_weight, stats),
                acc[1] + n * first_loss, acc[2] + n)

      zero = tf.constant(0.0)
      acc, loss_sum, n = grouping.fold_clients(
          data, one_client, (factory.initial_accumulator(specs), zero, zero))
      return factory.finalize(acc, list(weights)), loss_sum / n, n

    if simulation.grouped:
      @tff.tensorflow.computation(w_type, common.SEED_TYPE, data_type, np.int32)
      def client_update(weights, seed, data, round_num):
        if batched:
          contribution, loss, n = batched_group_update(weights, seed, data)
        else:
          contribution, loss, n = looped_group_update(weights, seed, data, round_num)
        return aggregators.base._as_struct(contribution), loss, n  # pylint: disable=protected-access
    else:
      @tff.tensorflow.computation(w_type, common.SEED_TYPE, data_type)
      def client_update(weights, seed, data):
        delta, first_loss, mean_loss = local_training(model, cfg, weights, seed, data)
        return delta, first_loss, common.num_examples(data), mean_loss

    @tff.federated_computation(tff.FederatedType(w_type, tff.SERVER), agg_state_type,
                               tff.FederatedType(common.SEED_TYPE, tff.SERVER),
                               tff.FederatedType(data_type, tff.CLIENTS))
    def run_round(weights, aggregator_state, seed, data):
      weights_at_clients = tff.federated_broadcast(weights)
      seed_at_clients = tff.federated_broadcast(seed)
      if simulation.grouped:
        out = tff.federated_map(client_update, (
            weights_at_clients, seed_at_clients, data,
            tff.federated_broadcast(aggregator_state.round)))
        aggregated = aggregator.next(aggregator_state, out[0])
      else:
        out = tff.federated_map(client_update, (weights_at_clients, seed_at_clients, data))
        info = tff.federated_zip(collections.OrderedDict(
            num_examples=out[2], loss=out[3], model=weights_at_clients))
        aggregated = aggregator.next(aggregator_state, out[0], info)
      return collections.OrderedDict(aggregator_state=aggregated.state, update=aggregated.result,
                                     loss=tff.federated_mean(out[1], weight=out[2]),
                                     measurements=aggregated.measurements)

    self.client_update = client_update
    self.run_round = run_round
    self.aggregator = aggregator
    self.factory = factory
    super().__init__(model, server_optimizer, aggregator)

  def compute_update(self, state: common.ServerState, clients: list[dict]) -> dict:
    """The round's aggregated update, mean client loss, aggregator state and measurements, before
    the server optimizer step."""
    if not clients:
      raise ValueError("a FedAvg round needs at least one client")
    need = self.config.method.min_samples
    small = [len(c["ids"]) for c in clients if len(c["ids"]) < need]
    if small:
      raise ValueError(f"{self.config.ssl}'s within-client loss needs >= {need} images per client; "
                       f"got a client with {small[0]}. Use DCCO for one-image clients")
    seed = common.round_seed(self.config.seed, state.round_num)
    data = (grouping.pack(clients, self.simulation.group_size) if self.simulation.grouped
            else clients)
    return dict(self.run_round(state.weights, state.aggregator_state, seed, data))

  def next(self, state: common.ServerState, clients: list[dict]):
    out = self.compute_update(state, clients)
    new_state, metrics = self.finish_round(state, out["update"], out["loss"], len(clients),
                                           out["aggregator_state"])
    metrics["aggregation"] = out["measurements"]
    return new_state, metrics
