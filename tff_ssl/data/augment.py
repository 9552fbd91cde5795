"""Two-view SSL augmentations in the BYOL recipe, from stateless seeded random ops.

Every random number comes from `tf.random.stateless_*` keyed by (seed, example id): an example's views
depend on nothing else, so they are identical in eager code, in a `tf.function`, inside a TFF
computation, on a client alone or in a union batch (which DCCO's equivalence to centralized training
needs). Images are uint8 (or floats in [0, 1]); views are float32 in [0, 1].

BYOL (Grill et al., 2020, Table 6), per view (view 1 / view 2):
  random resized crop (scale 0.08-1, ratio 3/4-4/3) -> horizontal flip (p 0.5) -> colour jitter
  (p 0.8; brightness 0.4, contrast 0.4, saturation 0.2, hue 0.1) -> grayscale (p 0.2) -> Gaussian blur
  (p 1.0 / 0.1, sigma 0.1-2, kernel 10% of the image side) -> solarization (p 0.0 / 0.2).
DCCO uses this set without blur on CIFAR (`AugmentConfig.dcco_cifar()`).

Differences from BYOL's reference code, deliberate: the jitter order is fixed (brightness, contrast,
saturation, hue) instead of random; an out-of-bounds crop box is clipped instead of re-drawn. On
1-channel images saturation, hue and grayscale are identities.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf
from tff_ssl.config_fields import Field

# Config fields (`ExperimentConfig`), declared by their owner.
CROP_MIN_SCALE = Field("crop_min_scale", 0.2, "Smallest random-resized-crop area fraction.",
                       lower=0, upper=1, open_lower=True)
BLUR = Field("blur", False, "Gaussian blur in the views (BYOL: on; DCCO CIFAR: off).")


# Column of each uniform draw in the per-example random matrix.
_CROP_AREA, _CROP_LOGRATIO, _CROP_Y, _CROP_X, _FLIP, _JITTER, _BRIGHT, _CONTRAST, _SAT, _HUE, \
    _GRAY, _BLUR, _SIGMA, _SOLAR = range(14)
_NUM_DRAWS = 16


@dataclasses.dataclass(frozen=True)
class AugmentConfig:
  """Which augmentations run, and how strongly; the defaults are BYOL's."""

  crop: bool = True
  crop_scale: tuple[float, float] = (0.08, 1.0)
  crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
  output_size: int | None = None  # Square side of the views; None keeps the input's height.
  flip: bool = True
  color_jitter: bool = True
  jitter_prob: float = 0.8
  brightness: float = 0.4
  contrast: float = 0.4
  saturation: float = 0.2
  hue: float = 0.1
  grayscale: bool = True
  grayscale_prob: float = 0.2
  blur: bool = True
  blur_probs: tuple[float, float] = (1.0, 0.1)
  blur_sigma: tuple[float, float] = (0.1, 2.0)
  solarize: bool = True
  solarize_probs: tuple[float, float] = (0.0, 0.2)

  def __post_init__(self):
    lo, hi = self.crop_scale
    if not 0 < lo <= hi <= 1:
      raise ValueError(f"crop_scale must satisfy 0 < min <= max <= 1; got {self.crop_scale}")
    if not 0 < self.crop_ratio[0] <= self.crop_ratio[1]:
      raise ValueError(f"crop_ratio must satisfy 0 < min <= max; got {self.crop_ratio}")
    for name in ("jitter_prob", "grayscale_prob"):
      if not 0 <= getattr(self, name) <= 1:
        raise ValueError(f"{name} must be in [0, 1]; got {getattr(self, name)}")
    for name in ("blur_probs", "solarize_probs"):
      if any(not 0 <= p <= 1 for p in getattr(self, name)):
        raise ValueError(f"{name} must be two probabilities in [0, 1]; got {getattr(self, name)}")
    if self.hue < 0 or self.hue > 0.5:
      raise ValueError(f"hue must be in [0, 0.5]; got {self.hue}")

  @classmethod
  def byol(cls, **overrides) -> "AugmentConfig":
    return cls(**overrides)

  @classmethod
  def dcco_cifar(cls, **overrides) -> "AugmentConfig":
    """DCCO's CIFAR pretraining set: BYOL's without blur (Appendix B)."""
    return cls(**{"blur": False, **overrides})

  @classmethod
  def flip_only(cls, **overrides) -> "AugmentConfig":
    """Supervised fine-tuning in DCCO: horizontal flips only (Appendix B)."""
    return cls(**{"crop": False, "color_jitter": False, "grayscale": False, "blur": False,
                  "solarize": False, **overrides})


