"""FedX's losses against a NumPy transcription of their equations (tff_ssl/methods/fedx.py's
docstring; FEDX losses.py), in float64."""

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl.methods import fedx as relational


def _unit(x):
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def _softmax(s):
  e = np.exp(s - s.max(axis=1, keepdims=True))
  return e / e.sum(axis=1, keepdims=True)


def _relational(u1, u2, a, tau, tau_t):
  """Each image's two similarity distributions over the anchors; KL of each from their mixture."""
  s1, s2 = _unit(u1) @ _unit(a).T, _unit(u2) @ _unit(a).T
  r1, r2 = _softmax(s1 / tau), _softmax(s2 / tau)
  m = 0.5 * (_softmax(s1 / tau_t) + _softmax(s2 / tau_t))
  kl = lambda p, q: np.sum(p * np.log(p / q), axis=1)  # noqa: E731  KL(p || q) per row
  return float(np.mean(0.5 * (kl(m, r1) + kl(m, r2))))


def _nt_xent(a, b, tau):
  """SimCLR's loss written row by row: anchor i of the 2N, its positive the other view's i."""
  z = _unit(np.concatenate([a, b]))
  n = len(a)
  total = 0.0
  for i in range(2 * n):
    logits = z @ z[i] / tau
    pos = (i + n) % (2 * n)
    others = [j for j in range(2 * n) if j != i]
    total += -logits[pos] + np.log(np.sum(np.exp(logits[others])))
  return total / (2 * n)


def _batch(seed, *shapes):
  rng = np.random.default_rng(seed)
  return [rng.normal(size=s) for s in shapes]


@pytest.mark.parametrize("tau,tau_t", [(0.1, None), (0.5, 0.05)])
def test_relational_loss_equals_the_numpy_equations(tau, tau_t):
  u1, u2, a = _batch(0, (6, 5), (6, 5), (4, 5))
  got = relational.relational_loss(tf.constant(u1), tf.constant(u2), tf.constant(a), tau, tau_t)
  assert got.dtype == tf.float64
  np.testing.assert_allclose(float(got), _relational(u1, u2, a, tau, tau_t if tau_t else tau),
                             rtol=1e-12)


def test_relational_loss_is_zero_for_equal_views_and_positive_otherwise():
  u1, u2, a = _batch(1, (5, 3), (5, 3), (7, 3))
  assert abs(float(relational.relational_loss(tf.constant(u1), tf.constant(u1), tf.constant(a)))) < 1e-12
  assert float(relational.relational_loss(tf.constant(u1), tf.constant(u2), tf.constant(a))) > 0.01


def test_fedx_terms_equal_the_numpy_equations_and_the_global_outputs_get_no_gradient():
  z1, z2, q1, q2, za, g2, ga = _batch(2, (6, 4), (6, 4), (6, 4), (6, 4), (5, 4), (6, 4), (5, 4))
  tensors = [tf.Variable(x) for x in (z1, z2, q1, q2, za, g2, ga)]
  with tf.GradientTape() as tape:
    terms = relational.fedx_terms(*tensors, temperature=0.2)
    total = tf.add_n(list(terms.values()))
  assert sorted(terms) == ["global_contrastive", "global_relational", "local_relational"]
  np.testing.assert_allclose(float(terms["global_contrastive"]), _nt_xent(q1, g2, 0.2), rtol=1e-12)
  np.testing.assert_allclose(float(terms["local_relational"]), _relational(z1, z2, za, 0.2, 0.2),
                             rtol=1e-12)
  np.testing.assert_allclose(float(terms["global_relational"]), _relational(q1, q2, ga, 0.2, 0.2),
                             rtol=1e-12)
  grads = tape.gradient(total, tensors)
  assert grads[-2] is None and grads[-1] is None  # The frozen global model's projections.
  assert all(float(tf.norm(g)) > 0 for g in grads[:5])  # The local anchors are trained too.


def test_bad_temperature_is_refused():
  u = tf.ones([2, 3])
  with pytest.raises(ValueError, match="temperatures must be > 0"):
    relational.relational_loss(u, u, u, 0.0)


def test_a_sharp_temperature_stays_finite_where_the_softmax_underflows():
  u1, u2, a = _batch(3, (4, 6), (4, 6), (9, 6))
  got = relational.relational_loss(tf.constant(u1, tf.float32), tf.constant(u2, tf.float32),
                                   tf.constant(a, tf.float32), 0.01)
  # exp(-200) underflows float32 (not float64, the reference): log m stays finite all the same.
  np.testing.assert_allclose(float(got), _relational(u1, u2, a, 0.01, 0.01), rtol=1e-3)
