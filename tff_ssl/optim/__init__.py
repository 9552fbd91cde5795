"""The one optimizer registry: every optimizer the project trains with, by name, and where it runs.

Each entry builds a Keras optimizer (centralized pretraining, the probes and fine-tuning) and/or a
`tff.learning.optimizers.Optimizer` (a federated client's local steps, the server's step), and says
in which roles a config may choose it:

  name   Keras                 TFF                              roles
  sgd    SGD                   build_sgdm                       centralized, client, server
  sgdm   SGD, momentum 0.9     build_sgdm, momentum 0.9         centralized, client, server
  adam   Adam                  build_adam                       centralized, server
  adamw  -                     build_adamw (decoupled decay)    client (LW-FedSSL's)
  lars   LARS, momentum 0.9    LARSOptimizer, momentum 0.9      centralized, server (DCCO's)

`--optimizer`, `--client_optimizer` and `--server_optimizer` take the names of their role
(`names(role)`); `get(name, role)` is the one check of a name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl.optim.lars import LARS
from tff_ssl.optim.tff_lars import LARSOptimizer

ROLES = ("centralized", "client", "server")
_ROLE_FIELDS = {"centralized": "optimizer", "client": "client_optimizer",
                "server": "server_optimizer"}


@dataclasses.dataclass(frozen=True)
class Optimizer:
  """A registry entry.

  keras(learning_rate or schedule): the Keras optimizer (None: not offered where Keras trains).
  tff(learning_rate, names, weight_decay): the TFF optimizer over tensors `names` (LARS adapts by
    name); weight_decay is used only where `decoupled_weight_decay` (else the client adds it to the
    gradients as L2, `tff_ssl.federated.common.client_step`).
  roles: where a config may choose it (ROLES).
  elementwise: an entry's update depends only on that entry's weight, gradient and state (SGD,
    momentum, Adam; not LARS's per-tensor norms): the server may step one flat vector.
  """

  name: str
  roles: tuple[str, ...]
  keras: Callable[[Any], tf.keras.optimizers.Optimizer] | None = None
  tff: Callable[[float, Sequence[str], float], tff.learning.optimizers.Optimizer] | None = None
  elementwise: bool = False
  decoupled_weight_decay: bool = False


OPTIMIZERS: dict[str, Optimizer] = {o.name: o for o in (
    Optimizer("sgd", ("centralized", "client", "server"),
              keras=lambda lr: tf.keras.optimizers.SGD(lr),
              tff=lambda lr, names, wd: tff.learning.optimizers.build_sgdm(learning_rate=lr),
              elementwise=True),
    Optimizer("sgdm", ("centralized", "client", "server"),
              keras=lambda lr: tf.keras.optimizers.SGD(lr, momentum=0.9),
              tff=lambda lr, names, wd: tff.learning.optimizers.build_sgdm(learning_rate=lr,
                                                                           momentum=0.9),
              elementwise=True),
    Optimizer("adam", ("centralized", "server"),
              keras=lambda lr: tf.keras.optimizers.Adam(lr),
              tff=lambda lr, names, wd: tff.learning.optimizers.build_adam(learning_rate=lr),
              elementwise=True),
    Optimizer("adamw", ("client",),
              tff=lambda lr, names, wd: tff.learning.optimizers.build_adamw(learning_rate=lr,
                                                                            weight_decay=wd),
              elementwise=True, decoupled_weight_decay=True),
    Optimizer("lars", ("centralized", "server"),
              keras=lambda lr: LARS(lr, momentum=0.9),
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


def cosine_schedule(learning_rate: float, steps: int):
  """Cosine decay from `learning_rate` to 0 over `steps` steps."""
  if learning_rate <= 0:
    raise ValueError(f"learning rate must be > 0; got {learning_rate}")
  return tf.keras.optimizers.schedules.CosineDecay(learning_rate, max(1, steps))


def make_optimizer(name: str, learning_rate: float, steps: int) -> tf.keras.optimizers.Optimizer:
  """Keras optimizer `name` (a centralized one, `names("centralized")`) with a cosine-decayed
  learning rate over `steps` steps."""
  return get(name, "centralized").keras(cosine_schedule(learning_rate, steps))


def make_tff_optimizer(name: str, role: str, learning_rate, names_: Sequence[str] = (),
                       weight_decay: float = 0.0) -> tff.learning.optimizers.Optimizer:
  """TFF optimizer `name` for `role` ("client" or "server") over tensors `names_`."""
  return get(name, role).tff(learning_rate, names_, weight_decay)
