"""The round anatomy every federated process shares: client inputs and views, the server state (with a
part each method owns), the trained/exchanged subset of the model, the one local-training step, and
the server's optimizer step.

    ServerState      weights, server optimizer state, aggregator state, round, method_state (the
                     method's own part: a bank, a stage counter; checkpointed with the rest)
    TensorMask       which of the model's tensors a process trains and exchanges; the others are
                     frozen: never differentiated, uploaded, aggregated or stepped
    client_step      one client optimizer step (FedAvg-style and DCCO clients, full-batch or minibatch)
    ServerLoop       initial state and the server optimizer step that closes a round
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import optim
from tff_ssl.config_fields import Field
from tff_ssl.data.augment import AugmentConfig, two_views
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.federated.process import GlobalModel
from tff_ssl.models.layers import batch_segments


def client_input_type(image_shape: Sequence[int]) -> tff.StructType:
  """One client's round input: its images and their dataset indices (which key the augmentations)."""
  return tff.StructType([
      ("images", tff.TensorType(np.uint8, [None] + list(image_shape))),
      ("ids", tff.TensorType(np.int64, [None])),
  ])


def client_inputs(images: np.ndarray, ids: np.ndarray) -> dict[str, np.ndarray]:
  """The value of `client_input_type` for one client."""
  return {"images": np.asarray(images, np.uint8), "ids": np.asarray(ids, np.int64)}


def tensors_type(specs: Sequence[tf.TensorSpec]) -> tff.StructType:
  """Tensors of `specs` as a TFF type: a list (a Python list inside TF computations, as TFF's own
  aggregators, e.g. `clipping_factory`, need: they `tf.nest` over the value)."""
  return tff.StructWithPythonType(
      [tff.TensorType(s.dtype.as_numpy_dtype, s.shape) for s in specs], list)


def weights_type(model: FunctionalModel) -> tff.StructType:
  """The model's weights as a TFF type (`tensors_type` of all its tensors)."""
  return tensors_type(model.weight_specs)


def flat_type(specs: Sequence[tf.TensorSpec]) -> tff.TensorType:
  """Tensors of `specs` (one dtype) as one flat vector: what an update crosses the TFF boundary as.

  TFF's runtime handles a struct element by element: a weighted `federated_mean` of the 53 tensors of
  a ResNet-14 + projector update and its return to Python cost ~50 ms where the same 3.3 MB as one
  tensor cost ~20 ms (`BUILD-notes.md`, "Grouped simulation")."""
  dtypes = {s.dtype for s in specs}
  if len(dtypes) != 1:
    raise ValueError(f"a flat vector needs tensors of one dtype; got {sorted(d.name for d in dtypes)}")
  return tff.TensorType(dtypes.pop().as_numpy_dtype, [sum(s.shape.num_elements() for s in specs)])


def flat_spec(specs: Sequence[tf.TensorSpec]) -> tf.TensorSpec:
  """`flat_type` as a `tf.TensorSpec`."""
  flat = flat_type(specs)
  return tf.TensorSpec(flat.shape, tf.as_dtype(flat.dtype))


def flatten(tensors) -> tf.Tensor:
  """The tensors' entries, concatenated in order (`flat_type`)."""
  return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)


def unflatten(flat: np.ndarray, specs: Sequence[tf.TensorSpec]) -> list[np.ndarray]:
  """`flatten`'s inverse in NumPy: arrays of `specs`' shapes (views of `flat`)."""
  flat = np.asarray(flat)
  sizes = [s.shape.num_elements() for s in specs]
  if flat.shape != (sum(sizes),):
    raise ValueError(f"expected a flat vector of {sum(sizes)} entries; got shape {flat.shape}")
  parts = np.split(flat, np.cumsum(sizes)[:-1])
  return [p.reshape(s.shape) for p, s in zip(parts, specs)]


def unflatten_tensors(flat: tf.Tensor, specs: Sequence[tf.TensorSpec]) -> list[tf.Tensor]:
  """`flatten`'s inverse in TensorFlow: tensors of `specs`' shapes, from a `flat_type` vector."""
  sizes = [s.shape.num_elements() for s in specs]
  return [tf.reshape(p, s.shape) for p, s in zip(tf.split(flat, sizes), specs)]


