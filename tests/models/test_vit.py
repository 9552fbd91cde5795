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
  with pytest.raises(ValueError, match="depth, patch_size, readout and freeze_patch_embed are ViT options"):
    ExperimentConfig(encoder="resnet18", depth=3)
  with pytest.raises(ValueError, match="stem_stride is a ResNet option"):
    ExperimentConfig(encoder="vit_mini", stem_stride=2)
  with pytest.raises(ValueError, match="pool_grid is a ResNet option"):
    ExperimentConfig(encoder="vit_mini", pool_grid=2)


def test_mean_token_readout_is_the_mean_of_the_normed_patch_tokens_of_shape_b_by_dim():
  """readout="mean": [B, dim] features, the mean over the 16 patch tokens (7 x 7 patches of a 28 x
  28 image) of the final LayerNorm's output; no class token is made (one weight fewer)."""
  tf.keras.utils.set_random_seed(0)
  enc = models.build_encoder("vit_mini", (28, 28, 1), patch_size=7, depth=2, readout="mean")
  assert enc.output_shape == (None, 96)
  assert not any("tokens/cls" in w.name for w in enc.weights)
  assert len(enc.weights) == len(models.build_encoder("vit_mini", (28, 28, 1), patch_size=7,
                                                      depth=2).weights) - 1
  x = tf.random.uniform([3, 28, 28, 1], seed=1)
  tokens = tf.keras.Model(enc.input, enc.get_layer("norm").output)(x)
  assert tokens.shape == (3, 16, 96)
  np.testing.assert_allclose(enc(x).numpy(), tf.reduce_mean(tokens, axis=1).numpy(), rtol=1e-6)
  with pytest.raises(ValueError, match="readout 'max'"):
    models.build_encoder("vit_mini", (28, 28, 1), readout="max")


def test_a_frozen_patch_projection_is_bit_identical_after_training_and_the_rest_moves():
  """freeze_patch_embed: a FedAvg round (TFF, AdamW clients with weight decay: decay would move a
  trained weight even at a zero gradient) and centralized pretraining (Keras AdamW with weight decay)
  leave the patch projection exactly at its initialization, and train everything else."""
  from tff_ssl import experiment, runner  # pylint: disable=g-import-not-at-top
  from tff_ssl.data import synthetic  # pylint: disable=g-import-not-at-top
  from tff_ssl.federated import common  # pylint: disable=g-import-not-at-top
  from tff_ssl.training import centralized  # pylint: disable=g-import-not-at-top
  train = synthetic("train", num_examples=16, seed=0)
  shared = dict(ssl="mocov3", encoder="vit_mini", patch_size=7, depth=1, width=0.25,
                projector=(16, 8), predictor=(16, 8), temperature=0.2, dataset="synthetic",
                freeze_patch_embed=True, seed=0)
  fed = ExperimentConfig(method="fedavg", rounds=1, client_optimizer="adamw",
                         client_weight_decay=0.1, client_learning_rate=1e-2, local_batch_size=4,
                         server_optimizer="sgd", server_learning_rate=1.0, **shared)
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(runner.ssl_model_builder(fed, train.image_shape))
  assert [n for n, f in zip(model.names, model.frozen) if f] == ["encoder/patch_embed/kernel",
                                                                 "encoder/patch_embed/bias"]
  process = runner.build_process(fed, model, train.image_shape)
  state = process.initialize()
  clients = [common.client_inputs(train.images[i:i + 8], np.arange(i, i + 8)) for i in (0, 8)]
  after, _ = process.next(state, clients)
  for name, before, now, frozen in zip(model.names, state.weights, after.weights, model.frozen):
    assert np.array_equal(before, now) == frozen, name
  # Centralized: two Keras AdamW steps.
  cen = ExperimentConfig(method="centralized", steps=2, batch_size=8, optimizer="adamw",
                         weight_decay=0.1, learning_rate=1e-2, **shared)
  build = experiment.centralized_model_builder(cen, train.image_shape)
  keras_model = build()
  start = [w.numpy().copy() for w in keras_model.encoder.weights]
  centralized.pretrain(keras_model, train.images, cen.pretrain_config(), build=build)
  for w, before in zip(keras_model.encoder.weights, start):
    assert np.array_equal(w.numpy(), before) == w.name.startswith("patch_embed/"), w.name


def test_methods_that_train_every_tensor_refuse_a_frozen_one_in_one_line():
  from tff_ssl import runner  # pylint: disable=g-import-not-at-top
  cfg = ExperimentConfig(method="dcco", encoder="vit_mini", patch_size=7, depth=1, width=0.25,
                         projector=(8,), dataset="synthetic", freeze_patch_embed=True)
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(runner.ssl_model_builder(cfg, (28, 28, 1)))
  with pytest.raises(ValueError, match=r"^DCCO trains every tensor of the model; "
                                       r"'encoder/patch_embed/kernel' is frozen \(drop "
                                       r"--freeze_patch_embed\)$"):
    runner.build_process(cfg, model, (28, 28, 1))
