"""Centralized pretraining: the loss falls, and the same seed gives the same run."""

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl import models
from tff_ssl.data import AugmentConfig, two_views
from tff_ssl.training import PretrainConfig, batch_indices, pretrain


AUGMENT = AugmentConfig(crop_scale=(0.5, 1.0), blur=False)


def _run(images, seed, steps, loss="cco", model=None):
  if model is None:
    tf.keras.utils.set_random_seed(seed)
    model = models.build_ssl_model("resnet14", images.shape[1:], [64, 64, 64], width=0.5)
  cfg = PretrainConfig(steps=steps, batch_size=64, ssl=loss, learning_rate=3e-3, seed=seed,
                       augment=AUGMENT)
  return pretrain(model, images, cfg), model


def _held_out_loss(model, images, loss):
  """The loss on fixed views (seed 99, not a training seed) of fixed images: no sampling noise
  between before and after."""
  v1, v2 = two_views(images, [99, 99], AUGMENT)
  return float(PretrainConfig(steps=1, ssl=loss).loss_fn()(model.project(v1), model.project(v2)))


@pytest.mark.parametrize("loss,steps,evaluated_on,ratio", [
    # CCO on 128 held-out images with d = 64 is dominated by the sampling noise of the correlation
    # matrix (it rose on a held-out set here while training converged), so CCO's own objective is
    # checked on the training images; NT-Xent generalizes and is checked on held-out images.
    # CCO's per-step loss on 64-image batches swings by +-10 (70-87), so where the run stops decides
    # the result: after 20 steps 61.6 or 64.1 for two GroupNorm implementations equal to float
    # round-off; after 40 steps 59.8 and 59.3 (0.92).
    ("cco", 40, "train", 0.97),
    ("simclr", 40, "held_out", 0.9),  # Measured 5.54 -> 4.63 (0.836).
])
def test_loss_decreases(synthetic_train, loss, steps, evaluated_on, ratio):
  tf.keras.utils.set_random_seed(0)
  model = models.build_ssl_model("resnet14", (28, 28, 1), [64, 64, 64], width=0.5)
  train = synthetic_train.images[:256]
  images = train if evaluated_on == "train" else synthetic_train.images[256:384]
  before = _held_out_loss(model, images, loss)
  _run(train, seed=0, steps=steps, loss=loss, model=model)
  after = _held_out_loss(model, images, loss)
  assert after < ratio * before, (before, after)  # Deterministic: seeded data, views, init.


def test_same_seed_same_losses_and_weights(synthetic_train):
  a, model_a = _run(synthetic_train.images[:64], seed=1, steps=2)
  b, model_b = _run(synthetic_train.images[:64], seed=1, steps=2)
  assert a == b
  for wa, wb in zip(model_a.encoder.get_weights(), model_b.encoder.get_weights()):
    np.testing.assert_array_equal(wa, wb)
  c, _ = _run(synthetic_train.images[:64], seed=2, steps=2)
  assert a != c


def test_batch_indices_are_seeded_epoch_permutations():
  it = batch_indices(10, 5, seed=0)
  epoch = np.concatenate([next(it), next(it)])
  assert sorted(epoch.tolist()) == list(range(10))
  it2 = batch_indices(10, 5, seed=0)
  np.testing.assert_array_equal(next(it2), epoch[:5])
  with pytest.raises(ValueError, match="batch_size 11 exceeds the 10"):
    next(batch_indices(10, 11, seed=0))


@pytest.mark.parametrize("kwargs,match", [
    (dict(steps=0), "steps must be >= 1"),
    (dict(steps=1, batch_size=1), "batch_size must be >= 2"),
    (dict(steps=1, ssl="byol"), r"trains with ssl in \['cco', 'simclr'\]; got 'byol'"),
    (dict(steps=1, optimizer="adagrad"), "unknown optimizer 'adagrad'"),
])
def test_invalid_configs_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    PretrainConfig(**kwargs)
