"""BYOL (Grill et al., 2020): the online prediction of one view regresses the target projection of the
other; the target network is the EMA of the online one (decay `target_decay`) over the client's local
steps, started each round from the broadcast model (FedAvg-style BYOL keeps no state on clients; the
stateful FedBYOL / FedEMA family is a later strategy). Online encoder, projector and predictor are
uploaded and averaged.

The loss: the online network's prediction q of one view regresses the target network's projection z'
of the other view; with both l2-normalized (eq. 2),

    L(q, z') = || q/||q|| - z'/||z'|| ||^2 = 2 - 2 cos(q, z'),

and the symmetrized loss swaps the views and sums the two terms: L^BYOL = L + L~ (Sec. 3.1). The
loss is a mean of per-sample terms with no within-batch interaction, so it is defined for N >= 1 and
a group of clients' losses are segment means of the same per-sample terms (`byol_loss_per_client`).
"""

from __future__ import annotations

import tensorflow as tf

from tff_ssl.config_fields import Field
from tff_ssl.losses import per_client
from tff_ssl.losses.pairs import check_pairs, cosine_similarity
from tff_ssl.ssl.base import SSLMethod

DEFAULT_TARGET_DECAY = 0.99  # BYOL's target EMA within local training (FedEMA's setting).


def byol_loss_per_sample(p1: tf.Tensor, p2: tf.Tensor, t1: tf.Tensor, t2: tf.Tensor) -> tf.Tensor:
  """[N] symmetrized BYOL terms (2 - 2 cos(p1_i, t2_i)) + (2 - 2 cos(p2_i, t1_i)); see byol_loss."""
  p1 = tf.convert_to_tensor(p1)
  p2, t1, t2 = (tf.convert_to_tensor(x, dtype=p1.dtype) for x in (p2, t1, t2))
  check_pairs(p1, t2)
  check_pairs(p2, t1)
  # The target network is updated by a moving average of the online weights, never by this loss.
  t1, t2 = tf.stop_gradient(t1), tf.stop_gradient(t2)
  return (2.0 - 2.0 * cosine_similarity(p1, t2)) + (2.0 - 2.0 * cosine_similarity(p2, t1))


def byol_loss(p1: tf.Tensor, p2: tf.Tensor, t1: tf.Tensor, t2: tf.Tensor) -> tf.Tensor:
  """Symmetrized BYOL loss (Grill et al., 2020, eq. 2 and L^BYOL = L + L~); a scalar in [0, 8].

  mean_i (2 - 2 cos(p1_i, t2_i)) + mean_i (2 - 2 cos(p2_i, t1_i)): view 1's prediction regresses
  view 2's target projection and vice versa. The targets pass through `tf.stop_gradient` here, so
  the loss differentiates only through the online predictions. Works for N >= 1.

  Args:
    p1: [N, d] online network predictions q_theta(z_theta) of view 1.
    p2: [N, d] online network predictions of view 2.
    t1: [N, d] target network projections z'_xi of view 1.
    t2: [N, d] target network projections of view 2.

  Returns:
    The scalar loss.
  """
  return tf.reduce_mean(byol_loss_per_sample(p1, p2, t1, t2))


def byol_loss_per_client(p1: tf.Tensor, p2: tf.Tensor, t1: tf.Tensor, t2: tf.Tensor,
                         sizes: tf.Tensor) -> tf.Tensor:
  """[K] symmetrized BYOL losses (`byol_loss`, targets stop-gradiented) of clients whose rows of
  `p1`, `p2`, `t1`, `t2` have the given sizes; a one-sample client is fine."""
  return per_client.mean_per_client(byol_loss_per_sample(p1, p2, t1, t2), sizes)


METHOD = SSLMethod(
    name="byol",
    loss=lambda o, hp: byol_loss(o.p1, o.p2, o.t1, o.t2),
    per_client_loss=lambda o, sizes, hp: byol_loss_per_client(o.p1, o.p2, o.t1, o.t2, sizes),
    predictor=True, ema_target=True, min_samples=1, hparams=("target_decay", "predictor"),
    fields=(Field("target_decay", DEFAULT_TARGET_DECAY, "BYOL, MoCo: EMA decay of the target "
                  "network over local steps.", lower=0, upper=1, open_upper=True),),
    # --head_norm=batch: BYOL: projector and predictor Linear-BN-ReLU-Linear.
    batch_heads="hidden")
