"""Two-view augmentations: seeded determinism everywhere (eager, tf.function, TFF), each op switchable."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl.data import AugmentConfig, two_views
from tests import spread

OFF = AugmentConfig(crop=False, flip=False, color_jitter=False, grayscale=False, blur=False,
                    solarize=False)


def images(n=8, channels=1, size=16, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (n, size, size, channels), dtype=np.uint8)


@pytest.mark.parametrize("channels", [1, 3])
def test_views_are_floats_in_unit_range_of_the_right_shape(channels):
  x = images(channels=channels)
  v1, v2 = two_views(x, [0, 1], AugmentConfig(output_size=12))
  for v in (v1, v2):
    assert v.shape == (8, 12, 12, channels) and v.dtype == tf.float32
    assert float(tf.reduce_min(v)) >= 0.0 and float(tf.reduce_max(v)) <= 1.0
  assert not np.allclose(v1, v2)


def test_same_seed_same_views_other_seed_other_views():
  x = images(channels=3)
  a = two_views(x, [3, 4])
  b = two_views(x, [3, 4])
  c = two_views(x, [3, 5])
  np.testing.assert_array_equal(a[0], b[0])
  np.testing.assert_array_equal(a[1], b[1])
  assert not np.allclose(a[0], c[0])


def test_an_examples_views_depend_only_on_seed_and_its_id():
  x = images(n=10, channels=3)
  full = two_views(x, [1, 2], example_ids=tf.range(100, 110))
  part = two_views(x[4:7], [1, 2], example_ids=tf.range(104, 107))
  # A batch of 3 against a batch of 10 (pixels in [0, 1]): largest gap seen 8.9e-7
  # (the same in the four oneDNN set-ups of BUILD-notes, "Numbers across CPUs").
  for view in (0, 1):
    spread.within(f"view {view}, batch of 3 vs batch of 10",
                  spread.relative_gap(part[view], full[view][4:7], 1.0), 1e-5)


def test_same_views_in_tf_function_and_inside_a_tff_computation():
  x = images(n=4, channels=3)
  eager = two_views(x, [5, 6])
  graph = tf.function(lambda im: two_views(im, tf.constant([5, 6])))(x)

  @tff.tensorflow.computation(tff.TensorType(np.uint8, [4, 16, 16, 3]))
  def views_in_tff(im):
    return two_views(im, tf.constant([5, 6]))

  in_tff = views_in_tff(x)
  # Eager, tf.function and TFF's worker: largest gap seen 6.6e-7 (pixels in [0, 1]; four
  # oneDNN set-ups).
  for where, got in (("tf.function", graph), ("TFF computation", in_tff)):
    for view in (0, 1):
      spread.within(f"view {view}, {where} vs eager", spread.relative_gap(got[view], eager[view], 1.0),
                    1e-5)


def test_all_off_is_the_identity():
  x = images(channels=3)
  v1, v2 = two_views(x, [0, 0], OFF)
  np.testing.assert_array_equal(v1, x / np.float32(255))
  np.testing.assert_array_equal(v2, x / np.float32(255))


def test_flip_only_gives_the_image_or_its_mirror():
  x = images(n=32)
  v1, _ = two_views(x, [0, 0], AugmentConfig(**{**OFF.__dict__, "flip": True}))
  orig, mirror = x / np.float32(255), x[:, :, ::-1] / np.float32(255)
  flipped = [np.array_equal(v, m) for v, m in zip(v1.numpy(), mirror)]
  kept = [np.array_equal(v, o) for v, o in zip(v1.numpy(), orig)]
  assert all(f or k for f, k in zip(flipped, kept))
  assert 0 < sum(flipped) < 32


def test_solarize_and_grayscale_at_probability_one():
  x = images(channels=3)
  cfg = AugmentConfig(**{**OFF.__dict__, "solarize": True, "solarize_probs": (1.0, 1.0)})
  v1, _ = two_views(x, [0, 0], cfg)
  f = x / np.float32(255)
  np.testing.assert_allclose(v1, np.where(f < 0.5, f, 1 - f), atol=1e-6)
  cfg = AugmentConfig(**{**OFF.__dict__, "grayscale": True, "grayscale_prob": 1.0})
  v1, _ = two_views(x, [0, 0], cfg)
  np.testing.assert_allclose(v1[..., 0], v1[..., 1])
  np.testing.assert_allclose(v1[..., 1], v1[..., 2])


def test_blur_keeps_constant_images_and_smooths_noise():
  const = np.full((4, 20, 20, 1), 100, np.uint8)
  cfg = AugmentConfig(**{**OFF.__dict__, "blur": True, "blur_probs": (1.0, 1.0),
                         "blur_sigma": (1.0, 2.0)})
  v1, _ = two_views(const, [0, 0], cfg)
  np.testing.assert_allclose(v1, 100 / 255, atol=1e-6)
  noisy = images(n=4, size=20)
  v1, _ = two_views(noisy, [0, 0], cfg)
  assert float(tf.math.reduce_std(v1)) < 0.6 * float(np.std(noisy / 255))


def test_crop_zooms_in():
  # A left-half-white image: a crop of scale < 1 changes the white fraction; with scale 1 it is kept.
  x = np.zeros((16, 16, 16, 1), np.uint8)
  x[:, :, :8] = 255
  whole = AugmentConfig(**{**OFF.__dict__, "crop": True, "crop_scale": (1.0, 1.0),
                           "crop_ratio": (1.0, 1.0)})
  np.testing.assert_allclose(two_views(x, [0, 0], whole)[0], x / 255, atol=1e-5)
  zoom = AugmentConfig(**{**OFF.__dict__, "crop": True, "crop_scale": (0.1, 0.2)})
  fractions = tf.reduce_mean(two_views(x, [0, 0], zoom)[0], axis=[1, 2, 3]).numpy()
  assert np.ptp(fractions) > 0.3


def test_color_jitter_changes_intensities_on_one_and_three_channels():
  for channels in (1, 3):
    x = images(channels=channels)
    cfg = AugmentConfig(**{**OFF.__dict__, "color_jitter": True, "jitter_prob": 1.0})
    v1, _ = two_views(x, [0, 0], cfg)
    assert not np.allclose(v1, x / 255, atol=1e-3)


@pytest.mark.parametrize("kwargs,match", [
    (dict(crop_scale=(0.0, 1.0)), "crop_scale"),
    (dict(jitter_prob=1.5), "jitter_prob"),
    (dict(blur_probs=(1.0, -0.1)), "blur_probs"),
    (dict(hue=0.7), "hue"),
])
def test_invalid_configs_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    AugmentConfig(**kwargs)


def test_presets():
  assert not AugmentConfig.dcco_cifar().blur and AugmentConfig.byol().blur
  flip = AugmentConfig.flip_only()
  assert flip.flip and not (flip.crop or flip.color_jitter or flip.blur or flip.solarize)


def test_images_become_k_over_255_correctly_rounded_in_every_context():
  """Eagerly, in a `tf.function` (whose Grappler folds constants) and in a TFF computation compiled
  with TFF's static Grappler pass, as bin/train runs: each level k is float32(k / 255), the same bits.
  A division by 255.0 gives them eagerly, but the folded form (times float32(1 / 255)) misses 126 of
  the 256 levels by an ulp, which is what the lookup guards against."""
  from tff_ssl import runtime  # pylint: disable=g-import-not-at-top
  from tff_ssl.data.augment import to_float  # pylint: disable=g-import-not-at-top
  levels = np.arange(256, dtype=np.uint8).reshape(16, 16, 1)
  want = np.arange(256, dtype=np.float32).reshape(16, 16, 1) / np.float32(255)
  folded = np.arange(256, dtype=np.float32) * np.float32(1 / 255)
  assert (folded != want.ravel()).sum() == 126
  assert np.array_equal(to_float(levels).numpy(), want)
  assert np.array_equal(tf.function(to_float)(tf.constant(levels)).numpy(), want)
  computation = tff.tensorflow.computation(to_float, tff.TensorType(np.uint8, [16, 16, 1]))
  runtime.configure_context(static_graph_optimization=True)
  try:
    assert np.array_equal(computation(levels), want)
  finally:
    runtime.configure_context(static_graph_optimization=False)  # tests/conftest.py's.
