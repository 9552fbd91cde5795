"""Plain convolutional encoders for heterogeneous clients (FedFoA's heterogeneous setting trains
ResNets beside a VGG-9 and an AlexNet): VGG-style and AlexNet-style stacks sized for small images, with
the project's weight-standardized convolutions and GroupNorm (no BatchNorm, as every encoder here).

  vgg9     conv 32, 64, pool, 128, 128, pool, 256, 256, pool (3x3, GroupNorm + ReLU), then two
           dense layers of 512: the 9-layer VGG of the federated-learning literature (FedMA's
           6 convolutions and 3 dense layers) without its classifier, its features the second
           dense layer's 512.
  alexnet  conv 64 (5x5), pool, 192 (5x5), pool, 384, 256, 256 (3x3), pool, then a dense layer of
           512: AlexNet's five convolutions at small-image scale (the CIFAR variants' strides and
           kernels), its features the dense layer's 512.

Pools are 2x2 max-pools ("same" padding, so 28 px gives 14/7/4); the dense layers flatten the last
feature map, so their size follows the input's. Widths are multiplied by `width`.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tff_ssl.models.layers import Dense, WSConv2D, group_norm

# name -> (layers: an int is a conv's filters with the kernel of `kernels`, "M" a max-pool; the
# dense layers' sizes).
CONVNETS = {
    "vgg9": ((32, 64, "M", 128, 128, "M", 256, 256, "M"), (512, 512)),
    "alexnet": ((64, "M", 192, "M", 384, 256, 256, "M"), (512,)),
}
_KERNELS = {"vgg9": (3,) * 6, "alexnet": (5, 5, 3, 3, 3)}


def build_convnet(name_: str, input_shape: Sequence[int], *, width: float = 1.0,
                  small_input: bool = True, stem_stride: int = 1, depth: int = 0,
                  patch_size: int = 0, name: str | None = None) -> tf.keras.Model:
  """Encoder `name_` (CONVNETS) mapping images [B, H, W, C] in [0, 1] to features [B, D]."""
  del small_input  # Sized for small images either way.
  if name_ not in CONVNETS:
    raise ValueError(f"unknown convnet {name_!r}; choose one of {sorted(CONVNETS)}")
  if depth or patch_size or stem_stride != 1:
    raise ValueError(f"{name_} has no depth, patch_size or stem_stride option (got {depth}, "
                     f"{patch_size}, {stem_stride})")
  if width <= 0:
    raise ValueError(f"width multiplier must be > 0; got {width}")
  layers, dense = CONVNETS[name_]
  scale = lambda f: max(1, int(round(f * width)))  # noqa: E731
  inputs = tf.keras.Input(shape=tuple(input_shape), name="images")
  x, conv, pool = inputs, 0, 0
  for spec in layers:
    if spec == "M":
      pool += 1
      x = tf.keras.layers.MaxPool2D(2, padding="same", name=f"pool{pool}")(x)
      continue
    filters, kernel = scale(spec), _KERNELS[name_][conv]
    conv += 1
    x = WSConv2D(filters, kernel, padding="same", use_bias=False, kernel_initializer="he_normal",
                 name=f"conv{conv}")(x)
    x = group_norm(filters, f"gn{conv}")(x)
    x = tf.keras.layers.ReLU(name=f"relu{conv}")(x)
  x = tf.keras.layers.Flatten(name="flatten")(x)
  for i, size in enumerate(dense):
    x = Dense(scale(size), use_bias=False, name=f"fc{i + 1}")(x)
    x = group_norm(scale(size), f"fc{i + 1}_gn", min_group_size=4)(x)
    x = tf.keras.layers.ReLU(name=f"fc{i + 1}_relu")(x)
  return tf.keras.Model(inputs, x, name=name or name_)
