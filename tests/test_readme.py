"""The README's "Adding a method" example, followed as written: its module, registered, runs rounds
through the registry, trains only what it says, and `ExperimentConfig` validates it like any method."""

import importlib.util
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl import methods
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.federated import common, runner
from tff_ssl.federated.functional import FunctionalModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = (12, 12, 1)


def readme_example() -> str:
  text = open(os.path.join(ROOT, "README.md")).read()
  section = text.split("## Adding a method", 1)[1].split("\n## ", 1)[0]
  [code] = re.findall(r"```python\n(.*?)```", section, re.S)
  return code


@pytest.fixture(scope="module")
def method(tmp_path_factory):
  path = tmp_path_factory.mktemp("example") / "fedavg_head.py"
  path.write_text(readme_example())
  spec = importlib.util.spec_from_file_location("fedavg_head", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if module.METHOD.name not in methods.METHODS:
    methods.register(module.METHOD)  # The registry line, added at run time.
  return module.METHOD


def test_the_readme_example_method_runs_and_trains_only_the_projector(method):
  config = ExperimentConfig(method=method.name, ssl="simclr", dataset="synthetic",
                            encoder="resnet14", width=0.25, projector=(16, 8), rounds=2,
                            num_clients=8, samples_per_client=2, clients_per_round=4,
                            client_learning_rate=0.05, server_optimizer="lars",
                            server_learning_rate=1.0, seed=0)
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(runner.ssl_model_builder(config, SHAPE))
  process = runner.build_process(config, model, SHAPE)
  rng = np.random.default_rng(0)
  clients = [common.client_inputs(rng.integers(0, 256, (2,) + SHAPE, dtype=np.uint8),
                                  np.arange(2 * k, 2 * k + 2)) for k in range(4)]
  state = process.initialize()
  for _ in range(2):
    state, metrics = process.next(state, clients)
  assert np.isfinite(metrics["loss"])
  for name, w, w0 in zip(model.names, state.weights, model.initial_weights):
    if name.startswith("encoder/"):
      assert np.array_equal(w, w0), name
    else:
      assert not np.array_equal(w, w0), name


def test_the_readme_example_method_is_validated_like_any_method(method):
  with pytest.raises(ValueError, match="unknown ssl .nope."):
    ExperimentConfig(method=method.name, ssl="nope", dataset="synthetic")
  with pytest.raises(ValueError, match="--steps is not used by method 'fedavg_head'"):
    ExperimentConfig(method=method.name, ssl="simclr", dataset="synthetic",
                     steps=5).check_fields_for_method({"steps"})
