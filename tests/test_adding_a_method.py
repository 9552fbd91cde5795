"""docs/adding_a_method.md's examples, followed as written: each module, registered, runs rounds
through the registry and does what it says, and `ExperimentConfig` validates it like any method."""

import importlib.util
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl import methods, runner
from tff_ssl import ssl as ssl_lib
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.federated import common
from tff_ssl.federated.functional import FunctionalModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = (12, 12, 1)


def doc_example(heading: str) -> str:
  text = open(os.path.join(ROOT, "docs", "adding_a_method.md")).read()
  section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
  [code] = re.findall(r"```python\n(.*?)```", section, re.S)
  return code


def load(tmp_path_factory, heading: str, name: str):
  path = tmp_path_factory.mktemp("example") / f"{name}.py"
  path.write_text(doc_example(heading))
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if module.METHOD.name not in methods.METHODS:
    methods.register(module.METHOD)  # The registry line, added at run time.
  return module


@pytest.fixture(scope="module")
def head(tmp_path_factory):
  return load(tmp_path_factory, "A method that trains part of the model", "fedavg_head").METHOD


@pytest.fixture(scope="module")
def varfloor(tmp_path_factory):
  return load(tmp_path_factory, "A method with a client-loss term and a report", "fedavg_varfloor")


def config_of(method: str, **kwargs) -> ExperimentConfig:
  fields = dict(method=method, ssl="simclr", dataset="synthetic", encoder="resnet8", width=0.25,
                projector=(16, 8), rounds=2, num_clients=8, samples_per_client=2,
                clients_per_round=4, client_learning_rate=0.05, server_optimizer="lars",
                server_learning_rate=1.0, seed=0)
  return ExperimentConfig(**{**fields, **kwargs})


def clients_of(rng, count=4, size=2):
  return [common.client_inputs(rng.integers(0, 256, (size,) + SHAPE, dtype=np.uint8),
                               np.arange(size * k, size * k + size)) for k in range(count)]


def test_the_head_example_runs_and_trains_only_the_projector(head):
  config = config_of(head.name)
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(runner.ssl_model_builder(config, SHAPE))
  process = runner.build_process(config, model, SHAPE)
  clients = clients_of(np.random.default_rng(0))
  state = process.initialize()
  for _ in range(2):
    state, metrics = process.next(state, clients)
  assert np.isfinite(metrics["loss"])
  for name, w, w0 in zip(model.names, state.weights, model.initial_weights):
    if name.startswith("encoder/"):
      assert np.array_equal(w, w0), name
    else:
      assert not np.array_equal(w, w0), name


def test_the_head_example_is_validated_like_any_method(head):
  with pytest.raises(ValueError, match="unknown ssl .nope."):
    ExperimentConfig(method=head.name, ssl="nope", dataset="synthetic")
  with pytest.raises(ValueError, match="--steps is not used by method 'fedavg_head'"):
    ExperimentConfig(method=head.name, ssl="simclr", dataset="synthetic",
                     steps=5).check_fields_for_method({"steps"})


def test_the_term_example_adds_its_loss_and_reports_what_the_clients_measured(varfloor):
  """One round of one full-batch local step: each client's reported std is that of its projections
  at the broadcast model, on its own views (recomputed here from the model), and the server logs
  their mean; the loss is the SSL loss plus the floor."""
  config = config_of(varfloor.METHOD.name, samples_per_client=4)
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(runner.ssl_model_builder(config, SHAPE))
  process = runner.build_process(config, model, SHAPE)
  clients = clients_of(np.random.default_rng(1), size=4)
  state = process.initialize()
  _, metrics = process.next(state, clients, client_ids=[3, 1, 0, 2])
  cfg = process.config
  seed = common.round_seed(cfg.seed, 0)
  stds, losses = [], []
  for c in clients:
    v1, v2 = common.views(c, seed, cfg.augment)
    z1, z2 = (common.encode_outputs(model, state.weights, v1, v2)[0][k].numpy() for k in (0, 1))
    std = np.sqrt(np.concatenate([z1, z2]).var(axis=0) + 1e-4)
    stds.append(std.mean())
    simclr = float(cfg.method.loss(ssl_lib.Outputs(tf.constant(z1), tf.constant(z2)), cfg.hparams))
    losses.append(simclr + np.maximum(1 - std, 0).mean())
  assert float(metrics["aggregation"]["projection_std"]) == pytest.approx(np.mean(stds), rel=1e-4)
  assert metrics["loss"] == pytest.approx(np.mean(losses), rel=1e-4)  # Equal clients: plain mean.
  with pytest.raises(ValueError, match="needs the clients' ids"):
    process.next(state, clients)  # Reporting clients travel with their ids.
