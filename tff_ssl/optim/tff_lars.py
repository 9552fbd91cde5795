"""LARS as a `tff.learning.optimizers.Optimizer`: DCCO's server optimizer on DERM (Appendix B).

Which tensors are adapted follows `tff_ssl.optim.lars.adapts(name, shape)`, the rule of the Keras
`tff_ssl.optim.LARS` too; pass the tensors' names (`FunctionalModel.names`, or the trained subset's
under a mask). Without names the rule sees only shapes (rank <= 1 is not adapted). The learning rate lives under
`tff.learning.optimizers.LEARNING_RATE_KEY`, so `schedule_learning_rate` applies.
"""

from __future__ import annotations

import collections
from typing import Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl.optim.lars import DEFAULT_EXCLUDE, adapts, lars_update

_LR = tff.learning.optimizers.LEARNING_RATE_KEY


class LARSOptimizer(tff.learning.optimizers.Optimizer):
  """Server-side LARS with momentum."""

  def __init__(self, learning_rate: float, momentum: float = 0.9, weight_decay: float = 0.0,
               eta: float = 0.001, names: Sequence[str] | None = None,
               exclude_from_adaptation: Sequence[str] = DEFAULT_EXCLUDE):
    if learning_rate < 0 or not 0 <= momentum < 1 or eta <= 0:
      raise ValueError(f"LARS needs learning_rate >= 0, momentum in [0, 1), eta > 0; got "
                       f"{learning_rate}, {momentum}, {eta}")
    self._lr, self._momentum, self._wd, self._eta = learning_rate, momentum, weight_decay, eta
    self._names = None if names is None else list(names)
    self._exclude = tuple(exclude_from_adaptation)

  def _adapted(self, flat_weights) -> list[bool]:
    if self._names is not None and len(self._names) != len(flat_weights):
      raise ValueError(f"LARS was given {len(self._names)} tensor names for {len(flat_weights)} "
                       f"tensors; pass the names of exactly the tensors it steps")
    names = self._names or [""] * len(flat_weights)
    return [adapts(n, w.shape, self._exclude) for n, w in zip(names, flat_weights)]

  def initialize(self, specs):
    self._adapted(tf.nest.flatten(specs))  # Checks the names match the tensors.
    return collections.OrderedDict([
        (_LR, self._lr),
        ("velocity", tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), specs)),
    ])

  def next(self, state, weights, gradients):
    lr = state[_LR]
    flat_w, flat_g = tf.nest.flatten(weights), tf.nest.flatten(gradients)
    flat_v = tf.nest.flatten(state["velocity"])
    new_w, new_v = [], []
    for w, g, v, adapt in zip(flat_w, flat_g, flat_v, self._adapted(flat_w)):
      w2, v2 = lars_update(w, g, v, tf.cast(lr, g.dtype), momentum=self._momentum,
                           weight_decay=self._wd, eta=self._eta, adapt=adapt)
      new_w.append(w2)
      new_v.append(v2)
    new_state = collections.OrderedDict([
        (_LR, lr), ("velocity", tf.nest.pack_sequence_as(state["velocity"], new_v))])
    return new_state, tf.nest.pack_sequence_as(weights, new_w)

  def get_hparams(self, state):
    return collections.OrderedDict([(_LR, state[_LR])])

  def set_hparams(self, state, hparams):
    return collections.OrderedDict([(_LR, hparams[_LR]), ("velocity", state["velocity"])])