def flat_weights(weights) -> np.ndarray:
  """The weights as one `flat_type` vector (what crosses the TFF boundary as a broadcast)."""
  return np.concatenate([np.asarray(w).reshape(-1) for w in weights])


SEED_TYPE = tff.TensorType(np.int64, [2])


def kernel_norms(names: Sequence[str], initial, weights) -> dict:
  """Each kernel's norm over its initial norm (`kernel_norm/<tensor>`), and their mean per kind
  (`kernel_norm_conv`, convolutions and projection shortcuts; `kernel_norm_dense`): how a run's
  aggregation changes the global model's scale (`--measure_weight_norms`, aggregation.csv)."""
  ratios, kinds = {}, {"conv": [], "dense": []}
  for name, w0, w in zip(names, initial, weights):
    if not name.endswith("/kernel"):
      continue
    base = float(np.linalg.norm(w0))
    ratio = float(np.linalg.norm(w)) / base if base else float("nan")
    ratios[name] = np.float32(ratio)
    kinds["dense" if "dense" in name else "conv"].append(ratio)
  out = {f"kernel_norm_{k}": np.float32(np.mean(v)) for k, v in kinds.items() if v}
  out["kernel_norm"] = ratios
  return out


def views(data, seed, augment: AugmentConfig):
  """The two views of a client's images for the round's seed, keyed by example id."""
  return two_views(data["images"] if isinstance(data, dict) else data.images, seed, augment,
                   data["ids"] if isinstance(data, dict) else data.ids)


def encode_views(model: FunctionalModel, weights, v1, v2):
  """Projections (F, G) of both views in one forward pass (GroupNorm is per-sample: exact)."""
  return encode_outputs(model, weights, v1, v2)[0]


def encode_outputs(model: FunctionalModel, weights, v1, v2) -> list[tuple[tf.Tensor, tf.Tensor]]:
  """(view 1, view 2) of each of the model's outputs (projections, then predictions if any), from
  one forward pass over both views."""
  with batch_segments(2):  # Batch-statistics heads normalize each view over its own images.
    out = model(list(weights), tf.concat([v1, v2], axis=0), training=True)
  return [tuple(tf.split(o, 2, axis=0)) for o in (out if isinstance(out, (list, tuple)) else [out])]


def collect(values, spec):
  """CLIENTS-placed `values` (each client's: the structure of `spec`, nested `tf.TensorSpec`s of one
  real client's value, stacked on a leading axis over the slot's real clients) concatenated at the
  SERVER, in the clients' order: a `tff.federated_aggregate` whose accumulator is the concatenation
  (TFF 0.87 has no `federated_collect`). What is collected is what the type signature shows
  leaving the clients."""
  stacked = tff.types.to_type(tf.nest.map_structure(
      lambda s: tff.TensorType(s.dtype.as_numpy_dtype, [None] + list(s.shape)), spec))

  @tff.tensorflow.computation
  def zero():
    return tf.nest.map_structure(lambda s: tf.zeros([0] + list(s.shape), s.dtype), spec)

  @tff.tensorflow.computation(stacked, stacked)
  def concat(a, b):
    return tf.nest.map_structure(lambda x, y: tf.concat([x, y], axis=0), a, b)

  @tff.tensorflow.computation(stacked)
  def identity(a):
    return a

  return tff.federated_aggregate(values, zero(), concat, concat, identity)


def num_examples(data) -> tf.Tensor:
  images = data["images"] if isinstance(data, dict) else data.images
  return tf.cast(tf.shape(images)[0], tf.float32)


