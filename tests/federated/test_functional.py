"""`FunctionalModel` keys weights by full variable path (an attention layer's kernels are distinct), and
the Keras LARS and the server LARS adapt the same tensors and take the same step."""

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl import models
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.optim.tff_lars import LARSOptimizer
from tff_ssl.optim.lars import LARS

TOKENS, DIM = 4, 8


class PositionEmbedding(tf.keras.layers.Layer):
  """A learned (1, tokens, dim) position embedding, as in a ViT."""

  def build(self, input_shape):
    self.embedding = self.add_weight(name="position_embedding", shape=(1,) + tuple(input_shape[1:]),
                                     initializer="random_normal")
    # A rank-1 tensor no exclusion pattern names: a rule by rank and a rule by name disagree on it.
    self.token = self.add_weight(name="class_token", shape=(input_shape[-1],),
                                 initializer="random_normal")

  def call(self, x):
    return x + self.embedding + self.token


def build_attention_model():
  """A one-block ViT-like encoder (patch projection, position embedding, attention, LayerNorm) + head."""
  tokens = tf.keras.Input((TOKENS, 3))
  h = tf.keras.layers.Dense(DIM, name="patch_projection")(tokens)
  h = PositionEmbedding(name="pos")(h)
  h = h + tf.keras.layers.MultiHeadAttention(2, 4, name="attention")(h, h)
  h = tf.keras.layers.LayerNormalization(name="norm")(h)
  encoder = tf.keras.Model(tokens, tf.keras.layers.GlobalAveragePooling1D()(h), name="encoder")
  x = tf.keras.Input((TOKENS, 3))
  return tf.keras.Model(x, tf.keras.layers.Dense(5, name="head")(encoder(x)))


@pytest.fixture(scope="module")
def attention_model():
  tf.keras.utils.set_random_seed(0)
  return FunctionalModel(build_attention_model)


def test_model_with_multi_head_attention_round_trips(attention_model):
  names = attention_model.names
  assert len(set(names)) == len(names) == 16
  for part in ("query", "key", "value", "attention_output"):
    assert f"encoder/attention/{part}/kernel" in names and f"encoder/attention/{part}/bias" in names
  assert "encoder/pos/position_embedding" in names and "head/kernel" in names
  x = tf.random.stateless_normal((3, TOKENS, 3), seed=[1, 2])
  # Called with its initial weights, the function is the Keras model it was recorded from.
  keras = attention_model.keras_model(attention_model.initial_weights)
  expected = keras(x).numpy()
  got = attention_model([tf.constant(w) for w in attention_model.initial_weights], x).numpy()
  np.testing.assert_array_equal(got, expected)
  # Other weights go where their names say: scaling only the value kernel changes the output.
  weights = [w.copy() for w in attention_model.initial_weights]
  weights[names.index("encoder/attention/value/kernel")] *= 2
  assert not np.allclose(attention_model([tf.constant(w) for w in weights], x).numpy(), expected)
  np.testing.assert_array_equal(attention_model.keras_model(weights)(x).numpy(),
                                attention_model([tf.constant(w) for w in weights], x).numpy())


def test_resnet_names_are_layer_path_and_weight_name():
  tf.keras.utils.set_random_seed(0)
  enc_shape = (8, 8, 1)

  def build():
    enc = models.build_encoder("resnet14", enc_shape, width=0.25, name="encoder")
    x = tf.keras.Input(enc_shape)
    return tf.keras.Model(x, models.build_mlp_head(enc.output_shape[-1], [8, 4])(enc(x)))

  model = FunctionalModel(build)
  assert model.names[0] == "encoder/stem_conv/kernel"
  assert all(n == f"{layer}/{n.split('/')[-1]}" for n, layer in zip(model.names, model.layer_names))
  assert len(set(model.names)) == len(model.names)


