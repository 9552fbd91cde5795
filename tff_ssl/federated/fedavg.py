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
import contextlib
import dataclasses
from typing import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import aggregators, losses
from tff_ssl.losses import feature_correlation, moco
from tff_ssl import ssl as ssl_lib
from tff_ssl.aggregators import ClientInfo
from tff_ssl.data.augment import AugmentConfig
from tff_ssl.federated import client_state as client_state_lib
from tff_ssl.federated import common, grouping
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.method import FEDERATED_FIELDS, Method
from tff_ssl.models import vit

DEFAULT_TARGET_DECAY = 0.99  # BYOL's target EMA within local training (FedEMA's setting).
DEPTH_DROPOUT_KEY = 0xDD  # Folded into a local step's seed: its blocks' keep draws.


@dataclasses.dataclass(frozen=True)
class FedAvgSSLConfig:
  """The clients' side of a FedAvg-style round.

  local_steps: local epochs; with local_batch_size = 0 (the whole client as one batch) an epoch is
    one step. With local_batch_size = B > 0 an epoch is floor(N_k / B) steps over a fresh shuffle
    (a last partial batch is dropped, as SSL training loaders do, unless it is the client's only one).
  client_weight_decay: weight decay of the client optimizer: coupled L2 on the gradients with SGD
    (the L-DAWA paper: 1e-4), decoupled with AdamW (LW-FedSSL: 1e-5).
  alignment_weight: beta > 0 adds LW-FedSSL's representation alignment to the client's loss,
    beta * InfoNCE(local encoder on view 1, broadcast (global) encoder on view 2)
    (`losses.alignment_loss`); the model must output its encoder's features last
    (`ssl_model.ssl_model_builder(..., features=True)`).
  depth_dropout, droppable_blocks: FLL's depth dropout: at each local step each of the ViT encoder's
    first `droppable_blocks` blocks (the frozen ones) is skipped with probability `depth_dropout`
    (`models.vit.block_keep`), drawn from the step's seed.
  feature_correlation: FedFoA's settings, read by `client_loss` when the client's state brings a
    bank (`tff_ssl.federated.fedfoa`).
  head_norm: the model's heads' normalization ("group", or "batch": statistics of the client's own
    batch, so a client needs >= 2 images and the grouped simulation runs each real client's forward
    pass on its own, never several clients' images in one batch).
  """

  ssl: str = "cco"
  cco_lambda: float = losses.cco.DEFAULT_LAMBDA
  temperature: float = losses.ntxent.DEFAULT_TEMPERATURE
  target_decay: float = DEFAULT_TARGET_DECAY
  moco_queue: int = moco.DEFAULT_QUEUE
  client_optimizer: str = "sgd"
  client_learning_rate: float = 1.0
  client_weight_decay: float = 0.0
  local_steps: int = 1
  local_batch_size: int = 0
  augment: AugmentConfig = AugmentConfig.dcco_cifar()
  seed: int = 0
  alignment_weight: float = 0.0
  depth_dropout: float = 0.0
  droppable_blocks: int = 0
  feature_correlation: feature_correlation.FeatureCorrelationConfig | None = None
  head_norm: str = "group"

  def __post_init__(self):
    ssl_lib.get(self.ssl)
    if self.head_norm not in ("group", "batch"):
      raise ValueError(f"head_norm must be 'group' or 'batch'; got {self.head_norm!r}")
    if not 0 <= self.depth_dropout < 1 or self.droppable_blocks < 0:
      raise ValueError(f"depth_dropout must be in [0, 1) and droppable_blocks >= 0; got "
                       f"{self.depth_dropout}, {self.droppable_blocks}")
    if not self.alignment_weight >= 0:
      raise ValueError(f"alignment_weight must be >= 0 (0: no representation alignment); got "
                       f"{self.alignment_weight}")
    common.check_client_training(self.local_steps, self.client_optimizer,
                                 self.client_learning_rate)
    if self.local_batch_size < 0 or self.local_batch_size == 1:
      raise ValueError(f"local_batch_size must be 0 (full batch) or >= 2; got "
                       f"{self.local_batch_size}")
    if self.client_weight_decay < 0:
      raise ValueError(f"client_weight_decay must be >= 0; got {self.client_weight_decay}")
    if not 0 <= self.target_decay < 1:
      raise ValueError(f"target_decay must be in [0, 1); got {self.target_decay}")
    if self.moco_queue < 1:
      raise ValueError(f"moco_queue must be >= 1; got {self.moco_queue}")

  @property
  def method(self) -> ssl_lib.SSLMethod:
    return ssl_lib.get(self.ssl)

  @property
  def min_samples(self) -> int:
    """Fewest images a client can train on: the loss's, and 2 for batch statistics."""
    return max(self.method.min_samples, 2 if self.head_norm == "batch" else 1)


