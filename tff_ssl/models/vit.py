"""Keras Vision Transformers (Dosovitskiy et al., 2021) as MoCo v3 (Chen et al., 2021) builds them, for
LW-FedSSL's layer-wise training (its encoder: ViT-Tiny, 12 blocks, dim 192, 3 heads, patch 4 on 32x32).

    images [B, H, W, C] -> patch_embed (a p x p convolution of stride p: one token per patch)
      -> tokens: a learned class token in front; fixed 2-D sin-cos position embeddings (MoCo v3's)
      -> block1 .. blockL, each pre-norm: x + MHSA(LN(x)), then x + MLP(LN(x)) (GELU, mlp_ratio x dim)
      -> norm (LayerNorm) -> the readout [B, dim]: the class token's features (`readout="cls"`), or
         the mean of the patch tokens' (`readout="mean"`: no class token is made)

Every weight's path names its block (`encoder/block3_attn/query/kernel`, `encoder/block3_mlp1/kernel`;
the patch embedding and the class token are `encoder/patch_embed/...`, `encoder/tokens/cls`), which is
what a layer-wise method's `TensorMask` selects by. LayerNorm is per token: nothing depends on the
batch, so one-image clients train as with the GroupNorm ResNets. LW-FedSSL trains the patch
projection; MoCo v3 freezes it at its random initialization for stability (`freeze_patch_embed`: the
layer is not trainable, its weights stay in the model, every trainer leaves them as they are).

  vit_tiny  12 blocks, dim 192, 3 heads, MLP ratio 4: the LW-FedSSL paper's encoder
  vit_mini   6 blocks, dim  96, 3 heads, MLP ratio 2: the CPU tables' encoder

`width` scales dim (rounded to a multiple of the heads), `depth` (> 0) replaces the number of blocks,
`patch_size` (default 4) must divide the image's height and width.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Sequence

import numpy as np
import tensorflow as tf

from tff_ssl.config_fields import Field


@dataclasses.dataclass(frozen=True)
class ViTSpec:
  depth: int
  dim: int
  heads: int
  mlp_ratio: int


VITS = {
    "vit_tiny": ViTSpec(depth=12, dim=192, heads=3, mlp_ratio=4),
    "vit_mini": ViTSpec(depth=6, dim=96, heads=3, mlp_ratio=2),
}
DEFAULT_PATCH = 4
# The ViTs' config fields (their one check; a patch size must also divide the image).
DEPTH = Field("depth", 0, "ViT encoders: the number of transformer blocks (0: the encoder's own, "
              "12 for vit_tiny, 6 for vit_mini).", lower=0, note="0: the encoder's own")
PATCH_SIZE = Field("patch_size", 0, f"ViT encoders: pixels per patch side; must divide the image "
                   f"size (0: {DEFAULT_PATCH}).", lower=0, note=f"0: {DEFAULT_PATCH}")
READOUTS = ("cls", "mean")
READOUT = Field("readout", "cls", "ViT encoders: the features, the class token's (cls) or the mean "
                "of the patch tokens' (mean), after the final LayerNorm.", choices=READOUTS)
FREEZE_PATCH_EMBED = Field("freeze_patch_embed", False, "ViT encoders: keep the patch projection at "
                           "its random initialization (MoCo v3's stability trick).")


def sincos_position_embedding(grid_h: int, grid_w: int, dim: int) -> np.ndarray:
  """[grid_h * grid_w, dim] fixed 2-D sin-cos embeddings (MoCo v3's): a quarter of the channels each
  for sin and cos of the column and of the row position, at frequencies 1 / 10000^(i / (dim / 4))."""
  if dim % 4:
    raise ValueError(f"the 2-D sin-cos position embedding needs dim divisible by 4; got {dim}")
  quarter = dim // 4
  omega = 1.0 / 10000.0 ** (np.arange(quarter, dtype=np.float64) / quarter)
  rows, cols = np.meshgrid(np.arange(grid_h, dtype=np.float64), np.arange(grid_w, dtype=np.float64),
                           indexing="ij")
  out_w = cols.reshape(-1)[:, None] * omega[None]
  out_h = rows.reshape(-1)[:, None] * omega[None]
  return np.concatenate([np.sin(out_w), np.cos(out_w), np.sin(out_h), np.cos(out_h)],
                        axis=1).astype(np.float32)


class Tokens(tf.keras.layers.Layer):
  """Prepends the learned class token to the patch tokens (`class_token`) and adds the fixed
  position embeddings (the class token's position embedding is zero, as MoCo v3's)."""

  def __init__(self, grid: tuple[int, int], class_token: bool = True, **kwargs):
    super().__init__(**kwargs)
    self.grid, self.class_token = tuple(grid), class_token

  def build(self, input_shape):
    dim = int(input_shape[-1])
    pos = sincos_position_embedding(self.grid[0], self.grid[1], dim)
    if self.class_token:
      self.cls = self.add_weight(name="cls", shape=(1, 1, dim),
                                 initializer=tf.keras.initializers.RandomNormal(stddev=1e-6))
      pos = np.concatenate([np.zeros((1, dim), np.float32), pos])
    self._pos = pos[None]
    super().build(input_shape)

  def call(self, patches):
    if self.class_token:
      cls = tf.tile(tf.cast(self.cls, patches.dtype), [tf.shape(patches)[0], 1, 1])
      patches = tf.concat([cls, patches], axis=1)
    return patches + tf.constant(self._pos, patches.dtype)

  def get_config(self):
    return {**super().get_config(), "grid": self.grid, "class_token": self.class_token}


class ClassToken(tf.keras.layers.Layer):
  """The class token's features: [B, 1 + N, D] -> [B, D]."""

  def call(self, tokens):
    return tokens[:, 0]


class MeanToken(tf.keras.layers.Layer):
  """The mean of the patch tokens' features: [B, N, D] (no class token) -> [B, D]."""

  def call(self, tokens):
    return tf.reduce_mean(tokens, axis=1)


_KEEP = contextvars.ContextVar("tff_ssl_vit_block_keep", default=None)


@contextlib.contextmanager
def block_keep(keep):
  """Within the block, calls of ViT models skip block i (it becomes the identity) where
  `keep[i - 1]` is False: FLL's depth dropout. `keep`: a bool tensor of static length n (the skip is
  a `tf.cond`: a skipped block costs no compute), or a tuple of Python bools (a skipped block is
  not in the graph: what a cost count of one keep pattern needs); blocks past n are always kept."""
  token = _KEEP.set(keep)
  try:
    yield
  finally:
    _KEEP.reset(token)


class Block(tf.keras.layers.Layer):
  """One pre-norm transformer block, x + MHSA(LN(x)), then x + MLP(LN(x)). Its sublayers keep
  their own names (`block3_attn`, ...): `FunctionalModel` names their weights as if they were the
  encoder's own layers (`flatten_weight_paths`)."""

  flatten_weight_paths = True

  def __init__(self, index: int, dim: int, heads: int, mlp_ratio: int, **kwargs):
    super().__init__(name=f"block{index}", **kwargs)
    self.index, self.dim, self.heads, self.mlp_ratio = index, dim, heads, mlp_ratio
    name = self.name
    self.ln1 = tf.keras.layers.LayerNormalization(epsilon=1e-6, name=f"{name}_ln1")
    self.attn = tf.keras.layers.MultiHeadAttention(heads, dim // heads, name=f"{name}_attn")
    self.ln2 = tf.keras.layers.LayerNormalization(epsilon=1e-6, name=f"{name}_ln2")
    self.mlp1 = tf.keras.layers.Dense(mlp_ratio * dim, activation="gelu", name=f"{name}_mlp1")
    self.mlp2 = tf.keras.layers.Dense(dim, name=f"{name}_mlp2")

  def _forward(self, x):
    y = self.ln1(x)
    x = x + self.attn(y, y)
    return x + self.mlp2(self.mlp1(self.ln2(x)))

  def call(self, x):
    keep = _KEEP.get()
    # Keras' symbolic calls (the first creates the block's weights; in TF1 graphs, as TFF's, they
    # run on placeholders of the model's inputs) always run the block.
    # The keep pattern's static length (plain Python, also where autograph does not convert `len`).
    if (keep is None or self.index > (len(keep) if isinstance(keep, tuple) else keep.shape[0]) or
        not self.mlp2.built or
        tf.keras.backend.is_keras_tensor(x)):
      return self._forward(x)
    if isinstance(keep, tuple):
      return self._forward(x) if keep[self.index - 1] else x
    return tf.cond(keep[self.index - 1], lambda: self._forward(x), lambda: tf.identity(x))

  def get_config(self):
    return {**super().get_config(), "index": self.index, "dim": self.dim, "heads": self.heads,
            "mlp_ratio": self.mlp_ratio}


def build_vit(spec_name: str, input_shape: Sequence[int], *, width: float = 1.0, depth: int = 0,
              patch_size: int = 0, readout: str = "cls", freeze_patch_embed: bool = False,
              small_input: bool = True, stem_stride: int = 1,
              name: str | None = None) -> tf.keras.Model:
  """A ViT encoder mapping images [B, H, W, C] (floats in [0, 1]) to features [B, dim]: the class
  token's (`readout="cls"`) or the mean of the patch tokens' (`readout="mean"`).

  `small_input` (the ResNets' stem choice) does not apply: a ViT's patches work at any size."""
  del small_input
  if stem_stride != 1:
    raise ValueError(f"stem_stride is a ResNet option; a ViT ({spec_name}) sets its token grid with "
                     f"patch_size (got stem_stride={stem_stride})")
  if spec_name not in VITS:
    raise ValueError(f"unknown ViT {spec_name!r}; choose one of {sorted(VITS)}")
  spec = VITS[spec_name]
  if not width > 0:
    raise ValueError(f"width multiplier must be > 0; got {width}")
  DEPTH.check(depth)
  PATCH_SIZE.check(patch_size)
  READOUT.check(readout)
  FREEZE_PATCH_EMBED.check(freeze_patch_embed)
  patch = patch_size or DEFAULT_PATCH
  h, w = int(input_shape[0]), int(input_shape[1])
  if patch < 1 or h % patch or w % patch:
    raise ValueError(f"patch_size {patch} must divide the images' {h}x{w} pixels (e.g. 4 or 7 on "
                     f"28x28, 4 on 32x32)")
  heads = spec.heads
  # A multiple of 4 * heads: whole heads, and the sin-cos embedding's four quarters.
  dim = max(4 * heads, int(round(spec.dim * width / (4 * heads))) * 4 * heads)
  inputs = tf.keras.Input(shape=tuple(input_shape), name="images")
  x = tf.keras.layers.Conv2D(dim, patch, strides=patch, name="patch_embed",
                             trainable=not freeze_patch_embed)(inputs)
  x = tf.keras.layers.Reshape(((h // patch) * (w // patch), dim), name="patches")(x)
  x = Tokens((h // patch, w // patch), class_token=readout == "cls", name="tokens")(x)
  for i in range(1, (depth or spec.depth) + 1):
    x = Block(i, dim, heads, spec.mlp_ratio)(x)
  x = tf.keras.layers.LayerNormalization(epsilon=1e-6, name="norm")(x)
  features = (ClassToken(name="cls_features") if readout == "cls" else
              MeanToken(name="mean_features"))(x)
  return tf.keras.Model(inputs, features, name=name or spec_name)