@dataclasses.dataclass(frozen=True)
class TensorMask:
  """Which of a model's tensors a process trains and exchanges (True), in the model's order.

  Frozen tensors (False) are still broadcast (clients need them for the forward pass) but are never
  differentiated, uploaded, aggregated or stepped: the upload and the aggregators' value type hold
  the trained tensors only, and the server optimizer's state covers only those.
  """

  trained: tuple[bool, ...]

  def __post_init__(self):
    object.__setattr__(self, "trained", tuple(bool(t) for t in self.trained))
    if not any(self.trained):
      raise ValueError("a tensor mask must train at least one tensor")

  @classmethod
  def all(cls, num_tensors: int) -> "TensorMask":
    return cls((True,) * num_tensors)

  @classmethod
  def of_model(cls, model) -> "TensorMask":
    """The mask training every tensor of `model` (a `FunctionalModel`) but its frozen ones
    (`FunctionalModel.frozen`: e.g. the ViT's frozen patch projection)."""
    return cls(tuple(not f for f in model.frozen))

  @classmethod
  def require_all(cls, model, method: str) -> "TensorMask":
    """The mask of every tensor of `model`, for a method that trains them all; ValueError where the
    model has frozen ones."""
    if any(model.frozen):
      frozen = [n for n, f in zip(model.names, model.frozen) if f]
      raise ValueError(f"{method} trains every tensor of the model; {frozen[0]!r} is frozen (drop "
                       f"--freeze_patch_embed)")
    return cls.all(len(model.frozen))

  @classmethod
  def from_names(cls, names: Sequence[str], trained: Callable[[str], bool]) -> "TensorMask":
    """The mask training the tensors whose name (`FunctionalModel.names`) satisfies `trained`."""
    mask = [bool(trained(n)) for n in names]
    if not any(mask):
      raise ValueError(f"no tensor of the model is selected for training (names like "
                       f"{list(names)[:3]})")
    return cls(tuple(mask))

  @property
  def indices(self) -> tuple[int, ...]:
    return tuple(i for i, t in enumerate(self.trained) if t)

  @property
  def full(self) -> bool:
    return all(self.trained)

  def check(self, num_tensors: int) -> None:
    if len(self.trained) != num_tensors:
      raise ValueError(f"the tensor mask covers {len(self.trained)} tensors; the model has "
                       f"{num_tensors}")

  def select(self, values: Sequence[Any]) -> list:
    """The trained entries of a model-ordered list."""
    return [values[i] for i in self.indices]

  def merge(self, trained: Sequence[Any], full: Sequence[Any]) -> list:
    """`full` with its trained entries replaced by `trained` (in order)."""
    out, it = list(full), iter(trained)
    for i in self.indices:
      out[i] = next(it)
    return out


@dataclasses.dataclass
class ServerState:
  """What the server carries between rounds; every field is a (nested) array structure.

  `method_state` is the method's own part (a bank of client statistics, a stage counter; `()` for a
  method that has none): it is checkpointed and restored with the rest.
  """

  weights: list[np.ndarray]
  optimizer_state: Any
  aggregator_state: Any
  round_num: int
  method_state: Any = ()

  def to_program_state(self) -> dict[str, Any]:
    """The state as `tff.program` program state (what a checkpoint holds)."""
    return {"weights": self.weights, "optimizer_state": self.optimizer_state,
            "aggregator_state": self.aggregator_state, "method_state": self.method_state,
            "round_num": np.int64(self.round_num)}

  @classmethod
  def from_program_state(cls, value: dict[str, Any]) -> "ServerState":
    return cls(weights=[np.asarray(w) for w in value["weights"]],
               optimizer_state=value["optimizer_state"],
               aggregator_state=value["aggregator_state"],
               method_state=value["method_state"], round_num=int(value["round_num"]))


def round_seed(seed: int, round_num: int) -> np.ndarray:
  """The seed a round broadcasts to its clients: (the run's seed, the round number); `round_of`
  reads the round back (the clients' learning-rate schedule)."""
  return np.array([seed, round_num], np.int64)


def round_of(seed) -> tf.Tensor:
  """The round number (float32) of a round's seed (`round_seed`)."""
  return tf.cast(seed[1], tf.float32)


# The fields of the clients' local training every federated method reads (their one check).
LOCAL_STEPS = Field("local_steps", 1, "Local steps per round (FedAvg-style methods: local epochs, "
                    "one full-batch step each unless --local_batch_size).", lower=1)
CLIENT_OPTIMIZER = Field("client_optimizer", "sgd", "Client optimizer (tff_ssl.optim): plain "
                         "gradient descent (DCCO's), with momentum 0.9, or AdamW (LW-FedSSL's).",
                         choices=lambda: optim.names("client"))
CLIENT_LEARNING_RATE = Field("client_learning_rate", 1.0, "Client learning rate (the peak, with "
                             "--client_lr_schedule=warmup_cosine).", lower=0, open_lower=True)