def view_outputs(model: FunctionalModel, method: ssl_lib.SSLMethod, weights, target, v1, v2,
             queue=None) -> ssl_lib.Outputs:
  """The SSL method's view outputs; `target` None: the online projections stand in (first step).
  A model with one output more than its heads (`ssl_model_builder(..., features=True)`) gives the
  encoder's features too (h1, h2)."""
  outs = common.encode_outputs(model, weights, v1, v2)
  heads = 1 + int(method.predictor)
  (z1, z2), (p1, p2) = outs[0], (outs[1] if method.predictor else (None, None))
  h1, h2 = outs[heads] if len(outs) > heads else (None, None)
  t1 = t2 = None
  if method.ema_target:
    t1, t2 = (z1, z2) if target is None else common.encode_outputs(model, target, v1, v2)[0]
  return ssl_lib.Outputs(z1, z2, p1, p2, t1, t2, queue, h1, h2)


def depth_dropout_scope(cfg: "FedAvgSSLConfig", step_seed):
  """The context of one local step's forward passes: FLL's depth dropout (each droppable block
  skipped with probability `depth_dropout`, from `step_seed`), or nothing."""
  if not cfg.depth_dropout or not cfg.droppable_blocks:
    return contextlib.nullcontext()
  u = tf.random.stateless_uniform(
      [cfg.droppable_blocks], tf.random.experimental.stateless_fold_in(step_seed, DEPTH_DROPOUT_KEY))
  return vit.block_keep(u >= cfg.depth_dropout)


def client_loss(model: FunctionalModel, cfg: "FedAvgSSLConfig", outputs: ssl_lib.Outputs, start,
                v2, ssl_state: dict | None = None, record: dict | None = None) -> tf.Tensor:
  """The client's loss of one step: the SSL method's, plus
  - with `alignment_weight` > 0, beta * InfoNCE between the local encoder's features of view 1 and
    the features the model the client started from (the broadcast, global one: `start`) gives view 2
    (LW-FedSSL's representation alignment);
  - with FedFoA's bank in `ssl_state` (`feature_correlation_term`), lambda * its alignment term; the
    term and its partner count go to `record["fedfoa"]` (for the client's report)."""
  loss = cfg.method.loss(outputs, cfg)
  if cfg.alignment_weight:
    global_features = model(list(start), v2, training=True)[-1]
    loss += cfg.alignment_weight * losses.alignment_loss(
        outputs.h1, tf.stop_gradient(global_features), cfg.temperature)
  if ssl_state and "fedfoa_bank" in ssl_state:
    term, partners = feature_correlation_term(cfg.feature_correlation, outputs, ssl_state)
    if record is not None:
      record["fedfoa"] = (tf.stop_gradient(term), partners)
    loss += cfg.feature_correlation.weight * term
  return loss


def feature_correlation_term(fc: feature_correlation.FeatureCorrelationConfig,
                             outputs: ssl_lib.Outputs, ssl_state: dict):
  """FedFoA's alignment term of one step (`losses.feature_correlation`), averaged over the two views'
  projections (each view is a batch of features Z, as the SSL loss is symmetrized), and the mean
  number of bank entries it aligned to. Zero, with no SVD computed, when no entry is valid (the
  warm-up rounds, an empty bank)."""
  bank, valid = ssl_state["fedfoa_bank"], ssl_state["fedfoa_valid"]

  def term():
    parts = [feature_correlation.alignment_loss(z, bank, valid, fc.norm, fc.select)
             for z in (outputs.z1, outputs.z2)]
    return (parts[0][0] + parts[1][0]) / 2.0, (parts[0][1] + parts[1][1]) / 2.0

  zero = tf.constant(0.0)
  return tf.cond(tf.reduce_any(valid), term, lambda: (zero, zero))


def _ema(target, current, decay: float):
  return [decay * t + (1.0 - decay) * c for t, c in zip(target, current)]


def initial_ssl_state(model: FunctionalModel, cfg: "FedAvgSSLConfig") -> dict:
  """What the SSL method carries across local steps, at the start of a client's training when it
  brings nothing of its own: {"target": None} (= the start weights) for a target network,
  {"queue": zeros} for a queue of negative keys; {} for neither."""
  method, out = cfg.method, {}
  if method.ema_target:
    out["target"] = None
  if method.queue:
    out["queue"] = tf.zeros([cfg.moco_queue, model.output_dims[0]])
  return out


def _next_ssl_state(cfg, ssl_state: dict, start, current, outputs: ssl_lib.Outputs,
                    record: dict) -> dict:
  """The SSL state after a step that moved the online weights to `current` (all tensors); `record`:
  what the step's loss recorded (`client_loss`)."""
  out = dict(ssl_state)
  if "target" in out:
    out["target"] = _ema(list(start) if out["target"] is None else out["target"], current,
                         cfg.target_decay)
  if "queue" in out:
    out["queue"] = moco.enqueue(out["queue"], outputs.t2)
  if "fedfoa_r_sum" in out:  # FedFoA: R of this step's batch (both views), and its term.
    r = [feature_correlation.correlation_r(tf.stop_gradient(z)) for z in (outputs.z1, outputs.z2)]
    term, partners = record["fedfoa"]
    out.update(fedfoa_r_sum=out["fedfoa_r_sum"] + (r[0] + r[1]) / 2.0,
               fedfoa_steps=out["fedfoa_steps"] + 1.0,
               fedfoa_term_sum=out["fedfoa_term_sum"] + term,
               fedfoa_partner_sum=out["fedfoa_partner_sum"] + partners)
  return out


