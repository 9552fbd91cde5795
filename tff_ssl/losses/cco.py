"""Cross-correlation optimization (CCO) loss, split into encoding statistics and loss-from-statistics.

DCCO (Vemulapalli et al., 2023, eq. 1-2) rests on one fact: the CCO loss is a function of five batch
statistics of the two encodings F and G, and the statistics of a union of batches are the size-weighted
means of the parts' statistics. Keeping the two steps separate pure functions lets a federated round
average the statistics (phase 1) and every client evaluate the loss on the aggregate (phase 2).

    L = sum_i (1 - C_ii)^2 + lambda * sum_i 1/(d-1) sum_{j != i} C_ij^2                      (eq. 1)
    C_ij = (<F_i G_j> - <F_i><G_j>) / (sqrt(<F_i^2> - <F_i>^2) sqrt(<G_j^2> - <G_j>^2))      (eq. 2)
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import tensorflow as tf

DEFAULT_LAMBDA = 20.0  # The paper's trade-off (Sec. 4.1).
DEFAULT_EPS = 1e-6  # Added to variances; keeps a constant encoding dimension finite.


class EncodingStatistics(NamedTuple):
  """Batch means of two encodings F, G (each [N, d]); enough to evaluate the CCO loss."""

  mean_f: tf.Tensor  # <F_i>, [d]
  mean_f2: tf.Tensor  # <F_i^2>, [d]
  mean_g: tf.Tensor  # <G_j>, [d]
  mean_g2: tf.Tensor  # <G_j^2>, [d]
  mean_fg: tf.Tensor  # <F_i G_j>, [d, d]


def _check_encodings(f: tf.Tensor, g: tf.Tensor) -> None:
  if f.shape.rank != 2 or g.shape.rank != 2:
    raise ValueError(f"encodings must be rank-2 [batch, dim]; got shapes {f.shape} and {g.shape}")
  if f.shape[1] is not None and g.shape[1] is not None and f.shape[1] != g.shape[1]:
    raise ValueError(
        f"encodings F and G must have the same dimension; got {f.shape[1]} and {g.shape[1]}")


def encoding_statistics(f: tf.Tensor, g: tf.Tensor) -> EncodingStatistics:
  """The five CCO statistics of encodings `f` and `g` ([N, d] each) over their N rows.

  Valid for N = 1 (a one-image client): its statistics are meaningful once averaged with others.
  """
  f = tf.convert_to_tensor(f)
  g = tf.convert_to_tensor(g, dtype=f.dtype)
  _check_encodings(f, g)
  n = tf.cast(tf.shape(f)[0], f.dtype)
  return EncodingStatistics(
      mean_f=tf.reduce_mean(f, axis=0),
      mean_f2=tf.reduce_mean(tf.square(f), axis=0),
      mean_g=tf.reduce_mean(g, axis=0),
      mean_g2=tf.reduce_mean(tf.square(g), axis=0),
      mean_fg=tf.matmul(f, g, transpose_a=True) / n,
  )


def clipped_statistics_sum(f: tf.Tensor, g: tf.Tensor, segments: tf.Tensor, count, clip
                           ) -> tuple[EncodingStatistics, tf.Tensor]:
  """sum_k min(1, clip / ||S_k||) S_k over the clients k of a batch, where S_k = N_k <>_k is client
  k's sum of the five per-image terms (f, f^2, g, g^2, f g^T) and ||S_k|| the L2 norm of all of them
  together (DP-DCCO's phase-1 record, clipped per client); also the clients' norms [count].

  `segments` [N]: each row's client in [0, count). No client's d x d matrix is formed: the norm of
  sum_i f_i g_i^T is sum_{i,j in k} (f_i . f_j)(g_i . g_j), from the rows' Gram matrices, and the
  clipped sum weighs each row by its client's factor.
  """
  f = tf.convert_to_tensor(f)
  g = tf.convert_to_tensor(g, dtype=f.dtype)
  _check_encodings(f, g)
  onehot = tf.one_hot(segments, count, dtype=f.dtype)  # [N, K]
  vector_sq = tf.zeros([count], f.dtype)
  for x in (f, tf.square(f), g, tf.square(g)):
    vector_sq += tf.reduce_sum(tf.square(tf.matmul(onehot, x, transpose_a=True)), axis=1)
  same = tf.matmul(onehot, onehot, transpose_b=True)  # [N, N]: rows of one client.
  pair = tf.matmul(f, f, transpose_b=True) * tf.matmul(g, g, transpose_b=True) * same
  matrix_sq = tf.matmul(onehot, tf.reduce_sum(pair, axis=1, keepdims=True), transpose_a=True)[:, 0]
  norms = tf.sqrt(vector_sq + tf.maximum(matrix_sq, 0.0))
  factor = tf.minimum(1.0, tf.cast(clip, f.dtype) * tf.math.reciprocal_no_nan(norms))
  factor = tf.where(norms > 0, factor, 1.0)
  w = tf.gather(factor, segments)[:, None]
  return EncodingStatistics(
      mean_f=tf.reduce_sum(w * f, axis=0),
      mean_f2=tf.reduce_sum(w * tf.square(f), axis=0),
      mean_g=tf.reduce_sum(w * g, axis=0),
      mean_g2=tf.reduce_sum(w * tf.square(g), axis=0),
      mean_fg=tf.matmul(w * f, g, transpose_a=True)), norms


def weighted_mean_statistics(stats: Sequence[EncodingStatistics],
                             weights: Sequence[float]) -> EncodingStatistics:
  """The weighted mean of several batches' statistics: the union's statistics when weights are N_k."""
  if len(stats) != len(weights) or not stats:
    raise ValueError(f"need one weight per statistics tuple; got {len(stats)} tuples, "
                     f"{len(weights)} weights")
  w = tf.convert_to_tensor(weights, dtype=stats[0].mean_f.dtype)
  w = w / tf.reduce_sum(w)
  return EncodingStatistics(*[
      tf.add_n([w[k] * s[field] for k, s in enumerate(stats)])
      for field in range(len(EncodingStatistics._fields))
  ])


def cross_correlation(stats: EncodingStatistics, eps: float = DEFAULT_EPS) -> tf.Tensor:
  """The d x d correlation matrix C of eq. 2 from the statistics."""
  var_f = tf.maximum(stats.mean_f2 - tf.square(stats.mean_f), 0.0)
  var_g = tf.maximum(stats.mean_g2 - tf.square(stats.mean_g), 0.0)
  cov = stats.mean_fg - stats.mean_f[:, None] * stats.mean_g[None, :]
  return cov / (tf.sqrt(var_f + eps)[:, None] * tf.sqrt(var_g + eps)[None, :])


def cco_loss_from_statistics(stats: EncodingStatistics,
                             lambd: float = DEFAULT_LAMBDA,
                             eps: float = DEFAULT_EPS) -> tf.Tensor:
  """CCO loss (eq. 1) from the five statistics; a scalar."""
  c = cross_correlation(stats, eps)
  d = tf.shape(c)[0]
  diag = tf.linalg.diag_part(c)
  on_diag = tf.reduce_sum(tf.square(1.0 - diag))
  off_diag = tf.reduce_sum(tf.square(c)) - tf.reduce_sum(tf.square(diag))
  return on_diag + lambd * off_diag / tf.cast(d - 1, c.dtype)


def cco_loss(f: tf.Tensor, g: tf.Tensor, lambd: float = DEFAULT_LAMBDA,
             eps: float = DEFAULT_EPS) -> tf.Tensor:
  """Within-batch CCO loss of encodings `f`, `g` ([N, d]); needs N >= 2 (correlations of one sample
  are undefined)."""
  f = _check_batch_of_at_least_two(tf.convert_to_tensor(f), "CCO")
  return cco_loss_from_statistics(encoding_statistics(f, g), lambd, eps)


def _check_batch_of_at_least_two(x: tf.Tensor, loss_name: str) -> tf.Tensor:
  """`x`, checked to hold >= 2 rows: statically when the shape is known, else when it is computed."""
  message = (f"a within-batch {loss_name} loss needs at least 2 samples per batch; got {{}}. Clients "
             "with a single sample need DCCO (statistics aggregated across clients) instead")
  n = x.shape[0]
  if n is not None:
    if n < 2:
      raise ValueError(message.format(n))
    return x
  check = tf.debugging.assert_greater_equal(tf.shape(x)[0], 2, message=message.format("fewer"))
  with tf.control_dependencies([check] if check is not None else []):
    return tf.identity(x)
