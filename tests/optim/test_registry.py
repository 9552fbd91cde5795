"""The one optimizer registry (`tff_ssl.optim`): names by role, one check of a name, and each
entry's Keras and TFF builders doing the same step."""

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl import optim


def test_roles_offer_what_each_place_trains_with():
  assert optim.names("centralized") == ("adam", "adamw", "lars", "sgd", "sgdm")
  assert optim.names("client") == ("adamw", "sgd", "sgdm")
  assert optim.names("server") == ("adam", "lars", "sgd", "sgdm")


@pytest.mark.parametrize("name,role,field", [("adam", "client", "client_optimizer"),
                                             ("lars", "client", "client_optimizer"),
                                             ("adamw", "server", "server_optimizer")])
def test_a_name_outside_its_role_is_refused_naming_the_field(name, role, field):
  with pytest.raises(ValueError, match=rf"^unknown {field} '{name}'; choose one of \["):
    optim.get(name, role)


@pytest.mark.parametrize("name,momentum", [("sgd", 0.0), ("sgdm", 0.9)])
def test_keras_and_tff_sgd_take_the_same_two_steps(name, momentum):
  """sgd is plain gradient descent and sgdm has momentum 0.9, in Keras and in TFF alike:
  w1 = w0 - lr g0, w2 = w1 - lr (momentum g0 + g1), with g = 2 w on ||w||^2."""
  lr, w0 = 0.1, np.array([1.0, -2.0], np.float32)
  w1 = w0 - lr * 2 * w0
  w2 = w1 - lr * (momentum * 2 * w0 + 2 * w1)
  var = tf.Variable(w0)
  keras = optim.get(name, "centralized").keras(lr, 0.0)
  for _ in range(2):
    keras.apply_gradients([(2 * var, var)])
  np.testing.assert_allclose(var.numpy(), w2, rtol=1e-6)
  tff_opt = optim.make_tff_optimizer(name, "server", lr)
  state = tff_opt.initialize((tf.TensorSpec([2], tf.float32),))
  w = (tf.constant(w0),)
  for _ in range(2):
    state, w = tff_opt.next(state, w, (2 * w[0],))
  np.testing.assert_allclose(w[0].numpy(), w2, rtol=1e-6)


@pytest.mark.parametrize("role", ["client", "server"])
def test_every_tff_optimizer_reduces_a_quadratic(role):
  for name in optim.names(role):
    lr = {"adam": 0.1, "adamw": 0.1, "sgd": 0.1, "sgdm": 0.05, "lars": 50.0}[name]
    opt = optim.make_tff_optimizer(name, role, lr, names_=["a/kernel"])
    w = (tf.constant([[2.0, -3.0]]),)
    state = opt.initialize((tf.TensorSpec([1, 2], tf.float32),))
    for _ in range(20):
      state, w = opt.next(state, w, (2 * w[0],))
    assert float(tf.reduce_sum(w[0] ** 2)) < 0.5 * 13, name


def test_keras_and_tff_adamw_take_the_same_two_steps_with_decoupled_decay():
  """adamw is the same optimizer centralized (Keras) and at a client (TFF): two steps on ||w||^2 with
  weight decay 0.1 agree, and each step's decay is lr * wd * w, apart from Adam's step (MoCo v3's
  AdamW)."""
  lr, wd, w0 = 0.1, 0.1, np.array([1.0, -2.0], np.float32)
  var = tf.Variable(w0)
  keras = optim.get("adamw", "centralized").keras(lr, wd)
  for _ in range(2):
    keras.apply_gradients([(2 * var, var)])
  tff_opt = optim.make_tff_optimizer("adamw", "client", lr, weight_decay=wd)
  state = tff_opt.initialize((tf.TensorSpec([2], tf.float32),))
  w = (tf.constant(w0),)
  for _ in range(2):
    state, w = tff_opt.next(state, w, (2 * w[0],))
  np.testing.assert_allclose(var.numpy(), w[0].numpy(), rtol=1e-5)
  # Adam's first step is lr * sign(g) (up to epsilon); the decay adds lr * wd * w0.
  one = tf.Variable(w0)
  optim.get("adamw", "centralized").keras(lr, wd).apply_gradients([(2 * one, one)])
  np.testing.assert_allclose(one.numpy(), w0 - lr * np.sign(w0) - lr * wd * w0, rtol=1e-5)