def _full_batch_training(model, cfg: FedAvgSSLConfig, weights, seed, data, mask, ssl_state):
  """E full-batch steps on the client's images (new views at each step)."""
  method = cfg.method
  carry = [ssl_state, None, {}]  # The SSL state; the last step's outputs and record.

  def loss_of(current, step):
    step_seed = seed if step == 0 else tf.random.experimental.stateless_fold_in(seed, step)
    v1, v2 = common.views(data, step_seed, cfg.augment)
    with depth_dropout_scope(cfg, step_seed):
      carry[1] = view_outputs(model, method, current, carry[0].get("target"), v1, v2,
                              carry[0].get("queue"))
      return client_loss(model, cfg, carry[1], weights, v2, carry[0], carry[2])

  def after_step(current):
    carry[0] = _next_ssl_state(cfg, carry[0], weights, current, carry[1], carry[2])

  delta, first, mean = common.local_training(weights, cfg.local_steps, cfg.client_optimizer,
                                             cfg.client_learning_rate, loss_of, after_step,
                                             cfg.client_weight_decay, mask)
  return delta, first, mean, carry[0]


def _minibatch_training(model, cfg: FedAvgSSLConfig, weights, seed, data, mask, ssl_state):
  """E epochs of steps on batches of `local_batch_size`, each epoch over a seeded shuffle.

  A `tf.while_loop` (the number of steps depends on N_k) built in a `tf.function`, so the TF1 graph
  of a TFF computation keeps no per-iteration intermediates.
  """
  method = cfg.method
  opt = common.client_optimizer(cfg.client_optimizer, cfg.client_learning_rate,
                                cfg.client_weight_decay)
  specs = tuple(tf.TensorSpec(w.shape, w.dtype) for w in mask.select(weights))
  # A loop variable cannot be None: the target starts as the start weights.
  ssl_state = {k: (list(weights) if k == "target" and v is None else v)
               for k, v in ssl_state.items()}

  @tf.function(autograph=False)  # The loop is explicit; autograph only re-parses the body.
  def train(weights, ssl_state, images, ids, seed):
    n = tf.shape(ids)[0]
    batch = tf.minimum(cfg.local_batch_size, n)
    per_epoch = tf.maximum(1, n // batch)
    total = cfg.local_steps * per_epoch
    shuffle_seed = tf.random.experimental.stateless_fold_in(seed, 1 << 30)  # Apart from views'.

    def body(step, current, ssl_state, opt_state, first, loss_sum):
      epoch, b = step // per_epoch, step % per_epoch
      order = tf.argsort(tf.random.stateless_uniform(
          [n], tf.random.experimental.stateless_fold_in(shuffle_seed, epoch)))
      idx = order[b * batch:(b + 1) * batch]
      client = {"images": tf.gather(images, idx), "ids": tf.gather(ids, idx)}
      step_seed = tf.random.experimental.stateless_fold_in(seed, step)
      v1, v2 = common.views(client, step_seed, cfg.augment)
      outputs, record = [None], {}

      def loss_of(trained):
        with depth_dropout_scope(cfg, step_seed):
          outputs[0] = view_outputs(model, method, mask.merge(trained, weights),
                                    ssl_state.get("target"), v1, v2, ssl_state.get("queue"))
          return client_loss(model, cfg, outputs[0], weights, v2, ssl_state, record)

      opt_state, new, loss = common.client_step(
          opt, opt_state, current, loss_of,
          common.coupled_weight_decay(cfg.client_optimizer, cfg.client_weight_decay))
      ssl_state = _next_ssl_state(cfg, ssl_state, weights, mask.merge(new, weights), outputs[0],
                                  record)
      first = tf.where(tf.equal(step, 0), loss, first)  # (`==` is identity in TFF's graphs.)
      return step + 1, new, ssl_state, opt_state, first, loss_sum + loss

    current = mask.select(weights)
    _, trained, ssl_state, _, first, loss_sum = tf.while_loop(
        lambda step, *_: step < total, body,
        (tf.constant(0), current, ssl_state, opt.initialize(specs), tf.constant(0.0),
         tf.constant(0.0)), parallel_iterations=1)
    return ([a - b for a, b in zip(current, trained)], first,
            loss_sum / tf.cast(total, tf.float32), ssl_state)

  return train(list(weights), ssl_state, grouping.field(data, "images"),
               grouping.field(data, "ids"), seed)


def local_training(model: FunctionalModel, cfg: FedAvgSSLConfig, weights, seed, data,
                   mask: common.TensorMask | None = None, ssl_state: dict | None = None):
  """A client's local training on its own images, of the tensors of `mask` (default: all), from
  `weights`.

  `ssl_state`: what the SSL method carries across steps at the start ({"target": the EMA target
  network (all the model's tensors; None: the start weights), "queue": MoCo's negative keys});
  None: `initial_ssl_state` (FedAvg-style clients, which keep nothing between rounds).

  Returns (Delta_k of the trained tensors, first-step loss, mean loss, the SSL state after the last
  step).
  """
  mask = mask or common.TensorMask.all(len(weights))
  ssl_state = initial_ssl_state(model, cfg) if ssl_state is None else ssl_state
  if cfg.local_batch_size:
    return _minibatch_training(model, cfg, weights, seed, data, mask, ssl_state)
  return _full_batch_training(model, cfg, weights, seed, data, mask, ssl_state)


class FedAvgSSLProcess(common.ServerLoop):
  """FedAvg-style rounds; same interface as `DCCOProcess`.

    run_round: (<w@SERVER, aggregator_state@SERVER, seed@SERVER, data@CLIENTS[, state@CLIENTS]>
                -> <aggregator_state, update, loss, measurements>@SERVER[, new state@CLIENTS])

  w crosses the TFF boundary as one flat vector (`common.flat_weights`); so does a grouped slot's
  update where the strategy's server stage is elementwise (`compute_update` gives the tensors back).

  `aggregation_factory`: a `tff_ssl.aggregators.StrategyFactory` (default FedAvg), whose weight
  argument is each client's `ClientInfo`. In reference mode (one real client per TFF client slot)
  any weighted `tff.aggregators` factory over that weight works, e.g. TFF's
  `clipping_factory(norm, aggregators.LDAWAFactory(...))`. In grouped mode (the default) a slot
  carries many real clients, runs the strategy's per-client stage for each of them and hands the
  server stage one folded `Contribution` (`aggregators.base`): the same result as reference mode,
  which is why grouped mode takes a `StrategyFactory` itself (a TFF factory wrapped around it would
  see a slot's partial sum, not a client).

  `mask`: the tensors trained and exchanged (default all). The clients receive the whole model (the
  frozen tensors are needed for the forward pass) and upload Delta_k of the trained tensors only;
  the aggregator and the server optimizer see only those, so frozen tensors stay bit-identical.

  `client_state`: a `client_state.ClientState` makes the process stateful: each sampled client's
  state goes in as a CLIENTS-placed value, its local training starts from `begin(state, w)`, it
  uploads Delta_k = w - (its trained weights) and keeps `end(...)`. `next` then needs the clients'
  ids and a `ClientStateStore`. A client state with a `context_spec` also receives, broadcast, what
  the process's `client_context(server state)` gives (e.g. FedLAMA's last aggregation round of each
  tensor); a process with server state of its own overrides `server_stage` (what the server does
  with the aggregate before the optimizer step) and `initial_method_state`.
  """

  def __init__(self, model: FunctionalModel, image_shape: Sequence[int],
               server_optimizer: tff.learning.optimizers.Optimizer,
               config: FedAvgSSLConfig = FedAvgSSLConfig(),
               aggregation_factory: tff.aggregators.WeightedAggregationFactory | None = None,
               simulation: grouping.Simulation = grouping.Simulation(),
               mask: common.TensorMask | None = None,
               client_state: client_state_lib.ClientState | None = None):
    super().__init__(model, server_optimizer, mask=mask)
    self.config = config
    self.simulation = simulation
    self.client_state = client_state
    cfg, method, mask = config, config.method, self.mask
    outputs = 1 + int(method.predictor) + int(config.alignment_weight > 0)
    if len(model.output_dims) < outputs:
      raise ValueError(
          f"{method.name}{' with representation alignment' if config.alignment_weight else ''} "
          f"needs a model with {outputs} output(s) (projection"
          f"{', prediction' if method.predictor else ''}"
          f"{', encoder features' if config.alignment_weight else ''}); this one has "
          f"{len(model.output_dims)}")
    all_specs = model.weight_specs
    w_type = common.flat_type(all_specs)  # The broadcast crosses the TFF boundary as one vector.
    specs = self.trained_specs
    u_type = common.tensors_type(specs)  # The upload: the trained tensors' Delta_k.
    info_type = aggregators.client_info_type(u_type)
    data_type = (grouping.group_input_type(image_shape) if simulation.grouped
                 else common.client_input_type(image_shape))
    state_type = context_type = extra_type = ids_type = report_spec = None
    slot_dims = [None] if simulation.grouped else []  # A grouped slot stacks its clients' values.
    if client_state is not None:
      one = client_state.spec(model)
      self._initial_client_state = client_state.initial(model)
      state_type = tff.types.to_type(tf.nest.map_structure(
          lambda s: tff.TensorType(s.dtype.as_numpy_dtype, slot_dims + list(s.shape)), one))
      context = client_state.context_spec(model)
      if context is not None:
        context_type = tff.types.to_type(tf.nest.map_structure(
            lambda s: tff.TensorType(s.dtype.as_numpy_dtype, list(s.shape)), context))
      report_spec = client_state.report_spec(model)
      if report_spec is not None:
        # Each client's upload beside its update: (its id, its report), collected at the server.
        report_spec = collections.OrderedDict(client=tf.TensorSpec([], tf.int64), **report_spec)
        ids_type = tff.TensorType(np.int64, slot_dims)
      # What a stateful client takes beside the weights, seed and data: its state, the round's
      # broadcast context where the method has one, and its id where it reports.
      extra_type = tff.types.to_type(collections.OrderedDict(
          [("states", state_type)] + ([("context", context_type)] if context_type else []) +
          ([("ids", ids_type)] if ids_type else [])))
    self._context_type = context_type
    self._reports = report_spec is not None
    factory = aggregation_factory if aggregation_factory is not None else (
        aggregators.FedAvgFactory())
    if simulation.grouped:
      if not isinstance(factory, aggregators.StrategyFactory):
        raise ValueError(f"the grouped simulation runs the aggregation strategy's per-client stage "
                         f"inside each client slot, so it needs a tff_ssl.aggregators strategy; got "
                         f"{type(factory).__name__}. Use simulation mode 'reference' for other "
                         f"tff.aggregators factories")
      # A slot's contribution crosses the TFF boundary as one flat vector where the server stage is
      # elementwise (every strategy's own weighted mean; not a user's inner factory), as the
      # broadcast does.
      flat_upload = factory.elementwise_server_stage
      aggregator = factory.create_grouped(tff.StructType([common.flat_type(specs)]) if flat_upload
                                          else u_type)
    else:
      try:
        aggregator = factory.create(u_type, info_type)
      except TypeError as e:
        raise ValueError(f"aggregation_factory must weigh clients by their ClientInfo "
                         f"(tff_ssl.aggregators); {type(factory).__name__} failed: {e}") from None
    self._aggregator = aggregator
    self._flat_upload = simulation.grouped and flat_upload
    agg_state_type = aggregator.initialize.type_signature.result
    batched = (simulation.grouped and simulation.batch_one_step and cfg.local_steps == 1 and
               not cfg.local_batch_size and not factory.needs_client_updates and
               client_state is None and not cfg.alignment_weight and
               not (cfg.depth_dropout and cfg.droppable_blocks) and cfg.head_norm == "group")

    def batched_group_update(weights, seed, data):
      # One (first) step of the client optimizer is linear in the gradient, so
      # sum_k b_k Delta_k / sum_k b_k = eta grad(sum_k b_k L_k / sum_k b_k), with b_k from the
      # per-client losses at the broadcast weights (held fixed): one batched forward/backward pass.
      n = tf.cast(data.sizes, tf.float32)
      v1, v2 = common.views(data, seed, cfg.augment)
      per_client = {}

      def objective(current, step):
        del step  # One step.
        losses_k = method.per_client_loss(view_outputs(model, method, current, None, v1, v2,
                                                   initial_ssl_state(model, cfg).get("queue")),
                                          data.sizes, cfg)
        log_b = tf.stop_gradient(aggregators.base.base_log_weight(factory.weighting, n, losses_k))
        b = tf.exp(log_b - tf.reduce_max(log_b))
        per_client.update(losses=losses_k, log_b=log_b)
        return tf.reduce_sum(b * losses_k) / tf.reduce_sum(b)

      delta, _, _ = common.local_training(weights, 1, cfg.client_optimizer,
                                          cfg.client_learning_rate, objective,
                                          weight_decay=cfg.client_weight_decay, mask=mask)
      log_b, losses_k = per_client["log_b"], per_client["losses"]
      top = tf.reduce_max(log_b)
      contribution = aggregators.Contribution(
          delta, top + tf.math.log(tf.reduce_sum(tf.exp(log_b - top))), top,
          collections.OrderedDict(clients=tf.cast(tf.shape(n)[0], tf.float32)))
      return contribution, tf.reduce_sum(n * losses_k) / tf.reduce_sum(n), tf.reduce_sum(n)

    def client_round(weights, seed, client, state, context=None, client_id=None):
      """One real client's round: (upload Delta_k, first-step loss, mean loss, N_k, new state
      (None: stateless) and, with its id, (new state, its report))."""
      if client_state is None:
        delta, first_loss, mean_loss, _ = local_training(model, cfg, weights, seed, client, mask)
        return delta, first_loss, mean_loss, common.num_examples(client), None
      start = client_state.begin(state, list(weights), context)
      ssl_state = dict(initial_ssl_state(model, cfg),
                       **(client_state.ssl_state(state, start, context, client_id) or {}))
      delta, first_loss, mean_loss, ssl_state = local_training(
          model, cfg, start, seed, client, mask, ssl_state)
      n = common.num_examples(client)
      # Delta_k relative to the broadcast model, whatever the client started from.
      upload = [g - s + d for g, s, d in zip(mask.select(weights), mask.select(start), delta)]
      new_state = client_state.end(state, mask.select(weights), upload, n, mean_loss, ssl_state,
                                   context)
      if client_id is not None:
        report = collections.OrderedDict(client=client_id,
                                         **client_state.report(ssl_state, context))
        new_state = (new_state, report)
      return upload, first_loss, mean_loss, n, new_state

    def looped_group_update(weights, seed, data, round_num, states, context=None, ids=None):
      def one_client(images, ids_k, *rest):
        state, acc = rest if states is not None else (None, rest[0])
        if ids is not None:
          state, client_id = state
        delta, first_loss, mean_loss, n, new_state = client_round(
            weights, seed, {"images": images, "ids": ids_k}, state, context,
            client_id if ids is not None else None)
        scale, log_weight, stats = factory.client_terms(
            delta, ClientInfo(n, mean_loss, mask.select(weights)), round_num)
        acc = (factory.accumulate(acc[0], delta, scale, log_weight, stats),
               acc[1] + n * first_loss, acc[2] + n)
        return acc if states is None else (acc, new_state)

      zero = tf.constant(0.0)
      # A client that reports folds (state, id) into (new state, report).
      folded, out_specs = states, None
      if ids is not None:
        folded = (states, ids)
        out_specs = (tf.nest.map_structure(lambda s: tf.TensorSpec(s.shape[1:], s.dtype), states),
                     report_spec)
      out = grouping.fold_clients(
          data, one_client, (factory.initial_accumulator(specs), zero, zero), folded, out_specs)
      (acc, loss_sum, n), new_states = out if states is not None else (out, None)
      return factory.finalize(acc, mask.select(weights)), loss_sum / n, n, new_states

    if simulation.grouped:
      def grouped_update(weights, seed, data, round_num, states=None, context=None, ids=None):
        weights = common.unflatten_tensors(weights, all_specs)
        if batched:
          contribution, loss, n = batched_group_update(weights, seed, data)
          new_states = None
        else:
          contribution, loss, n, new_states = looped_group_update(weights, seed, data, round_num,
                                                                  states, context, ids)
        if flat_upload:
          contribution = contribution._replace(value=[common.flatten(contribution.value)])
        out = (aggregators.base._as_struct(contribution), loss, n)  # pylint: disable=protected-access
        if new_states is None:
          return out
        return out + ((new_states,) if ids is None else tuple(new_states))  # + reports

      if state_type is None:
        @tff.tensorflow.computation(w_type, common.SEED_TYPE, data_type, np.int32)
        def client_update(weights, seed, data, round_num):
          return grouped_update(weights, seed, data, round_num)
      else:
        @tff.tensorflow.computation(w_type, common.SEED_TYPE, data_type, np.int32, extra_type)
        def client_update(weights, seed, data, round_num, extra):
          return grouped_update(weights, seed, data, round_num, extra["states"],
                                extra["context"] if context_type else None,
                                extra["ids"] if ids_type else None)
    else:
      def reference_update(weights, seed, data, state=None, context=None, client_id=None):
        weights = common.unflatten_tensors(weights, all_specs)
        delta, first_loss, mean_loss, n, new_state = client_round(weights, seed, data, state,
                                                                  context, client_id)
        out = (delta, first_loss, n, mean_loss)
        if new_state is None:
          return out
        if client_id is None:
          return out + (new_state,)
        new_state, report = new_state  # The report as a one-client stack, as a grouped slot's.
        return out + (new_state, tf.nest.map_structure(lambda x: x[None], report))

      if state_type is None:
        @tff.tensorflow.computation(w_type, common.SEED_TYPE, data_type)
        def client_update(weights, seed, data):
          return reference_update(weights, seed, data)
      else:
        @tff.tensorflow.computation(w_type, common.SEED_TYPE, data_type, extra_type)
        def client_update(weights, seed, data, extra):
          return reference_update(weights, seed, data, extra["states"],
                                  extra["context"] if context_type else None,
                                  extra["ids"] if ids_type else None)

    def round_body(weights, aggregator_state, seed, data, states=None, context=None, ids=None):
      weights_at_clients = tff.federated_broadcast(weights)
      seed_at_clients = tff.federated_broadcast(seed)
      extra = ()
      if states is not None:
        parts = collections.OrderedDict(states=states)
        if context is not None:
          parts["context"] = tff.federated_broadcast(context)
        if ids is not None:
          parts["ids"] = ids
        extra = (tff.federated_zip(parts),)
      if simulation.grouped:
        out = tff.federated_map(client_update, (
            weights_at_clients, seed_at_clients, data,
            tff.federated_broadcast(aggregator_state.round)) + extra)
        aggregated = aggregator.next(aggregator_state, out[0])
        first_state = 3
      else:
        out = tff.federated_map(client_update, (weights_at_clients, seed_at_clients, data) + extra)
        # The trained tensors as the aggregator's structure (the broadcast is one flat vector).
        trained_at_clients = tff.federated_map(select_trained, weights_at_clients)
        info = tff.federated_zip(collections.OrderedDict(
            num_examples=out[2], loss=out[3], model=trained_at_clients))
        aggregated = aggregator.next(aggregator_state, out[0], info)
        first_state = 4
      result = collections.OrderedDict(aggregator_state=aggregated.state, update=aggregated.result,
                                       loss=tff.federated_mean(out[1], weight=out[2]),
                                       measurements=aggregated.measurements)
      if extra:
        result["client_states"] = out[first_state]  # Stay at the clients.
      if ids is not None:  # Uploaded: every client's (id, report), at the server.
        result["reports"] = common.collect(out[first_state + 1], report_spec)
      return result

    @tff.tensorflow.computation(w_type)
    def select_trained(weights):
      return mask.select(common.unflatten_tensors(weights, all_specs))

    server_types = (tff.FederatedType(w_type, tff.SERVER), agg_state_type,
                    tff.FederatedType(common.SEED_TYPE, tff.SERVER))
    data_at_clients = tff.FederatedType(data_type, tff.CLIENTS)
    states_at_clients = tff.FederatedType(state_type, tff.CLIENTS) if state_type else None
    context_at_server = tff.FederatedType(context_type, tff.SERVER) if context_type else None
    ids_at_clients = tff.FederatedType(ids_type, tff.CLIENTS) if ids_type else None
    if state_type is None:
      @tff.federated_computation(*server_types, data_at_clients)
      def run_round(weights, aggregator_state, seed, data):
        return round_body(weights, aggregator_state, seed, data)
    elif context_type is None and ids_type is None:
      @tff.federated_computation(*server_types, data_at_clients, states_at_clients)
      def run_round(weights, aggregator_state, seed, data, states):
        return round_body(weights, aggregator_state, seed, data, states)
    elif ids_type is None:
      @tff.federated_computation(*server_types, data_at_clients, states_at_clients,
                                 context_at_server)
      def run_round(weights, aggregator_state, seed, data, states, context):
        return round_body(weights, aggregator_state, seed, data, states, context)
    elif context_type is None:
      @tff.federated_computation(*server_types, data_at_clients, states_at_clients, ids_at_clients)
      def run_round(weights, aggregator_state, seed, data, states, ids):
        return round_body(weights, aggregator_state, seed, data, states, ids=ids)
    else:
      @tff.federated_computation(*server_types, data_at_clients, states_at_clients,
                                 context_at_server, ids_at_clients)
      def run_round(weights, aggregator_state, seed, data, states, context, ids):
        return round_body(weights, aggregator_state, seed, data, states, context, ids)

    self.client_update = client_update
    self.run_round = run_round
    self.aggregator = aggregator
    self.factory = factory

  def compute_update(self, state: common.ServerState, clients: list[dict],
                     client_states: list | None = None,
                     client_ids: Sequence[int] | None = None) -> dict:
    """The round's aggregated update, mean client loss, aggregator state and measurements (and the
    clients' new states, for a stateful process, and the clients' reports, `reports`: each a NumPy
    array with a leading axis over the round's clients, `client` their ids), before the server
    optimizer step."""
    if not clients:
      raise ValueError("a FedAvg round needs at least one client")
    need = self.config.min_samples
    small = [len(c["ids"]) for c in clients if len(c["ids"]) < need]
    if small:
      what = (f"{self.config.ssl}'s within-client loss" if need == self.config.method.min_samples
              else "batch-statistics heads")
      raise ValueError(f"{what} needs >= {need} images per client; got a client with {small[0]}. "
                       f"Use DCCO for one-image clients")
    seed = common.round_seed(self.config.seed, state.round_num)
    grouped = self.simulation.grouped
    data = grouping.pack(clients, self.simulation.group_size) if grouped else clients
    args = [common.flat_weights(state.weights), state.aggregator_state, seed, data]
    if self.client_state is not None:
      args.append(grouping.pack_states(client_states, self.simulation.group_size) if grouped
                  else client_states)
      if self._context_type is not None:
        args.append(self.client_context(state))
      if self._reports:
        if client_ids is None or len(client_ids) != len(clients):
          raise ValueError("this process's clients report to the server: compute_update() needs "
                           "the clients' ids (one per client)")
        ids = np.asarray(client_ids, np.int64)
        args.append([ids[g:g + len(d["sizes"])] for g, d in
                     zip(np.cumsum([0] + [len(d["sizes"]) for d in data[:-1]]), data)]
                    if grouped else list(ids))
    out = dict(self.run_round(*args))
    if self._flat_upload:
      out["update"] = common.unflatten(np.asarray(out["update"][0]), self.trained_specs)
    if self._reports:
      out["reports"] = {k: np.asarray(v) for k, v in dict(out["reports"]).items()}
    if self.client_state is not None:
      sizes = [len(g["sizes"]) for g in data] if grouped else [1] * len(clients)
      new = out["client_states"]
      out["client_states"] = (grouping.unpack_states(new, sizes) if grouped else list(new))
    return out

  def next(self, state: common.ServerState, clients: list[dict], *,
           client_ids: Sequence[int] | None = None,
           store: client_state_lib.ClientStateStore | None = None):
    """One round: (new server state, metrics). A stateful process reads the sampled clients'
    states (`client_ids`, in the order of `clients`) from `store` and writes their new ones."""
    states = None
    if self.client_state is not None:
      if store is None or client_ids is None or len(client_ids) != len(clients):
        raise ValueError("this process keeps client state: next() needs the clients' ids (one per "
                         "client) and a client_state.ClientStateStore")
      states = store.read(client_ids, state.round_num, self._initial_client_state)
    out = self.compute_update(state, clients, states, client_ids)
    update, method_state, extra_metrics = self.server_stage(state, out)
    new_state, metrics = self.finish_round(state, update, out["loss"], len(clients),
                                           out["aggregator_state"], method_state)
    if states is not None:
      store.write(client_ids, out["client_states"], state.round_num)
    metrics["aggregation"] = out["measurements"]
    if extra_metrics:
      metrics["aggregation"] = collections.OrderedDict(
          list(dict(out["measurements"]).items()) + list(extra_metrics.items()))
    return new_state, metrics

  def client_context(self, state: common.ServerState):
    """What the server broadcasts to the round's clients beside the weights (the client state's
    `context_spec`), from `state` (its `method_state`); a method whose clients need it overrides
    this."""
    raise NotImplementedError(f"{type(self).__name__}: its client state declares a broadcast "
                              f"context; the process must override client_context")

  def server_stage(self, state: common.ServerState, out: dict) -> tuple[list, object, dict]:
    """The server's part between the aggregation and the optimizer step, for methods with server
    state of their own: (the update the optimizer takes, the new method state (None: unchanged),
    measurements to add to the aggregator's). Default: the aggregated update as it is."""
    del state
    return out["update"], None, {}


# Fields FedAvg-style methods read beyond every federated method's (DCCO's update aggregation is its
# N_k-weighted mean, and its clients take full-batch steps).
FIELDS = FEDERATED_FIELDS + ("aggregator", "aggregator_granularity", "scale_normalization",
                             "fedavg_warmup_rounds", "measure_divergence", "local_batch_size",
                             "client_weight_decay")


def process_config(config) -> tuple[FedAvgSSLConfig, aggregators.AggregatorConfig,
                                    grouping.Simulation]:
  """The FedAvg process's typed configs of an `ExperimentConfig` (building them validates them)."""
  common.check_server(config)
  aggregator = aggregators.AggregatorConfig(
      name=config.aggregator, granularity=config.aggregator_granularity,
      scale_normalization=config.scale_normalization,
      fedavg_warmup_rounds=config.fedavg_warmup_rounds,
      measure_divergence=config.measure_divergence)
  aggregator.check_options()
  return (FedAvgSSLConfig(
      ssl=config.ssl, cco_lambda=config.cco_lambda, temperature=config.temperature,
      target_decay=config.target_decay, moco_queue=config.moco_queue,
      client_optimizer=config.client_optimizer,
      client_learning_rate=config.client_learning_rate,
      client_weight_decay=config.client_weight_decay, local_steps=config.local_steps,
      local_batch_size=config.local_batch_size, augment=config.augment_config(), seed=config.seed,
      head_norm=config.head_norm),
          aggregator, grouping.Simulation(mode=config.simulation, group_size=config.group_size))


def build(config, model: FunctionalModel, image_shape: Sequence[int]) -> FedAvgSSLProcess:
  fedavg_config, aggregator, simulation = process_config(config)
  return FedAvgSSLProcess(model, image_shape, common.server_optimizer_for(config, model.names),
                          fedavg_config, aggregator.build(model), simulation)


def divergence_hint(config) -> str:
  """What to try when a FedAvg-style run's loss became NaN or infinite."""
  hint = f"lower --server_learning_rate (now {config.server_learning_rate})"
  if config.aggregator in aggregators.DIVERGENCE_AWARE and not config.fedavg_warmup_rounds:
    # Scaling scale-invariant (weight-standardized) layers by cosines < 1 shrinks them round after
    # round, which raises the clients' effective step size (README: the mini L-DAWA table).
    hint = (f"{config.aggregator} shrinks layers whose cosine to the global model is low: start "
            f"with FedAvg rounds (--fedavg_warmup_rounds=2, the authors' code) or {hint}")
  return hint


METHOD = Method(
    name="fedavg", kind="federated", fields=FIELDS, ssl=tuple(ssl_lib.SSL_METHODS),
    validate=process_config, build=build,
    min_samples=lambda config: ssl_lib.get(config.ssl).min_samples,
    divergence_hint=divergence_hint,
    summary="FedAvg with a within-client SSL loss (--ssl) and any aggregation strategy "
            "(--aggregator).")
