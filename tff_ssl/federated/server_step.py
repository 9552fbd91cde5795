"""The server's side every federated process shares: the server state (with a part each method owns),
the server optimizer, and the server loop (initial state, and the optimizer step that closes a round).

    ServerState      weights, server optimizer state, aggregator state, round, method_state (the
                     method's own part: a bank, a stage counter; checkpointed with the rest)
    ServerLoop       initial state and the server optimizer step that closes a round
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import optim
from tff_ssl.config_fields import Field
from tff_ssl.federated.common import flat_spec, flat_weights, unflatten
from tff_ssl.federated.masks import TensorMask
from tff_ssl.federated.process import GlobalModel


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
