"""LARS (You et al., 2017) as a Keras optimizer, used by DCCO for linear evaluation and on the server.

    g <- g + weight_decay * w                                  (not for excluded variables)
    trust = eta * ||w|| / ||g||   (1 where either norm is 0, or the variable is excluded)
    v <- momentum * v + lr * trust * g
    w <- w - v                    (Nesterov: w <- w - (momentum * v + lr * trust * g))

Which tensors are adapted is one rule, `adapts(name, shape)`, used by both the Keras optimizer here
(variable names) and the server optimizer `tff_ssl.optim.tff_lars.LARSOptimizer` (the full weight paths
of `FunctionalModel.names`): tensors of rank <= 1 (biases, normalization scales and offsets) and tensors
whose name matches an excluded pattern take plain momentum steps without weight decay, as in SimCLR's,
BYOL's and MoCo v3's LARS. A ViT's position embedding and class token (rank 3) are adapted, as in MoCo
v3 (which excludes only 1-D parameters).
"""

from __future__ import annotations

import re
from typing import Sequence

import tensorflow as tf

DEFAULT_EXCLUDE = (r"bias", r"gamma", r"beta", r"group_norm", r"_gn")


def adapts(name: str, shape, exclude: Sequence[str] = DEFAULT_EXCLUDE) -> bool:
  """Whether LARS adapts (and weight-decays) the tensor `name` of `shape`: the one rule of both LARS
  optimizers. `name` may be a Keras variable name or a full weight path; patterns are `re.search`ed."""
  return len(shape) >= 2 and not any(re.search(p, name) for p in exclude)


def lars_update(w, g, velocity, lr, *, momentum: float, weight_decay: float, eta: float,
                adapt: bool, nesterov: bool = False):
  """One LARS step for one tensor; returns (new weight, new velocity). Pure: shared by the Keras
  optimizer and the TFF server optimizer."""
  if adapt:
    if weight_decay:
      g = g + weight_decay * w
    w_norm = tf.norm(w)
    g_norm = tf.norm(g)
    trust = tf.where((w_norm > 0) & (g_norm > 0), eta * w_norm / g_norm, tf.ones_like(w_norm))
    g = g * trust
  velocity = momentum * velocity + lr * g
  step = momentum * velocity + lr * g if nesterov else velocity
  return w - step, velocity


class LARS(tf.keras.optimizers.Optimizer):
  """Layer-wise adaptive rate scaling with momentum."""

  def __init__(self, learning_rate=1.0, momentum: float = 0.9, lars_weight_decay: float = 0.0,
               eta: float = 0.001, nesterov: bool = False,
               exclude_from_adaptation: Sequence[str] = DEFAULT_EXCLUDE, name: str = "LARS",
               **kwargs):
    super().__init__(name=name, **kwargs)
    if not 0 <= momentum < 1:
      raise ValueError(f"momentum must be in [0, 1); got {momentum}")
    if eta <= 0:
      raise ValueError(f"eta must be > 0; got {eta}")
    self._learning_rate = self._build_learning_rate(learning_rate)
    self.momentum = momentum
    self.lars_weight_decay = lars_weight_decay
    self.eta = eta
    self.nesterov = nesterov
    self.exclude_from_adaptation = tuple(exclude_from_adaptation)

  def build(self, var_list):
    super().build(var_list)
    if hasattr(self, "_built") and self._built:
      return
    self.velocities = [self.add_variable_from_reference(v, "velocity") for v in var_list]
    self._built = True

  def _adapted(self, variable) -> bool:
    return adapts(variable.name, variable.shape, self.exclude_from_adaptation)

  def update_step(self, gradient, variable):
    lr = tf.cast(self.learning_rate, variable.dtype)
    velocity = self.velocities[self._index_dict[self._var_key(variable)]]
    new_w, new_v = lars_update(variable, gradient, velocity, lr, momentum=self.momentum,
                               weight_decay=self.lars_weight_decay, eta=self.eta,
                               adapt=self._adapted(variable), nesterov=self.nesterov)
    velocity.assign(new_v)
    variable.assign(new_w)

  def get_config(self):
    return {
        **super().get_config(),
        "learning_rate": self._serialize_hyperparameter(self._learning_rate),
        "momentum": self.momentum,
        "lars_weight_decay": self.lars_weight_decay,
        "eta": self.eta,
        "nesterov": self.nesterov,
        "exclude_from_adaptation": self.exclude_from_adaptation,
    }
