"""Angular divergence between a client's model and the global model (L-DAWA, Rehman et al. 2023, eq. 2).

    delta_k^(l) = cos(w_g^(l), w_k^(l)) = <w_g^(l), w_k^(l)> / (||w_g^(l)|| ||w_k^(l)||)

for every group l of weight tensors (a Keras layer, a single tensor, or the whole model for M-DAWA),
with w_k = w_g - Delta_k. Computed from three partial sums per tensor (<w_g, w_k>, ||w_g||^2,
||w_k||^2) added up per group, so the whole-model cosine comes from the same sums at no extra cost.

Two conventions the paper leaves open, chosen so nothing is NaN and nothing is lost:
  * a group whose global or client weights are all zero (biases and GroupNorm offsets start at zero)
    has no angle; it gets delta = 1 (no scaling: the plain weighted mean), not 0, which would zero the
    layer for good (w_g stays 0, so its cosine stays undefined every round);
  * cosines are clipped to [-1, 1] (round-off can exceed 1); a negative cosine is kept, as in the
    paper ("delta_k falls into [-1, 0)" flips the layer toward w_g) and in the authors' code.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf


def _dot(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
  """<a, b> as one BLAS dot product: one pass over memory, no elementwise temporary."""
  return tf.tensordot(tf.reshape(a, [-1]), tf.reshape(b, [-1]), 1)


def partial_sums(update: Sequence[tf.Tensor], model: Sequence[tf.Tensor]) -> tf.Tensor:
  """[T, 3] per tensor: <w_g, w_k>, ||w_g||^2, ||w_k||^2 with w_k = w_g - Delta_k.

  From three dot products that never form w_k: <w_g, w_k> = ||w_g||^2 - <w_g, Delta>, ||w_k||^2 =
  ||w_g||^2 - 2 <w_g, Delta> + ||Delta||^2 (floored at 0). Exact where it matters: Delta = w_g
  (w_k = 0) gives 0 and 0 bit for bit, since <w_g, Delta> and ||Delta||^2 are then the same
  computation as ||w_g||^2.
  """
  rows = []
  for g, u in zip(model, update):
    gg, gu, uu = _dot(g, g), _dot(g, u), _dot(u, u)
    rows.append(tf.stack([gg - gu, gg, tf.maximum(gg - 2.0 * gu + uu, 0.0)]))
  return tf.stack(rows)


def cosine(sums: tf.Tensor) -> tf.Tensor:
  """Cosines from [..., 3] partial sums; 1 where either norm is zero; clipped to [-1, 1]."""
  dot, gg, kk = sums[..., 0], sums[..., 1], sums[..., 2]
  defined = tf.logical_and(gg > 0, kk > 0)
  denom = tf.where(defined, tf.sqrt(gg) * tf.sqrt(kk), tf.ones_like(gg))
  return tf.where(defined, tf.clip_by_value(dot / denom, -1.0, 1.0), tf.ones_like(dot))


def group_cosines(sums: tf.Tensor, group_index: Sequence[int], num_groups: int) -> tf.Tensor:
  """[L] cosine of each group of tensors (`group_index[t]`: tensor t's group)."""
  return cosine(tf.math.unsorted_segment_sum(sums, tf.constant(list(group_index), tf.int32),
                                             num_groups))


def model_cosine(sums: tf.Tensor) -> tf.Tensor:
  """The whole model's cosine (M-DAWA's delta_k; the L-DAWA paper's Fig. 4 averages it)."""
  return cosine(tf.reduce_sum(sums, axis=0))


def scaled_update(update: Sequence[tf.Tensor], model: Sequence[tf.Tensor],
                  scale: Sequence[tf.Tensor]) -> list[tf.Tensor]:
  """v_k with w_g - v_k = scale * w_k per tensor: the update whose mean gives sum beta delta w_k.

  v = w_g - s (w_g - Delta) = (1 - s) w_g + s Delta; s = 1 leaves the update unchanged.
  """
  return [(1.0 - s) * g + s * u for g, u, s in zip(model, update, scale)]
