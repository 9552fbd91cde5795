"""A client's work in a round: its config, the SSL loss of one local step, and local training; plus the
plug-in (`ClientTerm`) by which a method adds to it without editing it.

    local_training(model, cfg, weights, seed, data, mask, carried)
      for each local step (E epochs of the client's images, full batch or batches of B):
        views v1, v2 of the batch, keyed by (seed, step, ids) (`step_views` False: by (seed, ids),
          the same views at every step)
        with every term's scope (e.g. depth dropout: skipped blocks):
          outputs = the model's projections (and predictions, encoder features) of both views
          loss    = the SSL method's loss (none where `ssl` is "") + each term's loss
        one client optimizer step on the trained tensors (`mask`)
        carried = the SSL method's next state (EMA target, queue) and each term's `after_step`
      -> (Delta_k, first-step loss, mean loss, what was carried to the end)

`carried` is a dict: the SSL method's entries ("target", "queue": `initial_ssl_state`) and one entry
per term that carries state, under the term's `key`. A client state (`client_state.ClientState.
ssl_state`) may bring any of them at the start (FedBYOL's own target, FedFoA's bank); a term's entry
is present only where its state was brought or `ClientTerm.initial` gives one.

A `ClientTerm` is one object in its method's module (FedFoA's feature-correlation term, LW-FedSSL's
representation alignment, FLL's depth dropout): what it carries, the term it adds to the loss, how a
step updates what it carries, and the scope of a step's forward passes. A process that needs more (a
broadcast context, a report to the server) declares it in its `ClientState` and reads the term's entry.
Nothing here names a method's term.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tff_ssl import losses
from tff_ssl import ssl as ssl_lib
from tff_ssl.config_fields import Field
from tff_ssl.data.augment import AugmentConfig
from tff_ssl.federated import common, grouping
from tff_ssl.federated import local_steps
from tff_ssl.federated import masks
from tff_ssl.federated.ssl_model import HEAD_NORM
from tff_ssl.federated.functional import FunctionalModel

DEFAULT_TARGET_DECAY = ssl_lib.byol.DEFAULT_TARGET_DECAY

# `ClientConfig.ssl` "": the client has no SSL loss of its own, its terms' losses are its loss (DCCO's
# statistics term, whose loss reads the round's broadcast aggregate).
TERMS_ONLY = ssl_lib.SSLMethod(name="", loss=lambda outputs, hparams: None, per_client_loss=None,
                               min_samples=1)

# The fields of a client's batches and decay (their one check; `common` has the local training's).
LOCAL_BATCH_SIZE = Field("local_batch_size", 0, "FedAvg-style: client batch size (0: the client's "
                         "whole data as one batch; 1 is refused: the SSL losses compare images "
                         "within a batch).", lower=0)
LOCAL_UNITS = ("epochs", "steps")
LOCAL_UNIT = Field("local_unit", "epochs", "FedAvg-style with --local_batch_size: what "
                   "--local_steps counts: epochs (floor(N_k / B) steps each, so a client's local "
                   "work grows with its size, as in the papers) or steps (every client takes "
                   "--local_steps steps a round, its data reshuffled at each pass).",
                   choices=LOCAL_UNITS)
CLIENT_WEIGHT_DECAY = Field("client_weight_decay", 0.0, "FedAvg-style: client weight decay (L2 on "
                            "the gradients with sgd/sgdm, decoupled with adamw).", lower=0)


class Upload(NamedTuple):
  """What a client uploads anyway, which a term's report may read: Delta_k of the trained tensors
  (relative to the broadcast model) and N_k."""

  update: list
  num_examples: Any


@dataclasses.dataclass(frozen=True)
class Step:
  """What a client term sees of one local step: the model, its outputs on the step's views, the
  weights the client's training started from (`start`, all tensors: the broadcast model's, or where
  the client's state began it, e.g. FedEMA's mix of its own and the global), the weights being
  trained (`current`, all tensors) and the two views; the round's global model (`broadcast`, all
  tensors; None: `start`, which it is for a stateless client); and, for a term that draws
  images of its own (FedX's anchors), the client's images (`data`: {"images", "ids"}, all it holds,
  not only the step's batch), the step's seed and the views' augmentation (None where the caller
  trains on no client's data: `tff_ssl.cost`'s one step)."""

  model: FunctionalModel
  outputs: ssl_lib.Outputs
  start: list
  current: list
  v1: Any
  v2: Any
  data: Any = None
  seed: Any = None
  augment: AugmentConfig | None = None
  broadcast: list | None = None

  @property
  def global_weights(self) -> list:
    """The round's global model (all tensors): `broadcast`, else `start`."""
    return self.start if self.broadcast is None else self.broadcast


class ClientTerm:
  """A plug-in to a client's local training (module docstring). Subclasses override what they use.

  key: its entry in what local training carries, in a step's record and in the client's report.
  features: its loss reads the encoder's features (`ssl_lib.Outputs.h1, h2`): the model must output
    them last (`ssl_model.ssl_model_builder(..., features=True)`).
  predictions: its loss reads the predictor's outputs (`ssl_lib.Outputs.p1, p2`): the model must
    have a predictor head even where the SSL method has none (`Method.predictor`).

  Client side (TensorFlow, inside the client's computation): `initial`, `scope`, `loss`,
  `after_step`, `report`. Server side (NumPy): `measurements` of the round's reports.
  """

  key: str = ""
  features: bool = False
  predictions: bool = False

  @property
  def stateful(self) -> bool:
    """Whether the term acts only where its entry is carried (brought by the client state or given
    by `initial`): its `loss`, `after_step` and `report` then read it."""
    return False

  def initial(self, model: FunctionalModel) -> Any:
    """What the term carries from the start of local training when the client state brings nothing
    for it (nested tensors); None: nothing."""
    del model
    return None

  def scope(self, step_seed) -> contextlib.AbstractContextManager:
    """The context of one local step's forward passes (default: none)."""
    del step_seed
    return contextlib.nullcontext()

  def loss(self, step: Step, carried) -> tuple[tf.Tensor | None, Any]:
    """(The term added to the step's loss, None for none; what the step records for `after_step`)."""
    del step, carried
    return None, None

  def after_step(self, carried, step: Step, record) -> Any:
    """What the term carries after the step, given the loss's `record` (default: as it was)."""
    del step, record
    return carried

  def report_spec(self, model: FunctionalModel) -> Any:
    """The structure (nested `tf.TensorSpec`s) of what each client uploads for this term beside its
    update; None (default): nothing. The process then collects every client's report at the server
    (under `key`, with the clients' ids)."""
    del model
    return None

  def report(self, carried, upload: "Upload") -> Any:
    """This client's upload (`report_spec`), from what the term carried to the end of training
    (None where it carries nothing) and the client's `Upload` (its update and N_k)."""
    raise NotImplementedError(f"{type(self).__name__} declares a report_spec; define report()")

  def measurements(self, reports) -> dict:
    """On the server: what the round's reports (NumPy, a leading axis over its clients) add to the
    round's measurements (aggregation.csv); default none."""
    del reports
    return {}

  def skipped_blocks(self) -> tuple[tuple[bool, ...], float] | None:
    """Where the term makes a step skip blocks of the model at random: (the blocks' keep flags when
    all are skipped, the probability that each is skipped); None (default): it skips nothing. A
    step's expected cost is then linear between the two (`bin/benchmark --layerwise`)."""
    return None


@dataclasses.dataclass(frozen=True)
class ClientConfig:
  """The clients' side of a FedAvg-style round.

  local_steps: local epochs; with local_batch_size = 0 (the whole client as one batch) an epoch is
    one step. With local_batch_size = B > 0 an epoch is floor(N_k / B) steps over a fresh shuffle
    (a last partial batch is dropped, as SSL training loaders do, unless it is the client's only one).
  local_unit: "epochs" (above), or "steps": with local_batch_size = B > 0, every client takes
    `local_steps` steps whatever its size, over passes of floor(N_k / B) batches, each pass a fresh
    shuffle (the same batches as epochs would take, cut at `local_steps`).
  client_weight_decay: weight decay of the client optimizer: coupled L2 on the gradients with SGD
    (the L-DAWA paper: 1e-4), decoupled with AdamW (LW-FedSSL: 1e-5).
  terms: the method's `ClientTerm`s, in the order their losses are added.
  head_norm: the model's heads' normalization ("group", or "batch": statistics of the client's own
    batch, so a client needs >= 2 images and the grouped simulation runs each real client's forward
    pass on its own, never several clients' images in one batch).
  lr_schedule, warmup_fraction, rounds: the clients' learning rate over the run's `rounds` rounds
    (`schedule`, a `local_steps.ClientSchedule`); a client reads its round from the round's seed.
  ssl: an SSL method (`tff_ssl.ssl`), or "" for none: the terms' losses alone (`TERMS_ONLY`).
  step_views: new views at each local step (full batch); False: the round's views at every step
    (DCCO's, whose aggregate statistics are over the round's views).
  view_pairs: augmentation multiplicity (DP's `--dp_augmentations`): a step's loss is the mean of
    the losses of this many view pairs of its batch (copy j of image i keyed as id i * M + j), so
    its gradient is the mean of the pairs' gradients. Not with a queue or client terms (what they
    carry or report from a step would be one pair's).
  """

  ssl: str = "cco"
  hparams: ssl_lib.Hparams = ssl_lib.Hparams()  # The SSL method's (cco_lambda, temperature, ...).
  client_optimizer: str = "sgd"
  client_learning_rate: float = 1.0
  client_weight_decay: float = 0.0
  local_steps: int = 1
  local_batch_size: int = 0
  local_unit: str = "epochs"
  augment: AugmentConfig = AugmentConfig.dcco_cifar()
  seed: int = 0
  terms: tuple[ClientTerm, ...] = ()
  head_norm: str = "group"
  lr_schedule: str = "constant"
  warmup_fraction: float = 0.0
  rounds: int = 1
  step_views: bool = True
  view_pairs: int = 1

  def __post_init__(self):
    self.schedule  # pylint: disable=pointless-statement (checks the schedule's fields)
    if not self.ssl and not self.terms:
      raise ValueError("a client without an SSL method (ssl '') trains on its terms' losses; "
                       "give it at least one term")
    self.method  # pylint: disable=pointless-statement (checks the SSL method's name)
    HEAD_NORM.check(self.head_norm)
    local_steps.check_client_training(self.local_steps, self.client_optimizer,
                                 self.client_learning_rate)
    LOCAL_BATCH_SIZE.check(self.local_batch_size)
    LOCAL_UNIT.check(self.local_unit)
    if self.local_batch_size == 1:
      raise ValueError("local_batch_size must be 0 (full batch) or >= 2; got 1")
    if self.local_batch_size and not self.step_views:
      raise ValueError("the round's views at every step (step_views False) are full-batch "
                       "training's; local_batch_size must be 0")
    CLIENT_WEIGHT_DECAY.check(self.client_weight_decay)
    if self.view_pairs < 1 or (self.view_pairs > 1 and (self.method.queue or self.terms)):
      raise ValueError(f"view pairs ({self.view_pairs}) must be >= 1, and 1 with a queue of keys "
                       f"or client terms ({[t.key for t in self.terms]}): what they carry or "
                       f"report from a step is one view pair's")
    keys = [t.key for t in self.terms]
    if len(set(keys)) != len(keys) or not all(keys) or set(keys) & {"target", "queue"}:
      raise ValueError(f"client terms need distinct keys other than the SSL method's "
                       f"('target', 'queue'); got {keys}")

  @property
  def method(self) -> ssl_lib.SSLMethod:
    return ssl_lib.get(self.ssl) if self.ssl else TERMS_ONLY

  @property
  def schedule(self) -> local_steps.ClientSchedule:
    """The clients' learning rate at each round and local step."""
    return local_steps.ClientSchedule(self.client_learning_rate, self.lr_schedule, self.rounds,
                                 self.warmup_fraction)

  @property
  def min_samples(self) -> int:
    """Fewest images a client can train on: the loss's, and 2 for batch statistics."""
    return max(self.method.min_samples, 2 if self.head_norm == "batch" else 1)

  @property
  def predictions(self) -> bool:
    """Whether the model's second output is a predictor's (the SSL method's, or a term's)."""
    return self.method.predictor or any(t.predictions for t in self.terms)

  @property
  def needs_features(self) -> bool:
    """Whether a term reads the encoder's features (the model's last output)."""
    return any(t.features for t in self.terms)

  def with_terms(self, *terms: ClientTerm) -> "ClientConfig":
    """This config with `terms` added after its own."""
    return dataclasses.replace(self, terms=self.terms + tuple(terms))

  def without(self, term_type: type) -> "ClientConfig":
    """This config without its terms of `term_type` (e.g. the server's calibration, which trains
    with the SSL loss alone)."""
    return dataclasses.replace(self, terms=tuple(t for t in self.terms
                                                 if not isinstance(t, term_type)))


def view_outputs(model: FunctionalModel, method: ssl_lib.SSLMethod, weights, target, v1, v2,
                 queue=None, predictions: bool | None = None) -> ssl_lib.Outputs:
  """The SSL method's view outputs; `target` None: the online projections stand in (first step).
  `predictions`: the model's second output is a predictor's (default: where the SSL method has one;
  `ClientConfig.predictions`). A model with one output more than its heads
  (`ssl_model_builder(..., features=True)`) gives the encoder's features too (h1, h2)."""
  outs = common.encode_outputs(model, weights, v1, v2)
  predictions = method.predictor if predictions is None else predictions
  heads = 1 + int(predictions)
  (z1, z2), (p1, p2) = outs[0], (outs[1] if predictions else (None, None))
  h1, h2 = outs[heads] if len(outs) > heads else (None, None)
  t1 = t2 = None
  if method.ema_target:
    t1, t2 = (z1, z2) if target is None else common.encode_outputs(model, target, v1, v2)[0]
  return ssl_lib.Outputs(z1, z2, p1, p2, t1, t2, queue, h1, h2)


def _acting(cfg: ClientConfig, carried: dict | None):
  """The terms that act in this training: those that carry nothing, and the stateful ones whose
  entry is carried."""
  return [t for t in cfg.terms if not t.stateful or (carried and t.key in carried)]


def step_scope(cfg: ClientConfig, step_seed, carried: dict | None = None):
  """The context of one local step's forward passes: every acting term's scope."""
  acting = _acting(cfg, carried)
  if not acting:
    return contextlib.nullcontext()
  stack = contextlib.ExitStack()
  for t in acting:
    stack.enter_context(t.scope(step_seed))
  return stack


def client_loss(cfg: ClientConfig, step: Step, carried: dict | None = None,
                record: dict | None = None) -> tf.Tensor:
  """The client's loss of one step: the SSL method's, plus each acting term's (`ClientTerm.loss`),
  whose records go to `record[term.key]`."""
  loss = cfg.method.loss(step.outputs, cfg.hparams)
  for t in _acting(cfg, carried):
    value, rec = t.loss(step, (carried or {}).get(t.key))
    if record is not None:
      record[t.key] = rec
    if value is not None:
      loss = value if loss is None else loss + value
  if loss is None:
    raise ValueError("the client's step has no loss: no SSL method and no acting term")
  return loss


def _ema(target, current, decay: float):
  return [decay * t + (1.0 - decay) * c for t, c in zip(target, current)]


def initial_ssl_state(model: FunctionalModel, cfg: ClientConfig) -> dict:
  """What local training carries across steps when the client brings nothing of its own:
  {"target": None} (= the start weights) for a target network, {"queue": zeros} for a queue of
  negative keys, and each term's `initial` where it gives one; {} for none."""
  method, out = cfg.method, {}
  if method.ema_target:
    out["target"] = None
  if method.queue:
    out["queue"] = tf.zeros([cfg.hparams.moco_queue, model.output_dims[0]])
  for t in cfg.terms:
    value = t.initial(model)
    if value is not None:
      out[t.key] = value
  return out


def _next_ssl_state(cfg: ClientConfig, carried: dict, step: Step, new, record: dict) -> dict:
  """What is carried after `step` moved the online weights to `new` (all tensors); `record`: what
  the step's loss recorded (`client_loss`)."""
  out = dict(carried)
  if "target" in out:
    out["target"] = _ema(list(step.start) if out["target"] is None else out["target"], new,
                         cfg.hparams.target_decay)
  if "queue" in out:
    out["queue"] = ssl_lib.moco.enqueue(out["queue"], step.outputs.t2)
  for t in cfg.terms:
    if t.key in out:
      out[t.key] = t.after_step(out[t.key], step, record.get(t.key))
  return out


def view_pairs(batch, m: int) -> list:
  """The batch once per view pair (`ClientConfig.view_pairs`): copy j keys image i as i * m + j, so
  each pair's views are its own; m = 1: the batch itself."""
  if m == 1:
    return [batch]
  images, ids = grouping.field(batch, "images"), grouping.field(batch, "ids")
  return [{"images": images, "ids": ids * m + j} for j in range(m)]


def _mean(values: list):
  return values[0] if len(values) == 1 else tf.add_n(values) / len(values)


def _full_batch_training(model, cfg: ClientConfig, weights, seed, data, mask, carried, round_num,
                         broadcast):
  """E full-batch steps on the client's images (new views at each step)."""
  method, schedule = cfg.method, cfg.schedule
  learning_rate = (cfg.client_learning_rate if schedule.constant else
                   lambda step: schedule.rate(round_num, float(step), float(cfg.local_steps)))
  state = [carried, None, {}]  # What is carried; the last step and its record.

  def loss_of(current, step):
    step_seed = seed if step == 0 else tf.random.experimental.stateless_fold_in(seed, step)
    losses_ = []
    with step_scope(cfg, step_seed, state[0]):
      for pair in view_pairs(data, cfg.view_pairs):
        v1, v2 = common.views(pair, step_seed if cfg.step_views else seed, cfg.augment)
        outputs = view_outputs(model, method, current, state[0].get("target"), v1, v2,
                               state[0].get("queue"), cfg.predictions)
        state[1] = Step(model, outputs, list(weights), list(current), v1, v2, data, step_seed,
                        cfg.augment, broadcast)
        losses_.append(client_loss(cfg, state[1], state[0], state[2]))
      return _mean(losses_)

  def after_step(new):
    state[0] = _next_ssl_state(cfg, state[0], state[1], new, state[2])

  delta, first, mean = local_steps.train(weights, cfg.local_steps, cfg.client_optimizer,
                                             learning_rate, loss_of, after_step,
                                             cfg.client_weight_decay, mask)
  return delta, first, mean, state[0]


def _minibatch_training(model, cfg: ClientConfig, weights, seed, data, mask, carried, round_num,
                        broadcast):
  """E epochs of steps on batches of `local_batch_size`, each epoch over a seeded shuffle.

  A `tf.while_loop` (the number of steps depends on N_k) built in a `tf.function`, so the TF1 graph
  of a TFF computation keeps no per-iteration intermediates.
  """
  method, schedule = cfg.method, cfg.schedule
  opt = local_steps.client_optimizer(cfg.client_optimizer, cfg.client_learning_rate,
                                cfg.client_weight_decay)
  specs = tuple(tf.TensorSpec(w.shape, w.dtype) for w in mask.select(weights))
  # A loop variable cannot be None: the target starts as the start weights.
  carried = {k: (list(weights) if k == "target" and v is None else v)
             for k, v in carried.items()}

  @tf.function(autograph=False)  # The loop is explicit; autograph only re-parses the body.
  def train(weights, carried, images, ids, seed, round_num, broadcast):
    n = tf.shape(ids)[0]
    batch = tf.minimum(cfg.local_batch_size, n)
    per_epoch = tf.maximum(1, n // batch)
    total = cfg.local_steps if cfg.local_unit == "steps" else cfg.local_steps * per_epoch
    shuffle_seed = tf.random.experimental.stateless_fold_in(seed, 1 << 30)  # Apart from views'.

    def body(step, current, carried, opt_state, first, loss_sum):
      epoch, b = step // per_epoch, step % per_epoch
      order = tf.argsort(tf.random.stateless_uniform(
          [n], tf.random.experimental.stateless_fold_in(shuffle_seed, epoch)))
      idx = order[b * batch:(b + 1) * batch]
      client = {"images": tf.gather(images, idx), "ids": tf.gather(ids, idx)}
      step_seed = tf.random.experimental.stateless_fold_in(seed, step)
      pairs = [common.views(pair, step_seed, cfg.augment)
               for pair in view_pairs(client, cfg.view_pairs)]
      done, record = [None], {}

      def loss_of(trained):
        losses_ = []
        with step_scope(cfg, step_seed, carried):
          merged = mask.merge(trained, weights)
          for v1, v2 in pairs:
            outputs = view_outputs(model, method, merged, carried.get("target"), v1, v2,
                                   carried.get("queue"), cfg.predictions)
            done[0] = Step(model, outputs, list(weights), merged, v1, v2,
                           {"images": images, "ids": ids}, step_seed, cfg.augment, broadcast)
            losses_.append(client_loss(cfg, done[0], carried, record))
          return _mean(losses_)

      if not schedule.constant:
        opt_state = local_steps.with_learning_rate(opt, opt_state, schedule.rate(
            round_num, tf.cast(step, tf.float32), tf.cast(total, tf.float32)))
      opt_state, new, loss = local_steps.client_step(
          opt, opt_state, current, loss_of,
          local_steps.coupled_weight_decay(cfg.client_optimizer, cfg.client_weight_decay))
      carried = _next_ssl_state(cfg, carried, done[0], mask.merge(new, weights), record)
      first = tf.where(tf.equal(step, 0), loss, first)  # (`==` is identity in TFF's graphs.)
      return step + 1, new, carried, opt_state, first, loss_sum + loss

    current = mask.select(weights)
    _, trained, carried, _, first, loss_sum = tf.while_loop(
        lambda step, *_: step < total, body,
        (tf.constant(0), current, carried, opt.initialize(specs), tf.constant(0.0),
         tf.constant(0.0)), parallel_iterations=1)
    return ([a - b for a, b in zip(current, trained)], first,
            loss_sum / tf.cast(total, tf.float32), carried)

  return train(list(weights), carried, grouping.field(data, "images"),
               grouping.field(data, "ids"), seed, round_num,
               None if broadcast is None else list(broadcast))


def local_training(model: FunctionalModel, cfg: ClientConfig, weights, seed, data,
                   mask: masks.TensorMask | None = None, carried: dict | None = None,
                   round_num=None, broadcast=None):
  """A client's local training on its own images, of the tensors of `mask` (default: all), from
  `weights`.

  `carried`: what local training carries across steps at the start (module docstring: "target", the
  EMA target network (all the model's tensors; None: the start weights), "queue", MoCo's negative
  keys, and the terms' entries); None: `initial_ssl_state` (FedAvg-style clients, which keep nothing
  between rounds).

  `round_num`: the round, for the learning-rate schedule (None: the round of `seed`, a round's seed,
  `common.round_seed`). `broadcast`: the round's global model where the client's state starts it
  elsewhere (a term reads it as `Step.global_weights`); None: `weights` are the global model.

  Returns (Delta_k of the trained tensors, first-step loss, mean loss, what was carried to the end of
  the last step).
  """
  mask = mask or masks.TensorMask.of_model(model)
  carried = initial_ssl_state(model, cfg) if carried is None else carried
  round_num = common.round_of(seed) if round_num is None else tf.cast(round_num, tf.float32)
  if cfg.local_batch_size:
    return _minibatch_training(model, cfg, weights, seed, data, mask, carried, round_num,
                               broadcast)
  return _full_batch_training(model, cfg, weights, seed, data, mask, carried, round_num,
                              broadcast)


def schedule_measurements(cfg: ClientConfig, round_num: int) -> dict:
  """What a round records of the clients' learning-rate schedule (aggregation.csv): the rate of its
  first local step, `client_learning_rate`, where the rate is scheduled; nothing where constant."""
  if cfg.schedule.constant:
    return {}
  return {"client_learning_rate": np.float32(cfg.schedule.rate(round_num, 0.0, 1.0))}


def reporting_terms(cfg: ClientConfig, model: FunctionalModel) -> list[ClientTerm]:
  """The terms of `cfg` whose clients report to the server (`ClientTerm.report_spec`)."""
  return [t for t in cfg.terms if t.report_spec(model) is not None]


def client_round(model: FunctionalModel, cfg: ClientConfig, client_state, weights, seed, client,
                 state=None, context=None, client_id=None, mask: masks.TensorMask | None = None):
  """One real client's round: local training from the broadcast `weights`, or, with a
  `client_state.ClientState`, from where its `state` begins (None `weights`: the client's own model
  alone, as heterogeneous clients), with what the state brings carried.

  Returns (Delta_k of the trained tensors relative to the broadcast weights, first-step loss, mean
  loss, N_k, the client's new state (None for a stateless client), its report (None unless a term
  reports: then {"client": `client_id`, term key: the term's report})).
  """
  mask = mask or masks.TensorMask.of_model(model)
  n = common.num_examples(client)
  if client_state is None:
    delta, first_loss, mean_loss, carried = local_training(model, cfg, weights, seed, client, mask)
    return (delta, first_loss, mean_loss, n, None,
            _report(cfg, model, carried, client_id, Upload(delta, n)))
  start = client_state.begin(state, None if weights is None else list(weights), context)
  carried = dict(initial_ssl_state(model, cfg),
                 **(client_state.ssl_state(state, start, context, client_id) or {}))
  delta, first_loss, mean_loss, carried = local_training(model, cfg, start, seed, client, mask,
                                                         carried, broadcast=weights)
  if weights is None:
    broadcast, upload = start, delta
  else:  # Delta_k relative to the broadcast model, whatever the client started from.
    broadcast = list(weights)
    upload = [g - s + d for g, s, d in zip(mask.select(weights), mask.select(start), delta)]
  new_state = client_state.end(state, mask.select(broadcast), upload, n, mean_loss, carried,
                               context)
  return (upload, first_loss, mean_loss, n, new_state,
          _report(cfg, model, carried, client_id, Upload(upload, n)))


def _report(cfg: ClientConfig, model: FunctionalModel, carried: dict, client_id, upload: Upload):
  terms = reporting_terms(cfg, model)
  if not terms:
    return None
  return collections.OrderedDict(
      [("client", client_id)] + [(t.key, t.report(carried.get(t.key), upload)) for t in terms])
