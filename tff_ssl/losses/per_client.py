"""Within-client losses for many clients at once, from one batched forward pass: the shared layout.

A group of K clients' projections arrives concatenated ([sum N_k, d]) with the clients' sizes. A loss's
per-client form (beside the loss, in its own module: `tff_ssl.ssl.<name>`, `tff_ssl.losses.cco`) lays
the rows out as [K, m, d] (m = max N_k, zero-padded, with a [K, m] mask: `pad_by_client`), or, for a
mean of per-sample terms (BYOL, SimSiam, MoCo), segment-sums them by client (`mean_per_client`), and
returns one loss per client, each equal (to float round-off) to the single-client loss on that
client's rows alone. The grouped simulation (`tff_ssl.federated.grouping`) uses them so that the
encoder runs once for the whole group while every client still gets its own within-client loss. A
method without a per-client form gets a loop over the clients (`tff_ssl.ssl.base.SSLMethod`).
"""

from __future__ import annotations

import tensorflow as tf


def segment_ids(sizes: tf.Tensor) -> tf.Tensor:
  """[sum sizes] client index of every row, for rows concatenated client by client."""
  sizes = tf.convert_to_tensor(sizes, tf.int32)
  return tf.repeat(tf.range(tf.shape(sizes)[0]), sizes)


def pad_by_client(x: tf.Tensor, sizes: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """Rows of `x` ([sum N_k, ...], client by client) as [K, max N_k, ...] plus a float [K, m] mask."""
  sizes = tf.convert_to_tensor(sizes, tf.int32)
  seg = segment_ids(sizes)
  offsets = tf.cumsum(sizes, exclusive=True)
  position = tf.range(tf.shape(seg)[0]) - tf.gather(offsets, seg)
  index = tf.stack([seg, position], axis=1)
  k, m = tf.shape(sizes)[0], tf.reduce_max(sizes)
  padded = tf.scatter_nd(index, x, tf.concat([[k, m], tf.shape(x)[1:]], axis=0))
  mask = tf.scatter_nd(index, tf.ones_like(seg, x.dtype), [k, m])
  return padded, mask


def mean_per_client(per_sample: tf.Tensor, sizes: tf.Tensor) -> tf.Tensor:
  """[K] means of per-sample values ([sum N_k], client by client) over each client's rows."""
  sizes = tf.convert_to_tensor(sizes, tf.int32)
  # unsorted_segment_sum with an explicit count keeps a trailing empty client's slot (segment_sum
  # would drop it); that client's mean is then 0/0 = NaN, as a single-client mean of no rows is.
  sums = tf.math.unsorted_segment_sum(per_sample, segment_ids(sizes), tf.shape(sizes)[0])
  return sums / tf.cast(sizes, per_sample.dtype)
