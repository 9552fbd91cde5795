"""FedU²'s flexible uniform regularizer, FUR (Liao et al., "Rethinking the Representation in Federated
Unsupervised Learning with Non-IID Data", CVPR 2024): a client's projections are pulled towards the
uniform distribution on the unit sphere, against the dimensional collapse that non-IID clients suffer.

For a batch of projections z_1..z_N ([N, d]), L2-normalized to the sphere, N reference points u_j
drawn uniformly on the sphere, K tangent points t_k (uniform too) and, for each, L random directions
theta_kl (standard normal, not normalized):

    FUR(z) = (1/K) sum_k SW2(Log_{t_k}(u), Log_{t_k}(z))
    SW2(X, Y) = mean_{l, i} (sort_i(X theta_kl)_i - sort_i(Y theta_kl)_i)^2     (sliced Wasserstein-2)
    Log_t(x) = (acos c / sqrt(1 - c^2)) (x - c t),  c = <t, x>                   (the sphere's log map)

The authors' code (FedU2 `sw_loss.py`, `RepresentationTagentCollapse`) takes K = N tangent points and
divides by 6 (its `num_tangent_space`), with L = 6 directions, and maps BYOL's unnormalized projections
(geoopt clamps <t, z> into [-1, 1]); here K = `TANGENTS` = 6 and L = `DIRECTIONS` = 6 (a mean over six
tangent spaces, the paper's number), the projections normalized first.
"""

from __future__ import annotations

import tensorflow as tf

TANGENTS = 6
DIRECTIONS = 6
_EDGE = 1e-6  # <t, x> kept inside (-1, 1): acos and 1/sin have finite gradients there.


def sphere_log(t: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
  """Log_t(x) for a unit `t` ([d]) and unit rows `x` ([N, d]): the tangent vector at t pointing to
  x, of length the geodesic distance."""
  c = tf.clip_by_value(tf.linalg.matvec(x, t), -1.0 + _EDGE, 1.0 - _EDGE)
  scale = tf.acos(c) / tf.sqrt(1.0 - tf.square(c))
  return scale[:, None] * (x - c[:, None] * t[None, :])


def sliced_wasserstein(x: tf.Tensor, y: tf.Tensor, directions: tf.Tensor) -> tf.Tensor:
  """SW2 between the point sets `x`, `y` ([N, d] each) along `directions` ([L, d])."""
  px = tf.sort(tf.matmul(x, directions, transpose_b=True), axis=0)
  py = tf.sort(tf.matmul(y, directions, transpose_b=True), axis=0)
  return tf.reduce_mean(tf.square(px - py))


def fur_loss(z: tf.Tensor, references: tf.Tensor, tangents: tf.Tensor,
             directions: tf.Tensor) -> tf.Tensor:
  """FUR(z) (module docstring) with its random draws given: `references` [N, d] and `tangents` [K, d]
  (any scale: normalized here), `directions` [K, L, d]."""
  z = tf.math.l2_normalize(z, axis=1)
  u = tf.math.l2_normalize(tf.cast(references, z.dtype), axis=1)
  tangents = tf.math.l2_normalize(tf.cast(tangents, z.dtype), axis=1)
  directions = tf.cast(directions, z.dtype)
  k = int(tangents.shape[0])
  return tf.add_n([sliced_wasserstein(sphere_log(tangents[i], u), sphere_log(tangents[i], z),
                                      directions[i]) for i in range(k)]) / k


def draws(seed, n, d, tangents: int = TANGENTS, directions: int = DIRECTIONS):
  """FUR's random draws for a batch of `n` projections of size `d`, from a stateless `seed`:
  (references [n, d], tangents [K, d], directions [K, L, d]), all standard normal."""
  seeds = tf.random.experimental.stateless_split(seed, 3)
  return (tf.random.stateless_normal([n, d], seeds[0]),
          tf.random.stateless_normal([tangents, d], seeds[1]),
          tf.random.stateless_normal([tangents, directions, d], seeds[2]))