CLIENT_LR_SCHEDULES = ("constant", "warmup_cosine")
CLIENT_LR_SCHEDULE = Field("client_lr_schedule", "constant", "FedAvg-style: the clients' learning "
                           "rate over the run: constant, or warmup_cosine (MoCo v3's: a linear "
                           "warm-up over --warmup_fraction of the rounds, then cosine decay to 0; "
                           "a client's step s of S in round r is at progress (r + s / S) / rounds, "
                           "across rounds and stages).", choices=CLIENT_LR_SCHEDULES)


@dataclasses.dataclass(frozen=True)
class ClientSchedule:
  """The clients' learning rate over a run of `rounds` rounds (`CLIENT_LR_SCHEDULE`): constant at
  `learning_rate`, or `learning_rate` * `optim.warmup_cosine` of the run's progress, a function of
  the round and of the step within it, so a resumed run (or a stage of a layer-wise one) continues
  where it was."""

  learning_rate: float
  kind: str = "constant"
  rounds: int = 1
  warmup_fraction: float = 0.0

  def __post_init__(self):
    CLIENT_LEARNING_RATE.check(self.learning_rate)
    CLIENT_LR_SCHEDULE.check(self.kind)
    optim.WARMUP_FRACTION.check(self.warmup_fraction)
    if self.rounds < 1:
      raise ValueError(f"rounds must be >= 1; got {self.rounds}")
    if self.kind == "constant" and self.warmup_fraction:
      raise ValueError(f"warmup_fraction ({self.warmup_fraction}) needs "
                       f"--client_lr_schedule=warmup_cosine")

  @property
  def constant(self) -> bool:
    return self.kind == "constant"

  def progress(self, round_num, step, steps):
    """The run's progress at step `step` of `steps` in round `round_num` (0-based)."""
    return (round_num + step / steps) / self.rounds

  def rate(self, round_num, step, steps):
    """The learning rate of step `step` (of `steps`) in round `round_num`: plain numbers or
    tensors."""
    if self.constant:
      return self.learning_rate
    return self.learning_rate * optim.warmup_cosine(self.progress(round_num, step, steps),
                                                    self.warmup_fraction)


def with_learning_rate(optimizer: tff.learning.optimizers.Optimizer, state, learning_rate):
  """`optimizer`'s `state` with its learning rate set to `learning_rate` (a scheduled step)."""
  hparams = dict(optimizer.get_hparams(state))
  hparams["learning_rate"] = tf.cast(learning_rate, tf.convert_to_tensor(
      hparams["learning_rate"]).dtype)
  return optimizer.set_hparams(state, hparams)


def client_optimizer(name: str, learning_rate: float,
                     weight_decay: float = 0.0) -> tff.learning.optimizers.Optimizer:
  """The clients' local optimizer (`tff_ssl.optim`, role "client"), restarted every round: plain
  gradient descent ("sgd", the papers' choice, and what DCCO's equivalence needs), SGD with
  momentum 0.9 ("sgdm"), or AdamW ("adamw", LW-FedSSL's: TFF's, with `weight_decay` decoupled,
  w -= lr * (Adam's step + wd * w)). The SGD optimizers take weight decay as coupled L2 in
  `client_step` (`coupled_weight_decay`)."""
  return optim.make_tff_optimizer(name, "client", learning_rate, weight_decay=weight_decay)


def coupled_weight_decay(name: str, weight_decay: float) -> float:
  """The L2 term `client_step` adds to the gradients: the weight decay of the SGD optimizers;
  AdamW's is decoupled, inside the optimizer."""
  return 0.0 if optim.get(name, "client").decoupled_weight_decay else weight_decay


def client_step(optimizer: tff.learning.optimizers.Optimizer, opt_state, trained: list, loss_of,
                weight_decay: float = 0.0):
  """The one local-training step of every client: `loss_of(trained)`, its gradient with respect to
  the trained tensors (+ weight_decay * w: coupled L2, as PyTorch's SGD), one optimizer step.

  Returns (optimizer state, trained tensors after the step, the loss before it).
  """
  with tf.GradientTape() as tape:
    tape.watch(trained)
    loss = loss_of(trained)
  grads = tape.gradient(loss, trained)
  if weight_decay:
    grads = [g + weight_decay * w for g, w in zip(grads, trained)]
  opt_state, new = optimizer.next(opt_state, tuple(trained), tuple(grads))
  return opt_state, list(new), loss


