"""NT-Xent, the normalized-temperature cross-entropy loss of SimCLR (Chen et al., 2020)."""

from __future__ import annotations

import tensorflow as tf

from tff_ssl.losses import statistics

DEFAULT_TEMPERATURE = 0.1  # DCCO's setting for its contrastive baseline (Sec. 4.1).


def nt_xent_loss(z1: tf.Tensor, z2: tf.Tensor,
                 temperature: float = DEFAULT_TEMPERATURE) -> tf.Tensor:
  """Mean NT-Xent loss over the 2N anchors of two views `z1`, `z2` ([N, d] each).

  Each anchor's positive is the other view of the same sample; its negatives are the other 2N - 2
  encodings of the batch. Needs N >= 2.
  """
  if temperature <= 0:
    raise ValueError(f"temperature must be > 0; got {temperature}")
  z1 = tf.convert_to_tensor(z1)
  z2 = tf.convert_to_tensor(z2, dtype=z1.dtype)
  statistics.check_encodings(z1, z2)
  z1 = statistics.check_batch(z1, "NT-Xent")
  z = tf.math.l2_normalize(tf.concat([z1, z2], axis=0), axis=1)
  n = tf.shape(z1)[0]
  logits = tf.matmul(z, z, transpose_b=True) / temperature
  logits -= tf.eye(2 * n, dtype=logits.dtype) * 1e9  # An anchor is not its own negative.
  positives = tf.concat([tf.range(n, 2 * n), tf.range(0, n)], axis=0)
  return tf.reduce_mean(
      tf.nn.sparse_softmax_cross_entropy_with_logits(labels=positives, logits=logits))
