"""Encoders and heads, with the registry of encoders by name."""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import tensorflow as tf

from tff_ssl.models.convnets import CONVNETS, build_convnet
from tff_ssl.models.heads import build_mlp_head
from tff_ssl.models.layers import WSConv2D, group_norm, num_groups
from tff_ssl.models.resnet import RESNETS, build_resnet
from tff_ssl.models.vit import VITS, build_vit
from tff_ssl.config_fields import Field

# Config fields (`ExperimentConfig`), declared by their owner.
ENCODER = Field("encoder", "resnet14", "Encoder backbone.", choices=lambda: ENCODERS)
WIDTH = Field("width", 1.0, "Encoder width multiplier.", lower=0, open_lower=True)


# name -> builder(input_shape, *, width, small_input, stem_stride, depth, patch_size, name) -> Keras
# encoder producing [B, D] features (ResNets: `depth` and `patch_size` must be 0; ViTs: `stem_stride`
# must be 1; the plain convnets (FedFoA's heterogeneous clients): neither).
ENCODERS: dict[str, Callable[..., tf.keras.Model]] = {
    **{name: functools.partial(build_resnet, name) for name in RESNETS},
    **{name: functools.partial(build_vit, name) for name in VITS},
    **{name: functools.partial(build_convnet, name) for name in CONVNETS},
}


def build_encoder(encoder: str, input_shape: Sequence[int], **kwargs) -> tf.keras.Model:
  """Encoder `encoder` (one of ENCODERS) for images of `input_shape` (H, W, C); `name=` names the
  Keras model."""
  if encoder not in ENCODERS:
    raise ValueError(f"unknown encoder {encoder!r}; choose one of {sorted(ENCODERS)}")
  return ENCODERS[encoder](input_shape, **kwargs)


class SSLModel:
  """An encoder and the projector on top of it, and a predictor on the projections where the SSL
  method has one (BYOL, SimSiam, MoCo v3); SSL losses see `project(images)` and `predict(z)`."""

  def __init__(self, encoder: tf.keras.Model, projector: tf.keras.Model,
               predictor: tf.keras.Model | None = None):
    self.encoder = encoder
    self.projector = projector
    self.predictor = predictor

  @property
  def trainable_variables(self) -> list[tf.Variable]:
    heads = self.projector.trainable_variables
    if self.predictor is not None:
      heads = heads + self.predictor.trainable_variables
    return self.encoder.trainable_variables + heads

  @property
  def projection_variables(self) -> list[tf.Variable]:
    """The encoder's and projector's weights: what a target (momentum) network averages."""
    return self.encoder.weights + self.projector.weights

  def predict(self, z: tf.Tensor, training: bool = True) -> tf.Tensor:
    return self.predictor(z, training=training)

  def project(self, images: tf.Tensor, training: bool = True) -> tf.Tensor:
    return self.projector(self.encoder(images, training=training), training=training)


def build_ssl_model(encoder: str, input_shape: Sequence[int], projector_sizes: Sequence[int], *,
                    width: float = 1.0, small_input: bool = True) -> SSLModel:
  """Encoder `encoder` plus an MLP projector of `projector_sizes` (e.g. [1024, 1024, 1024]).

  Initialization draws from TensorFlow's global seed: call `tf.keras.utils.set_random_seed` first.
  """
  enc = build_encoder(encoder, input_shape, width=width, small_input=small_input)
  proj = build_mlp_head(enc.output_shape[-1], projector_sizes, name="projector")
  return SSLModel(enc, proj)
