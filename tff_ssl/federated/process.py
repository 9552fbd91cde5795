"""The one interface of a federated process: what the run layer (`tff_ssl.runner`) calls,
and all it calls.

    initialize()                               the server state before round 0
    next(state, clients, *, client_ids, store) one round: (new server state, metrics)
    encoders(state, store)                     (label, Keras encoder) pairs a run evaluates after
                                               the rounds of `state` (None: at initialization)
    keeps_client_state                         whether `next` needs a `ClientStateStore`
    needs_auxiliary                            whether the server trains on images of its own
                                               (built with `auxiliary=`; LW-FedSSL's calibration)

Every method's `build(config, model, image_shape, context=BuildContext())` returns one; the context
holds what the run layer knows and a method may need (the server's own images, the execution's
round shape). `GlobalModel` gives the common case: one global model in the server state, its encoder
evaluated.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence, runtime_checkable

import tensorflow as tf

from tff_ssl.federated import ssl_model


@dataclasses.dataclass(frozen=True)
class BuildContext:
  """What the run layer passes to a method's `build` beside the config and the model.

  auxiliary: the server's own images ({"images", "ids"}; the runner's auxiliary split) for a method
    whose server trains on them (LW-FedSSL's calibration); None: a process that will not train
    (e.g. one built to read a checkpoint).
  mergeable: the rounds run across workers under TFF's mergeable execution, where a computation
    may hold one aggregation (or several independent ones): DCCO then splits its round in two.
  """

  auxiliary: dict | None = None
  mergeable: bool = False


@runtime_checkable
class FederatedProcess(Protocol):
  """A federated method's process (module docstring)."""

  keeps_client_state: bool
  needs_auxiliary: bool

  def initialize(self) -> Any:
    ...

  def next(self, state, clients: list[dict], *, client_ids: Sequence[int] | None = None,
           store=None) -> tuple[Any, dict]:
    ...

  def encoders(self, state, store=None) -> list[tuple[str, tf.keras.Model]]:
    ...


class GlobalModel:
  """A process whose server state holds one global model (`self.model`'s weights): its encoder is
  what a run evaluates. Stateless and without auxiliary images unless the process says otherwise."""

  client_state = None  # A stateful process's `client_state.ClientState`.
  needs_auxiliary = False

  @property
  def keeps_client_state(self) -> bool:
    return self.client_state is not None

  def encoders(self, state, store=None) -> list[tuple[str, tf.keras.Model]]:
    del store
    weights = self.model.initial_weights if state is None else state.weights
    return [("global", ssl_model.keras_encoder(self.model, weights))]


def check(process) -> Any:
  """`process`, if it has the interface (TypeError naming what it lacks otherwise)."""
  missing = [name for name in ("initialize", "next", "encoders", "keeps_client_state",
                               "needs_auxiliary") if not hasattr(process, name)]
  if missing:
    raise TypeError(f"{type(process).__name__} is not a federated process: it lacks "
                    f"{', '.join(missing)} (tff_ssl.federated.process.FederatedProcess)")
  return process
