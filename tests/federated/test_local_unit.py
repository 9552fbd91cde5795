"""`--local_unit=steps`: every client takes `--local_steps` steps a round whatever its size, over the
batches epochs would take (each pass a fresh shuffle), cut at that count; and `--local_unit=epochs`
(the default) is unchanged."""

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl import runner
from tff_ssl.data import synthetic
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.federated import client_work, common
from tff_ssl.federated.functional import FunctionalModel


@pytest.fixture(scope="module")
def model():
  cfg = ExperimentConfig(method="fedavg", ssl="simclr", encoder="vit_mini", patch_size=7, depth=1,
                         width=0.25, projector=(8,), dataset="synthetic", seed=0)
  tf.keras.utils.set_random_seed(0)
  return FunctionalModel(runner.ssl_model_builder(cfg, synthetic("train", num_examples=8,
                                                                 seed=0).image_shape))


def train(model, n: int, unit: str, steps: int):
  """(update, mean loss) of one client of `n` images training `steps` of `unit` in batches of 2."""
  images = synthetic("train", num_examples=8, seed=0).images[:n]
  cfg = client_work.ClientConfig(ssl="simclr", client_optimizer="sgdm", client_learning_rate=0.05,
                                 local_steps=steps, local_batch_size=2, local_unit=unit, seed=0)
  weights = [tf.constant(w) for w in model.initial_weights]
  delta, _, mean, _ = client_work.local_training(
      model, cfg, weights, common.round_seed(0, 0), common.client_inputs(images, np.arange(n)))
  return [np.asarray(d) for d in delta], float(mean)


@pytest.mark.parametrize("n", [4, 8])  # 2 and 4 batches of 2 a pass.
def test_a_whole_number_of_passes_is_that_many_epochs_bit_for_bit(model, n):
  per_pass = n // 2
  for epochs in (1, 2):
    by_steps, loss_steps = train(model, n, "steps", epochs * per_pass)
    by_epochs, loss_epochs = train(model, n, "epochs", epochs)
    assert loss_steps == loss_epochs
    for a, b in zip(by_steps, by_epochs):
      np.testing.assert_array_equal(a, b)


def test_the_count_does_not_grow_with_the_client(model):
  """4 steps are 2 epochs of a 4-image client and 1 epoch of an 8-image one; 3 steps are neither
  a whole pass of the 4-image client nor what 2 or 4 steps give."""
  small, _ = train(model, 4, "steps", 4)
  np.testing.assert_array_equal(small[0], train(model, 4, "epochs", 2)[0][0])
  large, _ = train(model, 8, "steps", 4)
  np.testing.assert_array_equal(large[0], train(model, 8, "epochs", 1)[0][0])
  three = train(model, 4, "steps", 3)[0][0]
  assert not np.array_equal(three, train(model, 4, "steps", 2)[0][0])
  assert not np.array_equal(three, small[0])


def test_an_unknown_unit_is_refused_in_one_line():
  with pytest.raises(ValueError, match="local_unit"):
    client_work.ClientConfig(ssl="simclr", local_unit="batches")
  with pytest.raises(ValueError, match="local_unit"):
    ExperimentConfig(method="fedavg", ssl="simclr", local_unit="rounds")
