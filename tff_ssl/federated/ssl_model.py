"""The federated SSL model of a config: encoder + projector (+ predictor), as a Keras builder."""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tff_ssl import models
from tff_ssl.config_fields import Field
from tff_ssl import ssl as ssl_lib
from tff_ssl.federated import functional

# Config fields (`ExperimentConfig`), declared by their owner.
PROJECTOR = Field("projector", (512, 512, 512), "Projector layer sizes, e.g. 1024,1024,1024.",
                  item=int, lower=1)
PREDICTOR = Field("predictor", (), "BYOL / SimSiam predictor layer sizes, ending at the "
                  "projector's output (empty: 512,<projector output>).", item=int, lower=1)


ENCODER_NAME = "encoder"  # The Keras name of the SSL model's encoder (`keras_encoder` finds it).

HEAD_NORM = Field("head_norm", "group", "The SSL heads' normalization: group (GroupNorm, per "
                  "image) or batch (statistics of each client's own batch, per view: the SSL "
                  "method's published heads; needs >= 2 images a client, not DCCO).",
                  choices=("group", "batch"))
PROJECTOR_OUTPUT = Field("projector_output", "linear", "The projector's output: linear (its last "
                         "Dense layer's) or unit (each projection scaled to unit L2 norm, so an "
                         "image's encoding statistics are bounded whatever the encoder's scale: "
                         "DP-DCCO's statistics release).", choices=("linear", "unit"))


def head_options(config) -> tuple[dict, dict]:
  """`models.build_mlp_head` options of the projector and of the predictor under `config.head_norm`:
  GroupNorm heads, or the SSL method's published batch-normalized heads (`SSLMethod.batch_heads`);
  the projector's output scaled to unit norm under `config.projector_output="unit"`."""
  norm = getattr(config, "head_norm", "group")
  unit = {"unit_output": True} if getattr(config, "projector_output", "linear") == "unit" else {}
  if norm != "batch":
    return {"norm": norm, **unit}, {"norm": norm}
  layout = ssl_lib.get(config.ssl).batch_heads
  projector = ({"norm": "none"} if layout == "none" else
               {"norm": "batch", "output_norm": layout == "hidden+output"})
  return {**projector, **unit}, {"norm": "batch"}


def ssl_model_builder(config, image_shape, features: bool = False):
  """The federated model: encoder + projector (outputs z), + predictor when the SSL method or a client
  add-on reads one (`ExperimentConfig.has_predictor`; outputs [z, p]); `features`: the encoder's output h last ([z, h] or [z, p, h]: LW-FedSSL's
  representation alignment). The weights are the same either way."""
  predictor = getattr(config, "has_predictor", ssl_lib.get(config.ssl).predictor)
  projector_options, predictor_options = head_options(config)

  def build():
    with models.layers.precision(config.precision):
      return build_model()

  def build_model():
    enc = config.build_encoder(image_shape, name=ENCODER_NAME)
    proj = models.build_mlp_head(enc.output_shape[-1], config.projector, name="projector",
                                 **projector_options)
    x = tf.keras.Input(image_shape, name="images")
    h = enc(x)
    z = proj(h)
    outputs = [z]
    if predictor:
      pred = models.build_mlp_head(config.projector[-1], config.predictor_sizes, name="predictor",
                                   **predictor_options)
      outputs.append(pred(z))
    if features:
      outputs.append(h)
    return tf.keras.Model(x, outputs if len(outputs) > 1 else z, name="ssl_model")
  return build


def keras_encoder(model, weights) -> tf.keras.Model:
  """The Keras encoder (the layer named `ENCODER_NAME`) of the SSL model (`FunctionalModel`)
  carrying `weights`."""
  full = model.keras_model(weights)
  return functional.lend_part(full.get_layer(ENCODER_NAME), full)


def release(encoders: Sequence[tuple[str, tf.keras.Model]]) -> None:
  """Gives the (label, encoder) pairs of `keras_encoder` (a process's `encoders`) back for reuse by
  the next ones: their holder is done with them."""
  functional.release(*(encoder for _, encoder in encoders))
