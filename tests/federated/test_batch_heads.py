"""Batch-statistics SSL heads (`--head_norm=batch`): the normalization by hand, each SSL method's
published layout, and each real client's statistics its own in the grouped simulation."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl import experiment, models
from tff_ssl.federated import common, ssl_model
from tff_ssl.federated.client_work import ClientConfig
from tff_ssl.federated.fedavg_process import FedAvgSSLProcess
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.federated.grouping import Simulation
from tff_ssl.models.layers import BatchStatNormalization, batch_segments
from tests.federated.test_grouping import (AUGMENT, FEDAVG_ROUNDS, LR, REFERENCE, SEED, SGD, SHAPE,
                                           assert_same_rounds, rounds_of_clients, run_two_rounds,
                                           small_encoder)


def test_batch_statistics_by_hand_per_segment():
  x = np.array([[1., 10.], [3., 30.], [0., -4.], [4., 4.]], np.float32)
  layer = BatchStatNormalization(affine=False)
  standardize = lambda a: (a - a.mean(0)) / np.sqrt(a.var(0) + 1e-5)  # noqa: E731
  np.testing.assert_allclose(layer(x).numpy(), standardize(x), atol=1e-6)
  with batch_segments(2):  # Each half by its own statistics.
    np.testing.assert_allclose(layer(x).numpy(), np.concatenate([standardize(x[:2]),
                                                                 standardize(x[2:])]), atol=1e-6)
  assert not layer.weights
  affine = BatchStatNormalization()
  affine.build((None, 2))
  affine.gamma.assign([2., 3.])
  affine.beta.assign([1., -1.])
  np.testing.assert_allclose(affine(x).numpy(), standardize(x) * [2., 3.] + [1., -1.], atol=1e-5)


def _layers(head):
  return [type(layer).__name__ + ("" if getattr(layer, "affine", True) else "(non-affine)")
          for layer in head.layers[1:]]


@pytest.mark.parametrize("ssl,projector,predictor", [
    ("byol", ["Dense", "BatchStatNormalization", "ReLU", "Dense"],
     ["Dense", "BatchStatNormalization", "ReLU", "Dense"]),
    ("simsiam", ["Dense", "BatchStatNormalization", "ReLU", "Dense",
                 "BatchStatNormalization(non-affine)"],
     ["Dense", "BatchStatNormalization", "ReLU", "Dense"]),
    ("simclr", ["Dense", "BatchStatNormalization", "ReLU", "Dense"], None),
    ("cco", ["Dense", "BatchStatNormalization", "ReLU", "Dense"], None),
    ("moco", ["Dense", "ReLU", "Dense"], None),  # MoCo v2's head has no normalization.
    ("mocov3", ["Dense", "BatchStatNormalization", "ReLU", "Dense",
                "BatchStatNormalization(non-affine)"],
     ["Dense", "BatchStatNormalization", "ReLU", "Dense"]),
])
def test_each_ssl_method_gets_its_published_heads(ssl, projector, predictor):
  method = {"byol": "fedbyol", "simsiam": "fedavg", "simclr": "fedavg", "cco": "centralized",
            "moco": "fedmoco", "mocov3": "fedavg"}[ssl]
  config = experiment.ExperimentConfig(method=method, ssl=ssl, dataset="synthetic", width=0.25,
                                       projector=(16, 8), head_norm="batch")
  model = ssl_model.ssl_model_builder(config, (28, 28, 1))()
  assert _layers(model.get_layer("projector")) == projector
  if predictor:
    assert _layers(model.get_layer("predictor")) == predictor
  # A bias only where no normalization follows.
  dense = [l for l in model.get_layer("projector").layers if isinstance(l, tf.keras.layers.Dense)]
  assert [l.use_bias for l in dense] == ([True, True] if ssl == "moco" else
                                         [False, projector[-1] == "Dense"])
  group = ssl_model.ssl_model_builder(dataclasses.replace(config, head_norm="group"),
                                      (28, 28, 1))()
  assert "GroupNormalization" in _layers(group.get_layer("projector"))


def build_batch_head_model(output_norm):
  """test_grouping's small encoder with batch-statistics heads (projector, predictor)."""
  x = tf.keras.Input(SHAPE)
  h = small_encoder(x)
  z = models.build_mlp_head(64, [64, 32], norm="batch", output_norm=output_norm)(h)
  p = models.build_mlp_head(32, [64, 32], name="predictor", norm="batch")(z)
  return tf.keras.Model(x, [z, p])


@pytest.mark.parametrize("ssl,steps,simulation", [
    ("byol", 1, Simulation()),  # One step, one slot: where group heads take one batched pass.
    ("simsiam", 2, Simulation(group_size=2)),
])
def test_grouped_equals_reference_each_client_its_own_statistics(ssl, steps, simulation):
  """The reference simulation runs every client in a slot of its own, so its heads' statistics are
  its own images'. The grouped one equals it; the negative control, the one batched pass over the
  group's clients that GroupNorm heads allow, mixes the clients' statistics and differs."""
  tf.keras.utils.set_random_seed(1)
  model = FunctionalModel(lambda: build_batch_head_model(output_norm=ssl == "simsiam"))
  config = ClientConfig(ssl=ssl, client_learning_rate=LR[ssl], local_steps=steps,
                           augment=AUGMENT, seed=SEED, head_norm="batch")
  rounds = rounds_of_clients(FEDAVG_ROUNDS)
  states = []
  want = run_two_rounds(FedAvgSSLProcess(model, SHAPE, SGD, config, simulation=REFERENCE), rounds,
                        record=states)
  got = run_two_rounds(FedAvgSSLProcess(model, SHAPE, SGD, config, simulation=simulation), rounds,
                       states=states)
  assert_same_rounds(got, want)
  if steps == 1:
    mixed = run_two_rounds(FedAvgSSLProcess(
        model, SHAPE, SGD, dataclasses.replace(config, head_norm="group"), simulation=simulation),
                           rounds, states=states)
    gap = max(np.abs(a - b).max() / np.abs(b).max() for a, b in zip(mixed[0][0], want[0][0]))
    assert gap > 1e-2, gap


def test_a_client_needs_two_images_for_batch_statistics():
  config = ClientConfig(ssl="byol", head_norm="batch")
  assert config.min_samples == 2 and ClientConfig(ssl="byol").min_samples == 1
  with pytest.raises(ValueError, match=r"^unknown head_norm 'layer'; choose one of \['batch', 'group'\]$"):
    ClientConfig(head_norm="layer")


def test_each_view_is_normalized_over_its_own_images():
  """Both views go through one forward pass, and each gets the statistics a pass of its own would
  (the published code forwards each view separately)."""
  tf.keras.utils.set_random_seed(2)
  model = FunctionalModel(lambda: build_batch_head_model(output_norm=True))
  weights = [tf.constant(w) for w in model.initial_weights]
  rng = np.random.default_rng(0)
  v1, v2 = (tf.constant(rng.uniform(size=(6,) + SHAPE), tf.float32) for _ in range(2))
  (z1, z2), (p1, p2) = common.encode_outputs(model, weights, v1, v2)
  for view, z, p in ((v1, z1, p1), (v2, z2, p2)):
    alone_z, alone_p = model(weights, view, training=True)
    np.testing.assert_allclose(z.numpy(), alone_z.numpy(), atol=1e-5)
    np.testing.assert_allclose(p.numpy(), alone_p.numpy(), atol=1e-5)
