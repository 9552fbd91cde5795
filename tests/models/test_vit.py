"""ViT encoders: ViT-Tiny's parameter count by hand, weight paths by block, the fixed sin-cos position
embedding by hand, batch independence, and the functional (TFF) form equal to the Keras model."""

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl import models
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.models import vit


def test_vit_tiny_has_the_parameters_counted_by_hand():
  enc = models.build_encoder("vit_tiny", (32, 32, 3))
  d, mlp = 192, 4 * 192
  block = (2 * 2 * d  # Two LayerNorms (scale, offset).
           + 4 * (d * d + d)  # Query, key, value and output projections (3 heads of 64), with biases.
           + (d * mlp + mlp) + (mlp * d + d))  # The MLP.
  patch = 4 * 4 * 3 * d + d  # A 4x4 convolution of stride 4 on RGB.
  want = patch + d + 12 * block + 2 * d  # + class token, 12 blocks, final LayerNorm.
  assert enc.count_params() == want == 5_348_352
  assert enc.output_shape == (None, 192)
  # With ImageNet's 16x16 patches, a learned 197-token position embedding and a 1000-class head this
  # is ViT-Tiny's (DeiT-Ti's) published 5.7M parameters.
  imagenet = want - patch + (16 * 16 * 3 * d + d) + 197 * d + (d * 1000 + 1000)
  assert round(imagenet / 1e6, 1) == 5.7


def test_weight_paths_name_their_block():
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(lambda: models.build_encoder("vit_mini", (28, 28, 1), patch_size=7,
                                                       name="encoder"))
  # (Inside an SSL model the encoder's paths start with "encoder/".)
  blocks = {n.split("_")[0] for n in model.names if n.startswith("block")}
  assert blocks == {f"block{i}" for i in range(1, 7)}
  assert model.names[:3] == ["patch_embed/kernel", "patch_embed/bias", "tokens/cls"]
  assert "block3_attn/query/kernel" in model.names and "block6_mlp2/bias" in model.names
  assert model.names[-2:] == ["norm/gamma", "norm/beta"]
  assert all(model.normalization[i] == ("_ln" in n or n.startswith("norm/"))
             for i, n in enumerate(model.names))


def test_sincos_position_embedding_by_hand():
  pos = vit.sincos_position_embedding(2, 3, 8)  # 2 rows x 3 columns, dim 8: frequencies 1, 1/100.
  assert pos.shape == (6, 8)
  row, col = 1, 2  # Token 5.
  want = [np.sin(col), np.sin(col / 100), np.cos(col), np.cos(col / 100),
          np.sin(row), np.sin(row / 100), np.cos(row), np.cos(row / 100)]
  np.testing.assert_allclose(pos[row * 3 + col], want, rtol=1e-6)
  with pytest.raises(ValueError, match="divisible by 4"):
    vit.sincos_position_embedding(2, 2, 6)


def test_functional_form_equals_the_keras_model_and_images_are_independent():
  tf.keras.utils.set_random_seed(3)
  build = lambda: models.build_encoder("vit_mini", (28, 28, 1), width=0.5, depth=2, patch_size=7)
  functional = FunctionalModel(build)
  keras_model = functional.keras_model(functional.initial_weights)
  rng = np.random.default_rng(0)
  x = tf.constant(rng.uniform(0, 1, (3, 28, 28, 1)), tf.float32)
  weights = [tf.constant(w) for w in functional.initial_weights]
  np.testing.assert_allclose(functional(weights, x).numpy(), keras_model(x).numpy(), atol=1e-5)
  # LayerNorm is per token: an image's features do not depend on the rest of the batch.
  np.testing.assert_allclose(keras_model(x[:1]).numpy(), keras_model(x).numpy()[:1], atol=1e-5)
  assert keras_model.output_shape == (None, 48)  # dim 96 x 0.5, a multiple of 4 x 3 heads.


def test_bad_vit_settings_name_the_value():
  with pytest.raises(ValueError, match="patch_size 5 must divide the images' 28x28"):
    models.build_encoder("vit_mini", (28, 28, 1), patch_size=5)
  with pytest.raises(ValueError, match="depth and patch_size are ViT options"):
    ExperimentConfig(encoder="resnet18", depth=3)
  with pytest.raises(ValueError, match="stem_stride is a ResNet option"):
    ExperimentConfig(encoder="vit_mini", stem_stride=2)
  with pytest.raises(ValueError, match="pool_grid is a ResNet option"):
    ExperimentConfig(encoder="vit_mini", pool_grid=2)
