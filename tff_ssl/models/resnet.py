"""Keras ResNets with weight-standardized convolutions and GroupNorm everywhere (no BatchNorm).

DCCO trains ResNet-14 (CIFAR) and ResNet-50 (DERM) with Weight Standardization + GroupNorm(32) at every
layer (Sec. 4.1); batch-free normalization is what lets clients with one image train at all.

Depths:
  resnet8:  the same family with n = 1: three stages of one basic block, 16/32/64 filters (the
            synthetic smoke tasks' encoder: about half ResNet-14's graph, which is what a short run's
            time goes to).
  resnet14: He et al.'s CIFAR family (6n + 2 layers, n = 2): three stages of two basic blocks, 16/32/64
            filters. The DCCO paper names the depth only; this is the standard 14-layer ResNet.
  resnet10: four stages of one basic block, 64/128/256/512 filters (the ResNet-18 tables' smoke
            encoder in the tests).
  resnet18: four stages of two basic blocks, 64/128/256/512 filters.
  resnet34: four stages of 3/4/6/3 basic blocks, 64/128/256/512 filters (FedFoA's heterogeneous
            clients).
  resnet50: four stages of 3/4/6/3 bottleneck blocks, 64/128/256/512 filters (x4 expansion).
Widths are multiplied by `width`. With `small_input=True` (28-32 px images) the stem is one 3x3 stride-1
convolution and no max-pool; otherwise the ImageNet stem (7x7 stride 2 + 3x3 max-pool).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import tensorflow as tf

from tff_ssl.config_fields import Field
from tff_ssl.models.layers import Conv2D, WSConv2D, group_norm


@dataclasses.dataclass(frozen=True)
class ResNetSpec:
  block: str  # "basic" or "bottleneck"
  blocks_per_stage: tuple[int, ...]
  filters: tuple[int, ...]
  stem_filters: int


RESNETS = {
    "resnet8": ResNetSpec("basic", (1, 1, 1), (16, 32, 64), 16),
    "resnet14": ResNetSpec("basic", (2, 2, 2), (16, 32, 64), 16),
    "resnet10": ResNetSpec("basic", (1, 1, 1, 1), (64, 128, 256, 512), 64),
    "resnet18": ResNetSpec("basic", (2, 2, 2, 2), (64, 128, 256, 512), 64),
    "resnet34": ResNetSpec("basic", (3, 4, 6, 3), (64, 128, 256, 512), 64),
    "resnet50": ResNetSpec("bottleneck", (3, 4, 6, 3), (64, 128, 256, 512), 64),
}


def _conv(filters: int, kernel: int, stride: int, name: str,
          standardize: bool = True) -> tf.keras.layers.Conv2D:
  layer = WSConv2D if standardize else Conv2D
  return layer(filters, kernel, strides=stride, padding="same", use_bias=False,
               kernel_initializer="he_normal", name=name)


def _basic_block(x, filters: int, stride: int, name: str, conv=_conv):
  shortcut = x
  if stride != 1 or x.shape[-1] != filters:
    shortcut = conv(filters, 1, stride, f"{name}_proj")(x)
    shortcut = group_norm(filters, f"{name}_proj_gn")(shortcut)
  y = conv(filters, 3, stride, f"{name}_conv1")(x)
  y = group_norm(filters, f"{name}_gn1")(y)
  y = tf.keras.layers.ReLU(name=f"{name}_relu1")(y)
  y = conv(filters, 3, 1, f"{name}_conv2")(y)
  y = group_norm(filters, f"{name}_gn2")(y)
  y = tf.keras.layers.Add(name=f"{name}_add")([shortcut, y])
  return tf.keras.layers.ReLU(name=f"{name}_out")(y)


def _bottleneck_block(x, filters: int, stride: int, name: str, conv=_conv):
  out = 4 * filters
  shortcut = x
  if stride != 1 or x.shape[-1] != out:
    shortcut = conv(out, 1, stride, f"{name}_proj")(x)
    shortcut = group_norm(out, f"{name}_proj_gn")(shortcut)
  y = conv(filters, 1, 1, f"{name}_conv1")(x)
  y = group_norm(filters, f"{name}_gn1")(y)
  y = tf.keras.layers.ReLU(name=f"{name}_relu1")(y)
  y = conv(filters, 3, stride, f"{name}_conv2")(y)
  y = group_norm(filters, f"{name}_gn2")(y)
  y = tf.keras.layers.ReLU(name=f"{name}_relu2")(y)
  y = conv(out, 1, 1, f"{name}_conv3")(y)
  y = group_norm(out, f"{name}_gn3")(y)
  y = tf.keras.layers.Add(name=f"{name}_add")([shortcut, y])
  return tf.keras.layers.ReLU(name=f"{name}_out")(y)


def last_feature_size(depth_name: str, image_size: int, *, small_input: bool = True,
                      stem_stride: int = 1) -> int:
  """The side of a ResNet's last feature map for square images of `image_size` px."""
  size = -(-image_size // stem_stride) if small_input else -(-(-(-image_size // 2)) // 2)
  for _ in RESNETS[depth_name].filters[1:]:  # Every stage after the first halves ("same" padding).
    size = -(-size // 2)
  return size


# The ResNets' config fields (their one check).
POOL_GRID = Field("pool_grid", 1, "ResNets: average-pool the last feature map over a g x g grid, "
                  "D = g^2 x channels (1: global average pooling).", lower=1,
                  note="1: global average pooling")
WEIGHT_STANDARDIZATION = Field(
    "weight_standardization", True, "ResNets: standardize each convolution's kernel (Weight "
    "Standardization, before GroupNorm); false: plain convolutions, still followed by GroupNorm (a "
    "control: either way a convolution's output is invariant to its kernel's scale).")
STEM_STRIDE = Field("stem_stride", 1, "ResNets: stride of the 3x3 stem on 28-32 px images (2: a "
                    "quarter of the compute).", choices=(1, 2))


def check_pool_grid(depth_name: str, image_size: int, pool_grid: int, *, small_input: bool = True,
                    stem_stride: int = 1) -> None:
  """Refuses a pooling grid finer than the last feature map."""
  POOL_GRID.check(pool_grid)
  size = last_feature_size(depth_name, image_size, small_input=small_input, stem_stride=stem_stride)
  if pool_grid > size:
    raise ValueError(f"pool_grid {pool_grid} exceeds {depth_name}'s last feature map of {size} x "
                     f"{size} on {image_size} px images (lower --pool_grid)")


def build_resnet(depth_name: str, input_shape: Sequence[int], *, width: float = 1.0,
                 small_input: bool = True, stem_stride: int = 1, pool_grid: int = 1,
                 depth: int = 0, patch_size: int = 0, weight_standardization: bool = True,
                 name: str | None = None) -> tf.keras.Model:
  """A ResNet encoder mapping images [B, H, W, C] (floats in [0, 1]) to pooled features [B, D].

  `stem_stride` (small inputs only): 2 halves every feature map, a quarter of the compute (the mini
  tables' Fashion-MNIST encoder: 28 px -> 14/7/4 px stages).
  `pool_grid`: the last feature map is average-pooled over a g x g grid of regions and flattened,
  D = g² C (1: global average pooling, D = C). On 28 px images the last map is 4 x 4 (stem stride 2)
  or 7 x 7: a grid keeps where a feature is, which a 64-channel global average throws away.
  `weight_standardization`: WSConv2D (the default) or plain Conv2D convolutions; GroupNorm follows
  each either way.
  """
  if depth_name not in RESNETS:
    raise ValueError(f"unknown ResNet {depth_name!r}; choose one of {sorted(RESNETS)}")
  if depth or patch_size:
    raise ValueError(f"depth and patch_size are ViT options (--encoder=vit_tiny|vit_mini); "
                     f"{depth_name}'s depth is in its name (got depth={depth}, "
                     f"patch_size={patch_size})")
  if width <= 0:
    raise ValueError(f"width multiplier must be > 0; got {width}")
  STEM_STRIDE.check(stem_stride)
  spec = RESNETS[depth_name]
  conv = functools.partial(_conv, standardize=weight_standardization)
  scale = lambda f: max(1, int(round(f * width)))  # noqa: E731
  inputs = tf.keras.Input(shape=tuple(input_shape), name="images")
  x = inputs
  if small_input:
    x = conv(scale(spec.stem_filters), 3, stem_stride, "stem_conv")(x)
  else:
    x = conv(scale(spec.stem_filters), 7, 2, "stem_conv")(x)
  x = group_norm(scale(spec.stem_filters), "stem_gn")(x)
  x = tf.keras.layers.ReLU(name="stem_relu")(x)
  if not small_input:
    x = tf.keras.layers.MaxPool2D(3, strides=2, padding="same", name="stem_pool")(x)
  block_fn = _basic_block if spec.block == "basic" else _bottleneck_block
  for stage, (blocks, filters) in enumerate(zip(spec.blocks_per_stage, spec.filters)):
    for b in range(blocks):
      stride = 2 if (b == 0 and stage > 0) else 1
      x = block_fn(x, scale(filters), stride, f"stage{stage + 1}_block{b + 1}", conv)
  check_pool_grid(depth_name, input_shape[0], pool_grid, small_input=small_input,
                  stem_stride=stem_stride)
  if pool_grid == 1:
    features = tf.keras.layers.GlobalAveragePooling2D(name="pool")(x)
  else:
    k = -(-x.shape[1] // pool_grid)  # Regions of ceil(size / g) pixels; "same" padding is not averaged.
    x = tf.keras.layers.AveragePooling2D(k, strides=k, padding="same", name="grid_pool")(x)
    features = tf.keras.layers.Flatten(name="pool")(x)
  return tf.keras.Model(inputs, features, name=name or depth_name)