def _uniforms(seed: tf.Tensor, example_ids: tf.Tensor) -> tf.Tensor:
  """[B, 2, _NUM_DRAWS] uniforms in [0, 1); row b depends only on (seed, example_ids[b])."""
  seed = tf.cast(seed, tf.int64)

  def draw(example_id):
    s = tf.random.experimental.stateless_fold_in(seed, example_id)
    return tf.random.stateless_uniform([2, _NUM_DRAWS], seed=s)

  return tf.map_fn(draw, tf.cast(example_ids, tf.int64), fn_output_signature=tf.float32)


def _lerp(u, lo, hi):
  return lo + (hi - lo) * u


def _random_resized_crop(x, u, cfg: AugmentConfig, size: int):
  if not cfg.crop:
    if x.shape[1] == size and x.shape[2] == size:
      return x
    return tf.image.resize(x, [size, size])
  area = _lerp(u[:, _CROP_AREA], *cfg.crop_scale)
  log_ratio = _lerp(u[:, _CROP_LOGRATIO], tf.math.log(cfg.crop_ratio[0]),
                    tf.math.log(cfg.crop_ratio[1]))
  ratio = tf.exp(log_ratio)
  h = tf.minimum(tf.sqrt(area / ratio), 1.0)  # Fractions of the image side.
  w = tf.minimum(tf.sqrt(area * ratio), 1.0)
  y0 = u[:, _CROP_Y] * (1.0 - h)
  x0 = u[:, _CROP_X] * (1.0 - w)
  boxes = tf.stack([y0, x0, y0 + h, x0 + w], axis=1)
  return tf.image.crop_and_resize(x, boxes, tf.range(tf.shape(x)[0]), [size, size])


def _where(mask, a, b):
  return tf.where(mask[:, None, None, None], a, b)


def _gray(x):
  if x.shape[-1] == 1:
    return x
  return tf.image.rgb_to_grayscale(x)


def _color_jitter(x, u, cfg: AugmentConfig):
  per_image = lambda v: v[:, None, None, None]  # noqa: E731
  y = x
  if cfg.brightness:
    y = tf.clip_by_value(y * per_image(_lerp(u[:, _BRIGHT], 1 - cfg.brightness, 1 + cfg.brightness)),
                         0.0, 1.0)
  if cfg.contrast:
    mean = tf.reduce_mean(y, axis=[1, 2], keepdims=True)
    factor = per_image(_lerp(u[:, _CONTRAST], 1 - cfg.contrast, 1 + cfg.contrast))
    y = tf.clip_by_value((y - mean) * factor + mean, 0.0, 1.0)
  if x.shape[-1] == 3:
    if cfg.saturation:
      gray = _gray(y)
      factor = per_image(_lerp(u[:, _SAT], 1 - cfg.saturation, 1 + cfg.saturation))
      y = tf.clip_by_value(gray + factor * (y - gray), 0.0, 1.0)
    if cfg.hue:
      hsv = tf.image.rgb_to_hsv(y)
      delta = per_image(_lerp(u[:, _HUE], -cfg.hue, cfg.hue))[..., 0]
      hue = tf.math.floormod(hsv[..., 0] + delta, 1.0)
      y = tf.image.hsv_to_rgb(tf.stack([hue, hsv[..., 1], hsv[..., 2]], axis=-1))
  return _where(u[:, _JITTER] < cfg.jitter_prob, y, x)


