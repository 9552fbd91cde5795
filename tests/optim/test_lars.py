"""LARS: a hand-computed step, exclusion of biases, and the optimizer registry."""

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl import optim
from tff_ssl.optim import LARS


def test_two_hand_computed_steps():
  w = tf.Variable([[3.0, 4.0]], name="kernel")  # ||w|| = 5; rank 2, so LARS adapts it.
  g = tf.constant([[0.6, 0.8]])  # ||g|| = 1
  opt = LARS(learning_rate=1.0, momentum=0.9, eta=0.001)
  opt.apply_gradients([(g, w)])
  # trust = 0.001 * 5 / 1 = 0.005; v = 0.005 * g = [0.003, 0.004]; w = [2.997, 3.996].
  np.testing.assert_allclose(w.numpy(), [[2.997, 3.996]], rtol=1e-6)
  opt.apply_gradients([(g, w)])
  trust = 0.001 * np.hypot(2.997, 3.996)
  v = 0.9 * np.array([0.003, 0.004]) + trust * np.array([0.6, 0.8])
  np.testing.assert_allclose(w.numpy(), [np.array([2.997, 3.996]) - v], rtol=1e-6)


def test_bias_is_not_adapted_and_zero_weights_take_a_plain_step():
  b = tf.Variable([[1.0, 1.0]], name="bias")  # Excluded by name although of rank 2.
  v = tf.Variable([1.0, 1.0], name="kernel")  # Excluded by rank (1), whatever its name.
  k = tf.Variable([[0.0, 0.0]], name="kernel")
  opt = LARS(learning_rate=0.5, momentum=0.0, eta=0.001)
  g = tf.constant([2.0, 4.0])
  opt.apply_gradients([(g[None], b), (g, v), (g[None], k)])
  np.testing.assert_allclose(b.numpy(), [[0.0, -1.0]])
  np.testing.assert_allclose(v.numpy(), [0.0, -1.0])
  np.testing.assert_allclose(k.numpy(), [[-1.0, -2.0]])  # ||w|| = 0: trust ratio 1.


def test_weight_decay_enters_the_gradient():
  w = tf.Variable([[3.0, 4.0]], name="kernel")
  opt = LARS(learning_rate=1.0, momentum=0.0, eta=1.0, lars_weight_decay=0.1)
  opt.apply_gradients([(tf.constant([[0.0, 0.0]]), w)])
  # g = 0.1 * w = [0.3, 0.4] (norm 0.5); trust = 5 / 0.5 = 10; w -= 10 * g = [0, 0].
  np.testing.assert_allclose(w.numpy(), [[0.0, 0.0]], atol=1e-6)


@pytest.mark.parametrize("name", optim.names("centralized"))
def test_registry_optimizers_reduce_a_quadratic(name):
  w = tf.Variable([[2.0, -3.0]], name="kernel")
  opt = optim.make_optimizer(name, {"adam": 0.1, "adamw": 0.1, "sgd": 0.05, "sgdm": 0.05, "lars": 50.0}[name], 100)
  start = float(tf.reduce_sum(w ** 2))
  for _ in range(20):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(w ** 2)
    opt.apply_gradients([(tape.gradient(loss, w), w)])
  assert float(tf.reduce_sum(w ** 2)) < 0.5 * start


def test_unknown_optimizer_raises():
  with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'"):
    optim.make_optimizer("rmsprop", 0.1, 10)
