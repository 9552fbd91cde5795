"""Encoders and heads: GroupNorm + weight standardization everywhere, no BatchNorm, right shapes."""

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl import models
from tff_ssl.models.layers import WSConv2D


def _layers(model):
  out = []
  for layer in model.layers:
    out.extend(_layers(layer) if isinstance(layer, tf.keras.Model) else [layer])
  return out


@pytest.mark.parametrize("name", sorted(models.RESNETS))
@pytest.mark.parametrize("small_input", [True, False])
def test_encoder_registry_builds_gn_ws_models(name, small_input):
  shape = (32, 32, 3) if small_input else (64, 64, 3)
  enc = models.build_encoder(name, shape, width=0.25, small_input=small_input)
  layers = _layers(enc)
  assert not any(isinstance(l, tf.keras.layers.BatchNormalization) for l in layers)
  convs = [l for l in layers if isinstance(l, tf.keras.layers.Conv2D)]
  assert convs and all(isinstance(l, WSConv2D) for l in convs)
  norms = [l for l in layers if isinstance(l, tf.keras.layers.GroupNormalization)]
  assert len(norms) == len(convs)  # Every convolution is followed by a GroupNorm.
  expected_depth = {"resnet8": 7, "resnet10": 9, "resnet14": 13, "resnet18": 17, "resnet34": 33,
                    "resnet50": 49}[name]
  shortcuts = sum(1 for l in convs if l.name.endswith("_proj"))
  assert len(convs) - shortcuts == expected_depth  # Conv layers of the nominal depth (minus the fc).
  out = enc(tf.zeros((2,) + shape))
  assert out.shape == (2, enc.output_shape[-1])


def test_resnet14_widths_and_feature_dim():
  assert models.build_encoder("resnet14", (28, 28, 1)).output_shape == (None, 64)
  assert models.build_encoder("resnet14", (28, 28, 1), width=2).output_shape == (None, 128)
  assert models.build_encoder("resnet50", (32, 32, 3), width=0.25).output_shape == (None, 512)


def test_unknown_encoder_and_bad_width_raise():
  with pytest.raises(ValueError, match="unknown encoder 'vgg'"):
    models.build_encoder("vgg", (32, 32, 3))
  with pytest.raises(ValueError, match="width"):
    models.build_encoder("resnet14", (32, 32, 3), width=0)


def test_weight_standardized_convolution_matches_manual_computation():
  layer = WSConv2D(4, 3, padding="same", use_bias=False, ws_eps=0.0)
  x = tf.random.stateless_normal((2, 5, 5, 3), seed=[0, 1])
  y = layer(x)
  k = layer.kernel.numpy()
  k_std = (k - k.mean(axis=(0, 1, 2))) / k.std(axis=(0, 1, 2))
  np.testing.assert_allclose(layer.standardized_kernel(layer.kernel).numpy(), k_std, atol=1e-5)
  want = tf.nn.conv2d(x, k_std.astype(np.float32), 1, "SAME")
  np.testing.assert_allclose(y.numpy(), want.numpy(), atol=1e-4)
  # Invariant to the kernel's per-filter scale and shift: the point of standardization.
  layer.kernel.assign(3.0 * layer.kernel + 0.5)
  np.testing.assert_allclose(layer(x).numpy(), y.numpy(), atol=1e-4)


@pytest.mark.parametrize("shape,axes", [((3, 3, 4, 5), [0, 1, 2]), ((2, 6, 3, 4), [1, 3]),
                                        ((7, 4), [1])])
