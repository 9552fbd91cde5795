"""MoCo v3's in-batch contrastive loss against a NumPy reference, the 2t scale, stop-gradient keys,
and per-client losses equal to each client's own."""

import numpy as np
import tensorflow as tf

from tff_ssl.ssl import mocov3


def unit(a):
  return a / np.linalg.norm(a, axis=1, keepdims=True)


def ctr_reference(q, k, t):
  q, k = unit(q), unit(k)
  logits = q @ k.T / t
  ce = [np.log(np.sum(np.exp(logits[i]))) - logits[i, i] for i in range(len(q))]
  return 2 * t * np.mean(ce)


def test_symmetrized_loss_matches_numpy():
  rng = np.random.default_rng(0)
  p1, p2, t1, t2 = (rng.normal(size=(6, 8)) for _ in range(4))
  want = ctr_reference(p1, t2, 0.2) + ctr_reference(p2, t1, 0.2)
  got = mocov3.mocov3_loss(*(tf.constant(x, tf.float32) for x in (p1, p2, t1, t2)), 0.2)
  np.testing.assert_allclose(float(got), want, rtol=1e-5)


def test_by_hand_with_two_orthogonal_images():
  # q_i = k_i = e_i: logits diag 1/t, off-diagonal 0; CE = log(1 + e^{-1/t}), times 2t, per direction.
  e = np.eye(2)
  got = mocov3.contrastive_loss(tf.constant(e), tf.constant(e), 0.5)
  np.testing.assert_allclose(float(got), 2 * 0.5 * np.log1p(np.exp(-2.0)), rtol=1e-6)


def test_keys_get_no_gradient():
  rng = np.random.default_rng(1)
  q, k = (tf.Variable(rng.normal(size=(4, 5)), dtype=tf.float32) for _ in range(2))
  with tf.GradientTape() as tape:
    loss = mocov3.contrastive_loss(q, k, 0.2)
  gq, gk = tape.gradient(loss, [q, k])
  assert gk is None and float(tf.reduce_sum(tf.abs(gq))) > 0


def test_per_client_losses_are_each_clients_own():
  rng = np.random.default_rng(2)
  sizes = [3, 2, 4]
  p1, p2, t1, t2 = (rng.normal(size=(9, 6)).astype(np.float32) for _ in range(4))
  got = mocov3.mocov3_loss_per_client(p1, p2, t1, t2, sizes, 0.2).numpy()
  start = 0
  for k, n in enumerate(sizes):
    rows = slice(start, start + n)
    want = mocov3.mocov3_loss(p1[rows], p2[rows], t1[rows], t2[rows], 0.2)
    np.testing.assert_allclose(got[k], float(want), rtol=1e-5)
    start += n
