"""The one optimizer registry: every optimizer the project trains with, by name, and where it runs.

Each entry builds a Keras optimizer (centralized pretraining, the probes and fine-tuning) and/or a
`tff.learning.optimizers.Optimizer` (a federated client's local steps, the server's step), and says
in which roles a config may choose it:

  name   Keras                 TFF                              roles
  sgd    SGD                   build_sgdm                       centralized, client, server
  sgdm   SGD, momentum 0.9     build_sgdm, momentum 0.9         centralized, client, server
  adam   Adam                  build_adam                       centralized, server
  adamw  AdamW                 build_adamw (decoupled decay)    centralized, client (MoCo v3's,
                                                                   LW-FedSSL's)
  lars   LARS, momentum 0.9    LARSOptimizer, momentum 0.9      centralized, server (DCCO's)

`--optimizer`, `--client_optimizer` and `--server_optimizer` take the names of their role
(`names(role)`); `get(name, role)` is the one check of a name.

The learning-rate schedules (`warmup_cosine`: a linear warm-up over the first `warmup_fraction` of a
run, then cosine decay to 0, MoCo v3's) are functions of the run's progress: centralized training's
step over its steps, a federated client's (round + step / its steps this round) over the rounds.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl.config_fields import Field
from tff_ssl.optim.lars import LARS
from tff_ssl.optim.tff_lars import LARSOptimizer

ROLES = ("centralized", "client", "server")
_ROLE_FIELDS = {"centralized": "optimizer", "client": "client_optimizer",
                "server": "server_optimizer"}


@dataclasses.dataclass(frozen=True)
class Optimizer:
  """A registry entry.

  keras(learning_rate or schedule, weight_decay): the Keras optimizer (None: not offered where Keras
    trains); weight_decay is Keras' decoupled decay (w -= lr * weight_decay * w after the step; the
    centralized `weight_decay` field, 0 by default).
  tff(learning_rate, names, weight_decay): the TFF optimizer over tensors `names` (LARS adapts by
    name); weight_decay is used only where `decoupled_weight_decay` (else the client adds it to the
    gradients as L2, `tff_ssl.federated.local_steps.client_step`).
  roles: where a config may choose it (ROLES).
  elementwise: an entry's update depends only on that entry's weight, gradient and state (SGD,
    momentum, Adam; not LARS's per-tensor norms): the server may step one flat vector.
  """

  name: str
  roles: tuple[str, ...]
  keras: Callable[[Any, float], tf.keras.optimizers.Optimizer] | None = None
  tff: Callable[[float, Sequence[str], float], tff.learning.optimizers.Optimizer] | None = None
  elementwise: bool = False
  decoupled_weight_decay: bool = False


OPTIMIZERS: dict[str, Optimizer] = {o.name: o for o in (
    Optimizer("sgd", ("centralized", "client", "server"),
              keras=lambda lr, wd: tf.keras.optimizers.SGD(lr, weight_decay=wd or None),
              tff=lambda lr, names, wd: tff.learning.optimizers.build_sgdm(learning_rate=lr),
              elementwise=True),
    Optimizer("sgdm", ("centralized", "client", "server"),
              keras=lambda lr, wd: tf.keras.optimizers.SGD(lr, momentum=0.9,
                                                           weight_decay=wd or None),
              tff=lambda lr, names, wd: tff.learning.optimizers.build_sgdm(learning_rate=lr,
                                                                           momentum=0.9),
              elementwise=True),
    Optimizer("adam", ("centralized", "server"),
              keras=lambda lr, wd: tf.keras.optimizers.Adam(lr, weight_decay=wd or None),
              tff=lambda lr, names, wd: tff.learning.optimizers.build_adam(learning_rate=lr),
              elementwise=True),
    Optimizer("adamw", ("centralized", "client"),
              keras=lambda lr, wd: tf.keras.optimizers.AdamW(lr, weight_decay=wd),
              tff=lambda lr, names, wd: tff.learning.optimizers.build_adamw(learning_rate=lr,
                                                                            weight_decay=wd),
              elementwise=True, decoupled_weight_decay=True),
    Optimizer("lars", ("centralized", "server"),
              keras=lambda lr, wd: LARS(lr, momentum=0.9, weight_decay=wd or None),
              tff=lambda lr, names, wd: LARSOptimizer(lr, names=list(names))),
)}


def names(role: str) -> tuple[str, ...]:
  """The optimizers a config may choose in `role` (one of ROLES), sorted."""
  if role not in ROLES:
    raise ValueError(f"unknown optimizer role {role!r}; choose one of {list(ROLES)}")
  return tuple(sorted(n for n, o in OPTIMIZERS.items() if role in o.roles))


def get(name: str, role: str) -> Optimizer:
  """The entry `name` for `role`; ValueError naming the role's field and its choices otherwise."""
  if name not in names(role):
    raise ValueError(f"unknown {_ROLE_FIELDS[role]} {name!r}; choose one of {sorted(names(role))}")
  return OPTIMIZERS[name]


# The warm-up of a run's learning rate (centralized: its steps; a federated client under
# `client_lr_schedule=warmup_cosine`: the run's rounds).
WARMUP_FRACTION = Field("warmup_fraction", 0.0, "Linear learning-rate warm-up over this fraction "
                        "of the run, then cosine decay (centralized: of its steps; federated clients "
                        "with --client_lr_schedule=warmup_cosine: of the rounds).", lower=0, upper=1,
                        open_upper=True, note="0: no warm-up")


def warmup_cosine(progress, warmup_fraction: float):
  """The learning rate's factor at `progress` (0 at the run's start, 1 at its end; a float, NumPy
  or TF value): progress / warmup_fraction during the warm-up, then 0.5 (1 + cos(pi p)) with p the
  progress through the rest of the run (MoCo v3's schedule; warmup_fraction 0: plain cosine)."""
  lib = tf if isinstance(progress, (tf.Tensor, tf.Variable)) else np
  progress = lib.minimum(lib.maximum(progress, 0.0), 1.0)
  cosine = 0.5 * (1.0 + lib.cos(np.pi * (progress - warmup_fraction) / (1.0 - warmup_fraction)))
  if not warmup_fraction:
    return cosine
  return lib.where(progress < warmup_fraction, progress / warmup_fraction, cosine)


def cosine_schedule(learning_rate: float, steps: int):
  """Cosine decay from `learning_rate` to 0 over `steps` steps."""
  if learning_rate <= 0:
    raise ValueError(f"learning rate must be > 0; got {learning_rate}")
  return tf.keras.optimizers.schedules.CosineDecay(learning_rate, max(1, steps))


def warmup_cosine_schedule(learning_rate: float, steps: int, warmup_fraction: float = 0.0):
  """Keras' schedule of `warmup_cosine` over `steps` steps: round(warmup_fraction * steps) steps of
  linear warm-up from 0 to `learning_rate`, then cosine decay to 0 over the rest (plain
  `cosine_schedule` for no warm-up)."""
  WARMUP_FRACTION.check(warmup_fraction)
  warmup = int(round(warmup_fraction * steps))
  if not warmup:
    return cosine_schedule(learning_rate, steps)
  if learning_rate <= 0:
    raise ValueError(f"learning rate must be > 0; got {learning_rate}")
  return tf.keras.optimizers.schedules.CosineDecay(
      0.0, max(1, steps - warmup), warmup_target=learning_rate, warmup_steps=warmup)


def make_optimizer(name: str, learning_rate: float, steps: int, weight_decay: float = 0.0,
                   warmup_fraction: float = 0.0) -> tf.keras.optimizers.Optimizer:
  """Keras optimizer `name` (a centralized one, `names("centralized")`) with a cosine-decayed
  learning rate over `steps` steps, after a linear warm-up over `warmup_fraction` of them, and
  Keras' decoupled `weight_decay`."""
  if weight_decay < 0:
    raise ValueError(f"weight_decay must be >= 0; got {weight_decay}")
  return get(name, "centralized").keras(
      warmup_cosine_schedule(learning_rate, steps, warmup_fraction), weight_decay)


def make_tff_optimizer(name: str, role: str, learning_rate, names_: Sequence[str] = (),
                       weight_decay: float = 0.0) -> tff.learning.optimizers.Optimizer:
  """TFF optimizer `name` for `role` ("client" or "server") over tensors `names_`."""
  return get(name, role).tff(learning_rate, names_, weight_decay)
