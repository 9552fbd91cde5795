"""Layer-wise and progressive federated SSL over a ViT's blocks (LW-FedSSL, Ye et al.): training runs in
L stages of R / L rounds, L = the encoder's number of blocks; stage s is a FedAvg-style process over an
encoder of s blocks.

  layerwise    (FedMoCo-LW) stage s trains and exchanges block s and the heads; blocks < s are frozen
               (the patch embedding and class token belong to block 1)
  progressive  (Prog-FedSSL) stage s trains and exchanges blocks 1..s and the heads

Options on top of a schedule (LayerwiseConfig):

  calibration    (LW-FedSSL) after each round's aggregation the server trains the stage's whole model
                 (blocks 1..s and the heads) end to end with the clients' SSL loss and local-training
                 settings on its auxiliary images (`auxiliary_fraction` of the training images, which
                 no client holds; `runner.auxiliary_split`); the clients get the calibrated model
  alignment      (LW-FedSSL) the clients' loss adds beta * InfoNCE between the local encoder's and the
                 broadcast encoder's features (the client term `alignment.RepresentationAlignment`,
                 beta = `alignment_weight`)
  depth_dropout  (FLL + DD) at each local step each frozen block (< s) is skipped with probability
                 `depth_dropout` (the client term `depth_dropout.DepthDropout`)

In every schedule the encoder's final LayerNorm, which follows the newest block, is trained with the heads. With
weight transfer (the paper's default) block s starts from block s - 1's weights at the first round of
stage s. The server keeps the whole L-block model; a stage's process sees only the tensors of its s
blocks and the heads (`stage_model`), the mask of the trained ones, and uploads those only.

The stage is a function of the round (`stage_of`), so a run resumed from a checkpoint inside stage s
resumes inside stage s; the weight transfer is recomputed from the saved state, the same each time.
The server takes the stage's aggregate as the new value of the trained tensors (server SGD, learning
rate `server_learning_rate`, 1 in the paper); a server optimizer with state of its own would need a
state per stage, so the layer-wise methods take `--server_optimizer=sgd`.
"""

from __future__ import annotations

import collections
import dataclasses
import re

import numpy as np
import tensorflow as tf

from tff_ssl import optim
from tff_ssl.federated import client_work, common, ssl_model
from tff_ssl.federated import fedavg_process, masks
from tff_ssl.methods import addons, alignment, depth_dropout, fedavg
from tff_ssl.federated.client_work import ClientConfig, local_training
from tff_ssl.federated.server_step import ServerState
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.federated.process import BuildContext, GlobalModel
from tff_ssl.method import Method
from tff_ssl.config_fields import Field

SCHEDULES = ("layerwise", "progressive")
CALIBRATION_KEY = 0xCA11B  # Folded into the round's seed: the calibration's views and shuffles.
_BLOCK = re.compile(r"^encoder/block(\d+)_")
_FIRST_BLOCK = ("encoder/patch_embed/", "encoder/tokens/")  # Trained with block 1.


@dataclasses.dataclass(frozen=True)
class LayerwiseConfig:
  schedule: str = "layerwise"
  weight_transfer: bool = True
  calibration: bool = False
  alignment: bool = False
  depth_dropout: bool = False

  def __post_init__(self):
    if self.schedule not in SCHEDULES:
      raise ValueError(f"unknown schedule {self.schedule!r}; choose one of {list(SCHEDULES)}")
    if self.depth_dropout and self.schedule != "layerwise":
      raise ValueError("depth dropout skips frozen blocks: it needs the layerwise schedule")


def rounds_per_stage(rounds: int, depth: int) -> int:
  if rounds < depth:
    raise ValueError(f"layer-wise training runs one stage per block: rounds ({rounds}) must be >= "
                     f"the encoder's blocks ({depth})")
  return rounds // depth