def local_training(weights, steps: int, optimizer: str, learning_rate, loss_of,
                   after_step=None, weight_decay: float = 0.0, mask: TensorMask | None = None):
  """`steps` client optimizer steps (`client_step`) from `weights` on `loss_of(current_weights,
  step)`, training only the tensors of `mask` (default: all). `learning_rate`: a number, or a
  function of the step (a schedule: `ClientSchedule.rate`).

  `after_step(current_weights)` runs after each step (BYOL's target update).

  Returns (Delta = trained weights before - after, the first step's loss, the mean loss over the
  steps): what a client sends back, its loss at the broadcast model, and its mean training loss.
  """
  full = list(weights)
  mask = mask or TensorMask.all(len(full))
  initial = mask.select(full)
  current = list(initial)
  scheduled = callable(learning_rate)
  # A scheduled rate is set before each step (`with_learning_rate`); 1.0 is never used.
  local_opt = client_optimizer(optimizer, 1.0 if scheduled else learning_rate, weight_decay)
  opt_state = local_opt.initialize(tuple(tf.TensorSpec(w.shape, w.dtype) for w in current))
  step_losses = []
  for step in range(steps):
    if scheduled:
      opt_state = with_learning_rate(local_opt, opt_state, learning_rate(step))
    opt_state, current, loss = client_step(
        local_opt, opt_state, current,
        lambda trained, step=step: loss_of(mask.merge(trained, full), step),
        coupled_weight_decay(optimizer, weight_decay))
    step_losses.append(loss)
    if after_step is not None:
      after_step(mask.merge(current, full))
  return ([a - b for a, b in zip(initial, current)], step_losses[0],
          tf.add_n(step_losses) / float(steps))


def check_client_training(local_steps: int, optimizer: str, learning_rate: float) -> None:
  """Validates the client-side training settings every process shares (their fields' checks)."""
  LOCAL_STEPS.check(local_steps)
  CLIENT_OPTIMIZER.check(optimizer)
  CLIENT_LEARNING_RATE.check(learning_rate)


# The server's step every federated method takes, and its fields (their one check).
SERVER_LR_SCHEDULES = ("cosine", "constant")
SERVER_OPTIMIZER = Field("server_optimizer", "adam", "Server optimizer (tff_ssl.optim).",
                         choices=lambda: optim.names("server"))
SERVER_LEARNING_RATE = Field("server_learning_rate", 2e-3, "Initial server learning rate.",
                             lower=0, open_lower=True)
SERVER_LR_SCHEDULE = Field("server_lr_schedule", "cosine", "Server learning rate: cosine decay "
                           "to 0 over the rounds (DCCO's), or constant (FedAvg's server step of 1).",
                           choices=SERVER_LR_SCHEDULES)


class Elementwise(tff.learning.optimizers.Optimizer):
  """Marks an optimizer as elementwise (SGD, momentum, Adam: no per-tensor norms, unlike LARS), so
  that `ServerLoop` runs it on one flat vector of the trained tensors instead of one tensor each.

  The values are the same; the cost is not: a TensorFlow call with the 53 tensors of a ResNet-14 and
  projector, and Adam's two accumulators for each, takes ~10 ms a round on 2 cores, one flat vector
  ~3 ms (`BUILD-notes.md`, "Grouped simulation"); a mini-table cell has 3,000 rounds."""

  def __init__(self, optimizer: tff.learning.optimizers.Optimizer):
    self.optimizer = optimizer

  def initialize(self, specs):
    return self.optimizer.initialize(specs)

  def next(self, state, weights, gradients):
    return self.optimizer.next(state, weights, gradients)

  def get_hparams(self, state):
    return self.optimizer.get_hparams(state)

  def set_hparams(self, state, hparams):
    return self.optimizer.set_hparams(state, hparams)