def test_keras_and_server_lars_adapt_the_same_tensors_and_agree(attention_model):
  fm = attention_model
  rng = np.random.default_rng(0)
  grads = [rng.normal(size=s.shape).astype(np.float32) for s in fm.weight_specs]
  hparams = dict(momentum=0.9, eta=0.01)
  # Keras LARS on the Keras model's variables (Keras names), two steps.
  keras = fm.keras_model(fm.initial_weights)
  index = {}
  for v in keras.variables:
    local = v.name.split(":")[0]
    [i] = [i for i, n in enumerate(fm.names) if ("/" + n).endswith("/" + local)]
    index[id(v)] = i
  keras_opt = LARS(0.5, lars_weight_decay=1e-3, **hparams)
  server_opt = LARSOptimizer(0.5, weight_decay=1e-3, names=fm.names, **hparams)
  assert [keras_opt._adapted(v) for v in keras.variables] == [  # pylint: disable=protected-access
      server_opt._adapted(fm.initial_weights)[index[id(v)]]  # pylint: disable=protected-access
      for v in keras.variables]
  adapted = dict(zip(fm.names, server_opt._adapted(fm.initial_weights)))  # pylint: disable=protected-access
  assert adapted["encoder/pos/position_embedding"] and adapted["encoder/attention/query/kernel"]
  assert not adapted["encoder/attention/query/bias"] and not adapted["encoder/norm/gamma"]
  assert not adapted["encoder/pos/class_token"]
  state = server_opt.initialize(tuple(fm.weight_specs))
  weights = tuple(tf.constant(w) for w in fm.initial_weights)
  for _ in range(2):
    keras_opt.apply_gradients([(tf.constant(grads[index[id(v)]]), v) for v in keras.variables])
    state, weights = server_opt.next(state, weights, tuple(tf.constant(g) for g in grads))
  for v in keras.variables:
    np.testing.assert_allclose(v.numpy(), weights[index[id(v)]].numpy(), rtol=1e-6, atol=1e-7)


def test_server_lars_rejects_names_of_other_tensors():
  opt = LARSOptimizer(1.0, names=["a/kernel"])
  with pytest.raises(ValueError, match="given 1 tensor names for 2 tensors"):
    opt.initialize((tf.TensorSpec([2, 2]), tf.TensorSpec([2])))


