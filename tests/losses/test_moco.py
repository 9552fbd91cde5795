"""MoCo's InfoNCE against a NumPy reference, the queue's FIFO order, and per-client segment means."""

import numpy as np
import tensorflow as tf

from tff_ssl.ssl import moco


def unit(a):
  return a / np.linalg.norm(a, axis=1, keepdims=True)


def info_nce_reference(q, k, queue, t):
  q, k, queue = unit(q), unit(k), unit(queue)
  out = []
  for i in range(q.shape[0]):
    logits = np.concatenate([[q[i] @ k[i]], queue @ q[i]]) / t
    out.append(-logits[0] + np.log(np.sum(np.exp(logits))))
  return np.array(out)


def test_symmetrized_loss_matches_numpy():
  rng = np.random.default_rng(0)
  z1, z2, t1, t2 = (rng.normal(size=(5, 8)) for _ in range(4))
  queue = rng.normal(size=(7, 8))
  want = np.mean(info_nce_reference(z1, t2, queue, 0.2) + info_nce_reference(z2, t1, queue, 0.2))
  got = moco.moco_loss(*(tf.constant(x, tf.float32) for x in (z1, z2, t1, t2, queue)), 0.2)
  np.testing.assert_allclose(float(got), want, rtol=1e-5)


def test_by_hand_with_orthogonal_keys():
  # q = k = e1, one queue key e2 orthogonal: L = -log(e^{1/t} / (e^{1/t} + e^0)), t = 0.5.
  e1, e2 = np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]])
  got = moco.info_nce_per_sample(tf.constant(e1), tf.constant(e1), tf.constant(e2), 0.5)
  np.testing.assert_allclose(got.numpy(), [np.log1p(np.exp(-2.0))], rtol=1e-6)
  # A zero key (the initial queue) adds exp(0) = 1 to the denominator, as e2 does.
  got = moco.info_nce_per_sample(tf.constant(e1), tf.constant(e1), tf.zeros([1, 2], tf.float64),
                                 0.5)
  np.testing.assert_allclose(got.numpy(), [np.log1p(np.exp(-2.0))], rtol=1e-6)


def test_keys_stop_gradients():
  q = tf.Variable([[1.0, 2.0]])
  k = tf.Variable([[2.0, 1.0]])
  queue = tf.Variable([[0.0, 1.0], [1.0, 0.0]])
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(moco.info_nce_per_sample(q, k, queue, 0.2))
  gq, gk, gqueue = tape.gradient(loss, [q, k, queue])
  assert gq is not None and gk is None and gqueue is None


def test_enqueue_is_first_in_first_out():
  queue = tf.constant([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
  keys = tf.constant([[3.0, 4.0]])
  out = moco.enqueue(queue, keys).numpy()
  np.testing.assert_allclose(out, [[0.6, 0.8], [1.0, 0.0], [0.0, 1.0]], rtol=1e-6)
  out = moco.enqueue(tf.constant(out), tf.constant([[0.0, 2.0], [2.0, 0.0]])).numpy()
  np.testing.assert_allclose(out, [[0.0, 1.0], [1.0, 0.0], [0.6, 0.8]], rtol=1e-6)


def test_per_client_losses_are_each_clients_own():
  rng = np.random.default_rng(1)
  sizes = [3, 1, 4]
  z1, z2, t1, t2 = (rng.normal(size=(8, 6)).astype(np.float32) for _ in range(4))
  queue = rng.normal(size=(5, 6)).astype(np.float32)
  got = moco.moco_loss_per_client(z1, z2, t1, t2, queue, tf.constant(sizes), 0.3).numpy()
  start = 0
  for k, n in enumerate(sizes):
    rows = slice(start, start + n)
    want = moco.moco_loss(z1[rows], z2[rows], t1[rows], t2[rows], queue, 0.3)
    np.testing.assert_allclose(got[k], float(want), rtol=1e-5)
    start += n