def test_standardize_and_its_written_out_gradient_equal_autodiff_through_the_moments(shape, axes):
  """`layers.standardize` (weight standardization, GroupNorm's core) against the form it replaced,
  autodiff through tf.nn.moments, in float64: values and the gradient of a non-linear loss."""
  rng = np.random.default_rng(1)
  x = tf.constant(rng.normal(0.5, 2.0, size=shape))
  w = tf.constant(rng.normal(size=shape))

  def reference(x):
    mean, var = tf.nn.moments(x, axes=axes, keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + 1e-5)

  grads = []
  for fn in (lambda x: models.layers.standardize(x, axes, 1e-5), reference):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = fn(x)
      loss = tf.reduce_sum(tf.sin(y) * w)
    grads.append((y.numpy(), tape.gradient(loss, x).numpy()))
  (y, g), (y_ref, g_ref) = grads
  np.testing.assert_allclose(y, y_ref, rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(g, g_ref, rtol=1e-10, atol=1e-12)


def test_num_groups_is_32_when_it_divides():
  assert models.num_groups(64) == 32
  assert models.num_groups(16) == 16
  assert models.num_groups(48) == 16
  assert models.num_groups(1024) == 32
  assert models.num_groups(32, min_group_size=4) == 8
  assert models.num_groups(6, min_group_size=4) == 1


def test_mlp_head_has_gn_between_hidden_layers_only():
  head = models.build_mlp_head(16, [32, 32, 8], name="projector")
  kinds = [type(l).__name__ for l in head.layers[1:]]
  assert kinds == ["Dense", "GroupNormalization", "ReLU", "Dense", "GroupNormalization", "ReLU",
                   "Dense"]
  assert head.output_shape == (None, 8)
  norms = [l for l in head.layers if isinstance(l, tf.keras.layers.GroupNormalization)]
  assert [l.groups for l in norms] == [8, 8]  # Groups of >= 4 channels: never all-zero outputs.
  out = head(tf.random.stateless_normal((5, 16), seed=[0, 0])).numpy()
  assert out.std(axis=0).min() > 0
  with pytest.raises(ValueError, match="head sizes"):
    models.build_mlp_head(16, [])


def test_group_norm_makes_outputs_independent_of_the_rest_of_the_batch():
  tf.keras.utils.set_random_seed(0)
  enc = models.build_encoder("resnet14", (16, 16, 1), width=0.5)
  x = tf.random.stateless_uniform((4, 16, 16, 1), seed=[1, 2])
  alone = enc(x[:1], training=True)
  batched = enc(x, training=True)[:1]
  np.testing.assert_allclose(alone.numpy(), batched.numpy(), atol=1e-5)


@pytest.mark.parametrize("shape,groups", [((3, 5, 5, 8), 4), ((3, 4, 4, 6), 6), ((3, 12), 3),
                                          ((3, 16), 4)])
def test_group_norm_equals_keras_group_normalization_with_an_unknown_batch(shape, groups):
  # The layer's own moments (no mask of ones) against Keras' implementation and a NumPy reference,
  # values and gradients, in a graph whose batch dimension is unknown (as inside a TFF computation).
  rng = np.random.default_rng(0)
  x = tf.constant(rng.normal(2.0, 3.0, size=shape).astype(np.float32))
  ours = models.layers.GroupNormalization(groups=groups, epsilon=1e-5)
  keras = tf.keras.layers.GroupNormalization(groups=groups, epsilon=1e-5)
  ours.build(x.shape)
  keras.build(x.shape)
  gamma = rng.normal(1.0, 0.5, size=shape[-1]).astype(np.float32)
  beta = rng.normal(0.0, 0.5, size=shape[-1]).astype(np.float32)
  for layer in (ours, keras):
    layer.set_weights([gamma, beta])
  spec = tf.TensorSpec([None] + list(shape[1:]), tf.float32)

  def value_and_grads(layer):
    @tf.function(input_signature=[spec])
    def run(inputs):
      with tf.GradientTape() as tape:
        tape.watch(inputs)
        y = layer(inputs)
        loss = tf.reduce_sum(tf.sin(y))
      return y, tape.gradient(loss, [inputs, layer.gamma, layer.beta])
    return run(x)

  y, grads = value_and_grads(ours)
  y_keras, grads_keras = value_and_grads(keras)
  c = shape[-1]
  grouped = x.numpy().reshape(shape[0], -1, groups, c // groups)
  mean = grouped.mean(axis=(1, 3), keepdims=True)
  var = grouped.var(axis=(1, 3), keepdims=True)
  expected = ((grouped - mean) / np.sqrt(var + 1e-5)).reshape(shape) * gamma + beta
  np.testing.assert_allclose(y.numpy(), expected, atol=2e-5)
  np.testing.assert_allclose(y.numpy(), y_keras.numpy(), atol=2e-5)
  for g, gk in zip(grads, grads_keras):
    np.testing.assert_allclose(g.numpy(), gk.numpy(), atol=2e-4)
  assert ours.name.startswith("group_normalization")  # Automatic names as Keras' layer's.


def test_unit_output_scales_each_projection_to_unit_norm():
  """--projector_output=unit: the linear head's rows, each divided by its own norm (the same
  weights, no new ones), in a batch of rows of very different scales."""
  tf.keras.utils.set_random_seed(0)
  linear = models.build_mlp_head(16, [32, 8])
  unit = models.build_mlp_head(16, [32, 8], unit_output=True)
  assert len(unit.weights) == len(linear.weights)
  unit.set_weights(linear.get_weights())
  x = tf.random.stateless_normal((5, 16), seed=[0, 1]) * tf.constant([[1e-3], [1.0], [10.0],
                                                                       [1e3], [1.0]])
  z, want = unit(x).numpy(), linear(x).numpy()
  np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(z, want / np.linalg.norm(want, axis=1, keepdims=True), rtol=1e-5,
                             atol=1e-7)


@pytest.mark.parametrize("head_norm", ["group", "batch"])
def test_projector_output_field_reaches_the_projector_only(head_norm):
  from tff_ssl.experiment import ExperimentConfig  # pylint: disable=g-import-not-at-top
  from tff_ssl.federated import ssl_model  # pylint: disable=g-import-not-at-top
  config = ExperimentConfig(method="fedavg", ssl="byol", head_norm=head_norm,
                            projector_output="unit", local_batch_size=4)
  projector, predictor = ssl_model.head_options(config)
  assert projector["unit_output"] and "unit_output" not in predictor
  default = ssl_model.head_options(ExperimentConfig(method="fedavg", ssl="byol", head_norm=head_norm,
                                                    local_batch_size=4))[0]
  assert "unit_output" not in default
  with pytest.raises(ValueError, match="projector_output"):
    ExperimentConfig(projector_output="l2")


def test_ssl_model_projects_images():
  tf.keras.utils.set_random_seed(0)
  m = models.build_ssl_model("resnet14", (16, 16, 1), [32, 32, 16], width=0.5)
  assert m.project(tf.zeros((3, 16, 16, 1))).shape == (3, 16)
  assert len(m.trainable_variables) == len(m.encoder.trainable_variables) + len(
      m.projector.trainable_variables)


def test_pool_grid_averages_each_region_of_the_last_feature_map():
  enc = models.build_encoder("resnet14", (28, 28, 1), stem_stride=2, pool_grid=2)
  assert enc.output_shape == (None, 4 * 64)
  # The features are the 2 x 2 region means of the 4 x 4 last map, flattened (row, column, channel).
  last = tf.keras.Model(enc.input, enc.get_layer("stage3_block2_out").output)
  x = np.random.default_rng(0).uniform(size=(2, 28, 28, 1)).astype(np.float32)
  m = last(x).numpy()
  expected = np.stack([m[:, r:r + 2, c:c + 2].mean(axis=(1, 2)) for r in (0, 2) for c in (0, 2)], 1)
  np.testing.assert_allclose(enc(x).numpy(), expected.reshape(2, -1), rtol=1e-5, atol=1e-6)
  # 7 x 7 (stem stride 1) into a 2 x 2 grid: regions of 4 x 4, 4 x 3, 3 x 4, 3 x 3 (padding not averaged).
  enc7 = models.build_encoder("resnet14", (28, 28, 1), pool_grid=2)
  m7 = tf.keras.Model(enc7.input, enc7.get_layer("stage3_block2_out").output)(x).numpy()
  np.testing.assert_allclose(enc7(x).numpy()[:, -64:], m7[:, 4:, 4:].mean(axis=(1, 2)), rtol=1e-5,
                             atol=1e-6)


def test_pool_grid_finer_than_the_last_feature_map_is_refused():
  assert models.resnet.last_feature_size("resnet18", 28, stem_stride=2) == 2
  assert models.resnet.last_feature_size("resnet50", 96, small_input=False) == 3
  with pytest.raises(ValueError, match="pool_grid 3 exceeds resnet18's last feature map of 2 x 2"):
    models.build_encoder("resnet18", (28, 28, 1), stem_stride=2, pool_grid=3)


@pytest.mark.parametrize("standardize", [True, False])
def test_every_convolution_is_invariant_to_its_kernels_scale_with_or_without_ws(standardize):
  """`weight_standardization=False` (the Barlow Twins collapse's control run) builds plain Conv2D
  layers, each still followed by GroupNorm: scaling any kernel leaves the features unchanged either
  way, so L-DAWA's shrinking of a kernel changes the next step's size, not the function."""
  enc = models.build_encoder("resnet14", (28, 28, 1), stem_stride=2,
                             weight_standardization=standardize)
  convs = [l for l in _layers(enc) if isinstance(l, tf.keras.layers.Conv2D)]
  assert len(convs) == 15 and all(isinstance(l, WSConv2D) == standardize for l in convs)
  x = tf.random.stateless_uniform((4, 28, 28, 1), seed=[3, 4])
  before = enc(x).numpy()
  for layer, s in zip(convs, [0.5, 3.0, 2.0] * 5):
    layer.kernel.assign(s * layer.kernel)
  np.testing.assert_allclose(enc(x).numpy(), before, rtol=2e-3, atol=2e-3)


def test_weight_standardization_is_a_resnet_option():
  from tff_ssl.experiment import ExperimentConfig  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match=r"^weight_standardization is a ResNet option; encoder "
                                       r"'vit_mini' is not a ResNet \(drop "
                                       r"--noweight_standardization\)$"):
    ExperimentConfig(encoder="vit_mini", weight_standardization=False)
  config = ExperimentConfig(encoder="resnet14", stem_stride=2, weight_standardization=False)
  layers = _layers(config.build_encoder((28, 28, 1)))
  assert not any(isinstance(l, WSConv2D) for l in layers)
  assert any(isinstance(l, WSConv2D) for l in _layers(ExperimentConfig().build_encoder(
      (28, 28, 1))))