def stage_of(round_num: int, rounds: int, depth: int) -> int:
  """The stage (1..depth) of round `round_num` (0-based); the last stage takes the rounds that
  R / L leaves over."""
  return min(round_num // rounds_per_stage(rounds, depth) + 1, depth)


def block_of(name: str) -> int:
  """The ViT block a weight belongs to (1 for the patch embedding and class token); 0 for the heads
  and the final LayerNorm."""
  m = _BLOCK.match(name)
  if m:
    return int(m.group(1))
  return 1 if name.startswith(_FIRST_BLOCK) else 0


def trained(name: str, stage: int, schedule: str) -> bool:
  """Whether stage `stage` of `schedule` trains the tensor `name` (of the stage's model)."""
  b = block_of(name)
  return b == 0 or (b == stage if schedule == "layerwise" else b <= stage)


class LayerwiseProcess(GlobalModel):
  """The staged process (module docstring): a `process.FederatedProcess` over the whole L-block
  model."""

  def __init__(self, config, model: FunctionalModel, image_shape, layerwise: LayerwiseConfig,
               stage_builder, auxiliary: dict | None = None):
    """`model`: the whole L-block model (the server's); `stage_builder(s)`: the Keras builder of the
    model with s blocks (built here once per stage, in order, so that initialization draws the same
    random numbers in every run; their initial values are not used: stages take the server's); with
    alignment it must output the encoder's features last. `auxiliary`: the server's images
    ({"images", "ids"}) for calibration (None: a process that does not train)."""
    self.model, self.layerwise, self.image_shape = model, layerwise, image_shape
    self.auxiliary = auxiliary
    self.needs_auxiliary = layerwise.calibration
    self.depth = max([block_of(n) for n in model.names] + [0])
    if not self.depth:
      raise ValueError("layer-wise training needs an encoder of numbered blocks (--encoder=vit_tiny "
                       "or vit_mini)")
    self.rounds = config.rounds
    rounds_per_stage(self.rounds, self.depth)
    self.fedavg_config, self.aggregator, self.simulation, _ = config.parsed  # No add-on stages.
    if layerwise.alignment:
      self.fedavg_config = self.fedavg_config.with_terms(*alignment.terms(config))
    self.depth_dropout = config.depth_dropout if layerwise.depth_dropout else 0.0
    self.learning_rate = config.server_learning_rate
    self._index = {n: i for i, n in enumerate(model.names)}
    self.stage_models = [FunctionalModel(stage_builder(s)) for s in range(1, self.depth + 1)]
    for m in self.stage_models:
      missing = [n for n in m.names if n not in self._index]
      if missing:
        raise ValueError(f"the stage model's tensor {missing[0]!r} is not in the whole model")
    self._processes, self._calibrators = {}, {}

  def stage(self, round_num: int) -> int:
    return stage_of(round_num, self.rounds, self.depth)

  def stage_mask(self, stage: int) -> masks.TensorMask:
    model = self.stage_models[stage - 1]
    frozen = {n for n, f in zip(model.names, model.frozen) if f}
    return masks.TensorMask.from_names(
        model.names, lambda n: trained(n, stage, self.layerwise.schedule) and n not in frozen)

  def process(self, stage: int) -> fedavg_process.FedAvgSSLProcess:
    """Stage `stage`'s FedAvg-style process (built at its first use)."""
    if stage not in self._processes:
      model, mask = self.stage_models[stage - 1], self.stage_mask(stage)
      sgd = optim.make_tff_optimizer("sgd", "server", self.learning_rate)
      self._processes[stage] = fedavg_process.FedAvgSSLProcess(
          model, self.image_shape, sgd, self.stage_config(stage), self.aggregator.build(model, mask),
          self.simulation, mask=mask)
    return self._processes[stage]

  def stage_config(self, stage: int) -> ClientConfig:
    """The clients' side of stage `stage`'s rounds (with depth dropout: over its s - 1 frozen
    blocks)."""
    return self.fedavg_config.with_terms(*depth_dropout.terms(self.depth_dropout, stage - 1))

  def local_step_parts(self, stage: int):
    """(Model, trained-tensor mask, client config, whether the clients download the frozen tensors
    each round) of a local step in stage `stage` (`bin/benchmark --layerwise`)."""
    return (self.stage_models[stage - 1], self.stage_mask(stage), self.stage_config(stage),
            self.refreshes_frozen)

  @property
  def refreshes_frozen(self) -> bool:
    """Whether the server changes the frozen blocks during a stage (calibration): then even a client
    that took part in every round downloads the whole stage model each round, not only the trained
    tensors (what FedMoCo-LW's clients need, the paper's best case)."""
    return self.layerwise.calibration

  def calibrator(self, stage: int):
    """Stage `stage`'s server-side calibration (LW-FedSSL): (the stage model's weights, the round's
    seed, the auxiliary images and ids) -> (the weights after the clients' local training recipe,
    every tensor trained but the frozen ones, on the auxiliary images with the SSL loss alone; its
    mean loss).

    Its optimizer is the clients' (`ClientConfig.schedule`): restarted each round, and with
    `client_lr_schedule=warmup_cosine` its step s of S (S = local_steps x floor(auxiliary images /
    local_batch_size), or local_steps with `local_unit=steps`) in round r takes the rate at progress
    (r + s / S) / rounds, as a client's step s of its own S_k: the calibration runs the same part of the schedule as the round's clients, in
    its own number of steps."""
    if stage not in self._calibrators:
      model = self.stage_models[stage - 1]
      cfg = self.fedavg_config.without(alignment.RepresentationAlignment)

      @tf.function(autograph=False)
      def calibrate(weights, seed, images, ids):
        round_num = common.round_of(seed)  # The schedule's round (before the seed is folded).
        seed = tf.random.experimental.stateless_fold_in(seed, CALIBRATION_KEY)
        mask = masks.TensorMask.of_model(model)
        delta, _, mean_loss, _ = local_training(model, cfg, weights, seed,
                                                {"images": images, "ids": ids}, mask=mask,
                                                round_num=round_num)
        return mask.merge([w - d for w, d in zip(mask.select(weights), delta)], weights), mean_loss
      self._calibrators[stage] = calibrate
    return self._calibrators[stage]

  def initialize(self) -> ServerState:
    return ServerState(weights=[w.copy() for w in self.model.initial_weights], optimizer_state=(),
                       aggregator_state=(), round_num=0)

  def start_weights(self, state: ServerState) -> list[np.ndarray]:
    """The whole model at the start of round `state.round_num`: with weight transfer, the first
    round of stage s > 1 starts block s from block s - 1."""
    weights = [np.asarray(w) for w in state.weights]
    s = self.stage(state.round_num)
    first = state.round_num == (s - 1) * rounds_per_stage(self.rounds, self.depth)
    if self.layerwise.weight_transfer and s > 1 and first:
      for i, name in enumerate(self.model.names):
        if block_of(name) == s and _BLOCK.match(name):
          source = f"encoder/block{s - 1}_" + name[len(f"encoder/block{s}_"):]
          weights[i] = weights[self._index[source]].copy()
    return weights

  def next(self, state: ServerState, clients, *, client_ids=None, store=None):
    del client_ids, store
    s = self.stage(state.round_num)
    process, names = self.process(s), self.stage_models[s - 1].names
    weights = self.start_weights(state)
    # The stage's aggregate is the new model: the shared server step (`ServerLoop.finish_round`) with
    # the stage process's SGD at a constant rate, restarted every round (it keeps no state).
    stage_state = ServerState(weights=[weights[self._index[n]] for n in names],
                              optimizer_state=process.initial_optimizer_state(),
                              aggregator_state=process.aggregator.initialize(),
                              round_num=state.round_num)
    out = process.compute_update(stage_state, clients)
    stepped, _ = process.finish_round(stage_state, out["update"], out["loss"], len(clients))
    for n, w in zip(names, stepped.weights):
      weights[self._index[n]] = np.asarray(w)
    measurements = collections.OrderedDict(out["measurements"])
    measurements.update(client_work.schedule_measurements(self.fedavg_config, state.round_num))
    if self.layerwise.calibration:
      if self.auxiliary is None:
        raise ValueError("LW-FedSSL's server-side calibration needs the server's auxiliary images "
                         "(runner.auxiliary_split): build the process with auxiliary=")
      idx = [self._index[n] for n in names]
      calibrated, calibration_loss = self.calibrator(s)(
          [weights[i] for i in idx], common.round_seed(self.fedavg_config.seed, state.round_num),
          self.auxiliary["images"], self.auxiliary["ids"])
      for i, w in zip(idx, calibrated):
        weights[i] = np.asarray(w)
      measurements["calibration_loss"] = np.float32(calibration_loss)
    new_state = ServerState(weights=weights, optimizer_state=(), aggregator_state=(),
                            round_num=state.round_num + 1)
    metrics = {"loss": float(out["loss"]), "clients": len(clients), "stage": s,
               "aggregation": measurements}
    return new_state, metrics


AUXILIARY_FRACTION = Field("auxiliary_fraction", 0.1, "LW-FedSSL: the fraction of the training "
                           "images the server holds out of the clients' data for its "
                           "calibration.", lower=0, upper=1, open_lower=True, open_upper=True)


def _validate(config):
  parsed = fedavg.process_config(config)
  if config.dp != "off":
    raise ValueError("--dp refuses the layer-wise family: it restarts its stage's aggregator every "
                     "round (a fresh stage process), which would restart DP's noise stream and "
                     "adaptive clip; remove --dp")
  if config.server_optimizer != "sgd" or config.server_lr_schedule != "constant":
    raise ValueError(f"layer-wise methods take the stage's aggregate as the new model: use "
                     f"--server_optimizer=sgd --server_lr_schedule=constant (got "
                     f"{config.server_optimizer}, {config.server_lr_schedule})")
  return parsed


def method(name: str, layerwise: LayerwiseConfig, summary: str) -> Method:
  """The registry entry of a staged method; it reads the fields of its options (calibration:
  auxiliary_fraction, alignment: alignment_weight, depth dropout: depth_dropout)."""

  def build(config, model, image_shape, context: BuildContext = BuildContext()):
    return LayerwiseProcess(
        config, model, image_shape, layerwise,
        lambda s: ssl_model.ssl_model_builder(dataclasses.replace(config, depth=s), image_shape,
                                              features=layerwise.alignment),
        context.auxiliary)

  own = (((AUXILIARY_FRACTION,) if layerwise.calibration else ()) +
         (alignment.FIELDS if layerwise.alignment else ()) +
         (depth_dropout.FIELDS if layerwise.depth_dropout else ()))
  fields = tuple(f for f in fedavg.STATELESS_FIELDS if f not in addons.SERVER_FIELDS) + own
  return Method(name=name, kind="federated", fields=fields, ssl=fedavg.METHOD.ssl,
                validate=_validate, build=build, min_samples=fedavg.METHOD.min_samples,
                divergence_hint=fedavg.divergence_hint, summary=summary,
                auxiliary=layerwise.calibration)
