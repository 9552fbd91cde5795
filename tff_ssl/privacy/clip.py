"""The one L2 clip rule of every private release: a record of norm ||r|| is scaled by

    clip * min(1 / ||r||, 1 / clip)        (min(1, clip / ||r||); 1 for a zero record)

as tensorflow_privacy's per-record clip scales it (`tf.clip_by_global_norm`, which the queries'
`preprocess_record` calls for DP-FedAvg's updates and DP-DCCO's per-client loop). DP-DCCO's
vectorized records (its statistics' per-client sums, `StatisticsLoss.clipped_sum`, and its
per-image update records, `methods.dcco_private.clipped_records`) compute many records' norms at
once and scale them by `factors`; tests/test_single_paths.py keeps clip factors in this package.
"""

from __future__ import annotations

import tensorflow as tf


def factors(norms, clip) -> tf.Tensor:
  """Each record's scale under an L2 clip at `clip` (a tensor or a Python number, taken at full
  precision in `norms`' dtype), given the records' norms."""
  clip = tf.cast(tf.convert_to_tensor(clip, dtype_hint=norms.dtype), norms.dtype)
  return clip * tf.minimum(tf.math.reciprocal(norms), tf.math.reciprocal(clip))