def server_optimizer(name: str, learning_rate: float, rounds: int, schedule: str,
                     names: Sequence[str]) -> tff.learning.optimizers.Optimizer:
  """Server optimizer `name` (`tff_ssl.optim`, role "server") over tensors `names`, its learning
  rate cosine-decayed to 0 over `rounds` rounds or constant."""
  entry = optim.get(name, "server")
  SERVER_LR_SCHEDULE.check(schedule)
  optimizer = entry.tff(learning_rate, list(names), 0.0)
  if schedule != "constant":
    optimizer = tff.learning.optimizers.schedule_learning_rate(
        optimizer,
        lambda r: learning_rate * 0.5 * (1.0 + tf.cos(np.pi * tf.cast(r, tf.float32) / rounds)))
  return Elementwise(optimizer) if entry.elementwise else optimizer


def server_optimizer_for(config, names: Sequence[str]) -> tff.learning.optimizers.Optimizer:
  """The server optimizer an `ExperimentConfig` asks for, over the tensors `names`."""
  return server_optimizer(config.server_optimizer, config.server_learning_rate, config.rounds,
                          config.server_lr_schedule, names)


def _server_step(server_optimizer, weights, state, delta):
  state, new_weights = server_optimizer.next(state, tuple(weights), tuple(delta))
  return list(new_weights), state


class ServerLoop(GlobalModel):
  """The server's part shared by every process: initial state, and the optimizer step that closes a
  round with the aggregated update of the trained tensors (`mask`; default all). A
  `process.FederatedProcess` over one global model (`process.GlobalModel`).

  A method with server state of its own overrides `initial_method_state` and passes the new value to
  `finish_round`; the runner checkpoints and restores it with the rest of `ServerState`.
  """

  def __init__(self, model: FunctionalModel, server_optimizer, aggregator=None,
               mask: TensorMask | None = None):
    self.model = model
    self.mask = mask or TensorMask.of_model(model)
    self.mask.check(len(model.weight_specs))
    self._aggregator = aggregator
    self._optimizer = server_optimizer
    specs = tuple(self.mask.select(model.weight_specs))

    # A partial, not a closure: TF counts retracing per Python code object, so every ServerLoop's
    # closure (one per process built, e.g. a table's cells in one Python process) would count as a
    # retrace of one function and print TF's "triggered tf.function retracing" warning.
    self._specs = specs
    # An elementwise optimizer steps one flat vector of the trained tensors (`Elementwise`).
    self._flat = isinstance(server_optimizer, Elementwise) and len(specs) > 0
    self._optimizer_specs = (flat_spec(specs),) if self._flat else specs
    self._server_update = tf.function(functools.partial(_server_step, server_optimizer),
                                      autograph=False)

  @property
  def trained_specs(self) -> list[tf.TensorSpec]:
    return list(self._specs)

  def initial_method_state(self) -> Any:
    """The method's own part of the server state (`()`: none)."""
    return ()

  def initial_optimizer_state(self):
    """The server optimizer's state at the first round."""
    return self._optimizer.initialize(self._optimizer_specs)

  def initialize(self) -> ServerState:
    return ServerState(weights=[w.copy() for w in self.model.initial_weights],
                       optimizer_state=self.initial_optimizer_state(),
                       aggregator_state=self._aggregator.initialize() if self._aggregator else (),
                       round_num=0, method_state=self.initial_method_state())

  def finish_round(self, state: ServerState, update, loss, num_clients: int,
                   aggregator_state=(), method_state: Any = None) -> tuple[ServerState, dict]:
    """The server optimizer step on the trained tensors with `update` (their aggregated Delta);
    frozen tensors are carried over untouched."""
    if self._flat:
      flat, opt_state = self._server_update([flat_weights(self.mask.select(state.weights))],
                                            state.optimizer_state, [flat_weights(update)])
      trained = unflatten(np.asarray(flat[0]), self._specs)
    else:
      trained, opt_state = self._server_update(self.mask.select(state.weights),
                                               state.optimizer_state, list(update))
    weights = self.mask.merge([np.asarray(w) for w in trained], state.weights)
    new_state = ServerState(
        weights=weights, optimizer_state=opt_state, aggregator_state=aggregator_state,
        round_num=state.round_num + 1,
        method_state=state.method_state if method_state is None else method_state)
    return new_state, {"loss": float(loss), "clients": num_clients}