def _gaussian_blur(x, u, cfg: AugmentConfig, prob: float):
  """Separable Gaussian blur with a per-image sigma, as one depthwise convolution over the batch."""
  size = x.shape[1]
  k = max(3, int(round(0.1 * size)) // 2 * 2 + 1)
  sigma = _lerp(u[:, _SIGMA], *cfg.blur_sigma)  # [B]
  t = tf.range(-(k // 2), k // 2 + 1, dtype=tf.float32)
  kernel = tf.exp(-tf.square(t)[None, :] / (2.0 * tf.square(sigma)[:, None]))  # [B, k]
  kernel /= tf.reduce_sum(kernel, axis=1, keepdims=True)
  b, c = tf.shape(x)[0], x.shape[-1]
  # Batch and channels become depthwise channels: [1, H, W, B*C] with one kernel per (image, channel).
  stacked = tf.reshape(tf.transpose(x, [1, 2, 0, 3]), [1, x.shape[1], x.shape[2], -1])
  per_channel = tf.reshape(tf.repeat(kernel, c, axis=0), [-1, k])  # [B*C, k]
  kx = tf.transpose(per_channel)[None, :, :, None]  # [1, k, B*C, 1]
  ky = tf.transpose(per_channel)[:, None, :, None]  # [k, 1, B*C, 1]
  padded = tf.pad(stacked, [[0, 0], [k // 2, k // 2], [k // 2, k // 2], [0, 0]], mode="REFLECT")
  y = tf.nn.depthwise_conv2d(padded, kx, [1, 1, 1, 1], "VALID")
  y = tf.nn.depthwise_conv2d(y, ky, [1, 1, 1, 1], "VALID")
  y = tf.transpose(tf.reshape(y, [x.shape[1], x.shape[2], b, c]), [2, 0, 1, 3])
  return _where(u[:, _BLUR] < prob, y, x)


def _augment_view(x, u, cfg: AugmentConfig, view: int, size: int):
  x = _random_resized_crop(x, u, cfg, size)
  if cfg.flip:
    x = _where(u[:, _FLIP] < 0.5, tf.image.flip_left_right(x), x)
  if cfg.color_jitter:
    x = _color_jitter(x, u, cfg)
  if cfg.grayscale and x.shape[-1] == 3:
    x = _where(u[:, _GRAY] < cfg.grayscale_prob, tf.tile(_gray(x), [1, 1, 1, 3]), x)
  if cfg.blur and cfg.blur_probs[view] > 0:
    x = _gaussian_blur(x, u, cfg, cfg.blur_probs[view])
  if cfg.solarize and cfg.solarize_probs[view] > 0:
    x = _where(u[:, _SOLAR] < cfg.solarize_probs[view], tf.where(x < 0.5, x, 1.0 - x), x)
  return x


# k / 255 for each uint8 level k, correctly rounded to float32 (NumPy divides in IEEE arithmetic, as
# TensorFlow's RealDiv does in eager mode).
_UNIT_LEVELS = np.arange(256, dtype=np.float32) / np.float32(255)


def to_float(images: tf.Tensor) -> tf.Tensor:
  """uint8 images -> float32 in [0, 1] (k -> k / 255, correctly rounded); float images pass through.

  A table lookup, not `x / 255.0`: Grappler's constant folding (on in TFF's compiled computations and
  in every `tf.function`) rewrites a division by a constant into a multiplication by its rounded
  reciprocal, which misses k / 255 by one float32 ulp for some k. Those input errors, amplified by
  near-zero feature variances, moved a float64 DCCO round 1e-6 off the centralized step; the lookup
  gives the same bits in every execution context (BUILD-notes, "Images to floats")."""
  images = tf.convert_to_tensor(images)
  if images.dtype == tf.uint8:
    return tf.gather(tf.constant(_UNIT_LEVELS), tf.cast(images, tf.int32))
  return tf.cast(images, tf.float32)


def two_views(images: tf.Tensor, seed, config: AugmentConfig = AugmentConfig(),
              example_ids: tf.Tensor | None = None) -> tuple[tf.Tensor, tf.Tensor]:
  """Two augmented views of a batch.

  Args:
    images: [B, H, W, C] uint8 (or float in [0, 1]); C is 1 or 3.
    seed: int pair [2] (a `tf.random` stateless seed), e.g. (run seed, step).
    config: the augmentations.
    example_ids: [B] integers naming each example (e.g. its index in the dataset); an example's views
      depend only on (seed, its id). Default: 0 .. B-1.

  Returns:
    (view1, view2), float32 [B, S, S, C] in [0, 1], S = config.output_size or H.
  """
  x = to_float(images)
  if x.shape.rank != 4 or x.shape[-1] not in (1, 3):
    raise ValueError(f"images must be [batch, height, width, 1 or 3]; got shape {x.shape}")
  if example_ids is None:
    example_ids = tf.range(tf.shape(x)[0])
  size = config.output_size or x.shape[1]
  u = _uniforms(tf.convert_to_tensor(seed), example_ids)
  return (_augment_view(x, u[:, 0], config, 0, size), _augment_view(x, u[:, 1], config, 1, size))


def augment(images: tf.Tensor, seed, config: AugmentConfig,
            example_ids: tf.Tensor | None = None) -> tf.Tensor:
  """One augmented view (view 1's probabilities), e.g. for supervised training."""
  return two_views(images, seed, config, example_ids)[0]
