"""Centralized pretraining: the loss falls, and the same seed gives the same run."""

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl import models
from tff_ssl.data import AugmentConfig, two_views
from tff_ssl.training import PretrainConfig, batch_indices, pretrain


AUGMENT = AugmentConfig(crop_scale=(0.5, 1.0), blur=False)


def _run(images, seed, steps, loss="cco", model=None, batch_size=64, learning_rate=3e-3):
  if model is None:
    tf.keras.utils.set_random_seed(seed)
    model = models.build_ssl_model("resnet14", images.shape[1:], [64, 64, 64], width=0.5)
  cfg = PretrainConfig(steps=steps, batch_size=batch_size, ssl=loss, learning_rate=learning_rate,
                       seed=seed, augment=AUGMENT)
  return pretrain(model, images, cfg), model


VIEW_SEEDS = (99, 98, 97, 96)  # Not training seeds.


def _loss_on_fixed_views(model, images, loss):
  """The loss on fixed views of fixed images, averaged over VIEW_SEEDS: no sampling noise between
  before and after, and less dependence on one draw of views."""
  fn = PretrainConfig(steps=1, ssl=loss).loss_fn()
  return float(np.mean([fn(*(model.project(v) for v in two_views(images, [s, s], AUGMENT)))
                        for s in VIEW_SEEDS]))


@pytest.mark.parametrize("loss,projector,batch_size,learning_rate,evaluated_on,ratio", [
    # CCO's loss has a floor of sampling noise in its d x d correlation matrix that grows as d^2 / n:
    # with d = 64 it dominated (after 40 steps 59.3 here, 67.4 with TensorFlow's oneDNN rewrites off,
    # from 64.9: a test that failed on one set-up). With d = 16 and steadier steps (batch 128, lr
    # 1e-3) the loss falls in every set-up: after/before measured 0.944 (this AMD EPYC's default),
    # 0.949 (ONEDNN_MAX_CPU_ISA=AVX2), 0.951 (=SSE41), 0.955 (TF_ENABLE_ONEDNN_OPTS=0). On
    # held-out images CCO's loss does not fall at this scale, so it is checked on the training images.
    ("cco", [64, 64, 16], 128, 1e-3, "train", 0.97),
    # NT-Xent generalizes and is checked on held-out images: measured 0.810-0.824 in the same four
    # set-ups.
    ("simclr", [64, 64, 64], 64, 3e-3, "held_out", 0.9),
])
def test_loss_decreases(synthetic_train, loss, projector, batch_size, learning_rate, evaluated_on,
                        ratio):
  tf.keras.utils.set_random_seed(0)
  model = models.build_ssl_model("resnet14", (28, 28, 1), projector, width=0.5)
  train = synthetic_train.images[:256]
  images = train if evaluated_on == "train" else synthetic_train.images[256:384]
  before = _loss_on_fixed_views(model, images, loss)
  _run(train, seed=0, steps=40, loss=loss, model=model, batch_size=batch_size,
       learning_rate=learning_rate)
  after = _loss_on_fixed_views(model, images, loss)
  print(f"{loss}: {before:.3f} -> {after:.3f} ({after / before:.3f})")  # Shown with `pytest -s`.
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
