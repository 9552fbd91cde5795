"""Server LARS (tff.learning.optimizers): hand-computed steps, schedule compatibility."""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl.optim.tff_lars import LARSOptimizer


def test_hand_computed_step_adapts_kernels_not_biases():
  opt = LARSOptimizer(learning_rate=1.0, momentum=0.9, eta=0.001)
  weights = (tf.constant([[3.0, 4.0]]), tf.constant([1.0, 1.0]))
  grads = (tf.constant([[0.6, 0.8]]), tf.constant([2.0, 4.0]))
  state = opt.initialize(tuple(tf.TensorSpec(w.shape, w.dtype) for w in weights))
  state, new = opt.next(state, weights, grads)
  # Kernel: trust = 0.001 * 5 / 1 -> step 0.005 * g. Bias (rank 1): plain step lr * g.
  np.testing.assert_allclose(new[0].numpy(), [[2.997, 3.996]], rtol=1e-6)
  np.testing.assert_allclose(new[1].numpy(), [-1.0, -3.0], rtol=1e-6)
  state, new2 = opt.next(state, new, grads)
  np.testing.assert_allclose(new2[1].numpy(), [-1.0 - (0.9 * 2 + 2), -3.0 - (0.9 * 4 + 4)],
                             rtol=1e-6)


def test_works_with_a_learning_rate_schedule():
  opt = tff.learning.optimizers.schedule_learning_rate(LARSOptimizer(1.0, momentum=0.0),
                                                       lambda r: 0.5)
  w = (tf.constant([1.0]),)
  state = opt.initialize((tf.TensorSpec([1], tf.float32),))
  _, new = opt.next(state, w, (tf.constant([2.0]),))
  np.testing.assert_allclose(new[0].numpy(), [0.0])