def test_keras_models_carry_the_given_weights_before_and_after_a_tff_trace():
  """The first Keras model is the one built at construction (no second build), the later ones are
  built anew unless one was given back (`release`); each carries its own weights and answers like
  the functional model, also after a TFF trace rebuilt the model in a TF1 graph (which turns Keras'
  classes into their TF1 versions)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  tf.keras.utils.set_random_seed(3)
  fm = FunctionalModel(lambda: models.build_encoder("resnet14", (8, 8, 3), width=0.25))
  x = np.random.default_rng(0).uniform(size=(2, 8, 8, 3)).astype(np.float32)
  specs = [tff.TensorType(s.dtype.as_numpy_dtype, s.shape) for s in fm.weight_specs]

  @tff.tensorflow.computation(specs, tff.TensorType(np.float32, [None, 8, 8, 3]))
  def forward(weights, images):
    return fm(list(weights), images, training=False)

  shifted = [w + 0.01 for w in fm.initial_weights]
  first = fm.keras_model(shifted)
  outputs = [first(x, training=False).numpy()]  # Before any other Keras model is built.
  np.testing.assert_allclose(outputs[0], forward(shifted, x), atol=1e-5)
  second = fm.keras_model(fm.initial_weights)
  assert second is not first
  outputs.append(second(x, training=False).numpy())
  np.testing.assert_allclose(outputs[1], forward(fm.initial_weights, x), atol=1e-5)
  assert np.abs(outputs[0] - outputs[1]).max() > 1e-3  # Each its own weights.
  # A model given back is lent again (no build), with the new call's weights; one still held is not.
  fm.release(first)
  third = fm.keras_model([w - 0.01 for w in fm.initial_weights])
  assert third is first and fm.keras_model(fm.initial_weights) not in (first, second)
  np.testing.assert_allclose(third(x, training=False).numpy(),
                             forward([w - 0.01 for w in fm.initial_weights], x), atol=1e-5)


def test_a_released_encoder_gives_its_whole_model_back_and_its_features_follow_the_new_weights():
  """`ssl_model.release` takes the encoder that `keras_encoder` lent (a layer of the SSL model): the
  next `keras_encoder` is the same Keras layer carrying the new weights, and the probe's compiled
  feature extraction (kept per encoder) reads them, not the old ones."""
  from tff_ssl import experiment  # pylint: disable=g-import-not-at-top
  from tff_ssl.evaluation import protocols  # pylint: disable=g-import-not-at-top
  from tff_ssl.federated import ssl_model  # pylint: disable=g-import-not-at-top
  tf.keras.utils.set_random_seed(4)
  config = experiment.ExperimentConfig(dataset="synthetic", encoder="resnet8", width=0.25,
                                       projector=(16, 8))
  fm = FunctionalModel(ssl_model.ssl_model_builder(config, (8, 8, 3)))
  images = np.random.default_rng(1).integers(0, 256, size=(3, 8, 8, 3), dtype=np.uint8)
  encoder = ssl_model.keras_encoder(fm, fm.initial_weights)
  before = protocols.extract_features(encoder, images)
  ssl_model.release([("global", encoder)])
  shifted = [w * 1.5 for w in fm.initial_weights]
  again = ssl_model.keras_encoder(fm, shifted)
  assert again is encoder
  fresh = FunctionalModel(ssl_model.ssl_model_builder(config, (8, 8, 3)))
  expected = protocols.extract_features(ssl_model.keras_encoder(fresh, shifted), images)
  np.testing.assert_allclose(protocols.extract_features(again, images), expected, atol=1e-5)
  assert np.abs(before - expected).max() > 1e-3
  ssl_model.release([("centralized", tf.keras.Sequential([tf.keras.layers.Flatten()]))])  # Ignored.


class ListHeld(tf.keras.layers.Layer):
  """Keeps its weights in a list: a place `FunctionalModel` cannot hand a new tensor to."""

  def build(self, input_shape):
    self.scales = [self.add_weight(name=f"scale{i}", shape=(input_shape[-1],), initializer="ones")
                   for i in range(2)]

  def call(self, x):
    return x * self.scales[0] + self.scales[1]


def _list_held_model():
  x = tf.keras.Input((8, 8, 3))
  return tf.keras.Model(x, tf.keras.layers.GlobalAveragePooling2D()(ListHeld(name="held")(x)))


@pytest.mark.parametrize("build", [
    lambda: models.build_encoder("resnet14", (8, 8, 3), width=0.25),
    lambda: models.build_encoder("vit_mini", (8, 8, 3), patch_size=4, depth=1, width=0.5),
    lambda: models.build_encoder("alexnet", (8, 8, 3), width=0.125),
    _list_held_model], ids=["resnet14", "vit_mini", "alexnet", "list_held"])
def test_a_model_called_again_computes_what_a_fresh_build_computes(build):
  """The model is built once per graph mode and later calls hand its layers their tensors: two
  calls in one TFF computation and a call in a second one (after an eager model was built) give,
  bit for bit, what a model built for each call gives (a model that keeps a weight in a list is
  built at every call)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  tf.keras.utils.set_random_seed(5)
  fm = FunctionalModel(build)
  specs = [tff.TensorType(s.dtype.as_numpy_dtype, s.shape) for s in fm.weight_specs]
  images = tff.TensorType(np.float32, [None, 8, 8, 3])
  x = np.random.default_rng(0).uniform(size=(3, 8, 8, 3)).astype(np.float32)
  a = fm.initial_weights
  b = [w * 1.5 + 0.01 for w in a]

  @tff.tensorflow.computation(specs, specs, images)
  def twice(first, second, images):
    return fm(list(first), images), fm(list(second), images)

  build()  # An eager model built in between turns Keras' classes to their TF2 versions.

  @tff.tensorflow.computation(specs, images)  # TFF traces it here.
  def once(weights, images):
    return fm(list(weights), images)

  got = [*twice(a, b, x), once(b, x)]

  def fresh(weights):
    new = FunctionalModel(build)  # Its first call in a TF1 graph builds the model.

    @tff.tensorflow.computation(specs, images)
    def forward(weights, images):
      return new(list(weights), images)
    return forward(weights, x)

  expected = [fresh(a), fresh(b), fresh(b)]
  assert np.abs(expected[0] - expected[1]).max() > 1e-3
  for g, e in zip(got, expected):
    np.testing.assert_array_equal(g, e)
  assert (True in fm._bound or False in fm._bound) == (build is not _list_held_model)  # pylint: disable=protected-access
