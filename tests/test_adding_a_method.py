"""docs/adding_a_method.md's examples, followed as written: each method module, registered, runs rounds
through the registry and does what it says, and `ExperimentConfig` validates it like any method; the
paper table, registered, runs through `reproduce`."""

import importlib.util
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import tasks
from tff_ssl import methods, reproduce, runner
from tff_ssl import ssl as ssl_lib
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.federated import common, fedavg_process, server_step
from tff_ssl.federated.functional import FunctionalModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = (12, 12, 1)


def doc_example(heading: str) -> str:
  text = open(os.path.join(ROOT, "docs", "adding_a_method.md")).read()
  section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
  [code] = re.findall(r"```python\n(.*?)```", section, re.S)
  return code


def load(tmp_path_factory, heading: str, name: str):
  """The section's module, saved and imported as written; a method's registry line added at run
  time."""
  path = tmp_path_factory.mktemp("example") / f"{name}.py"
  path.write_text(doc_example(heading))
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if hasattr(module, "METHOD") and module.METHOD.name not in methods.METHODS:
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


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
  return load(tmp_path_factory, "A method with a server stage", "fedavg_capped")


def test_the_stage_example_caps_the_update_the_server_optimizer_takes(capped):
  """Plain SGD at rate 1 on the server: the global model moves by the capped update, whose norm is
  min(the aggregate's norm, CAP); the stage logs the aggregate's norm."""
  config = config_of(capped.METHOD.name, server_optimizer="sgd", server_learning_rate=1.0,
                     client_learning_rate=0.5)
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(runner.ssl_model_builder(config, SHAPE))
  process = runner.build_process(config, model, SHAPE)
  state = process.initialize()
  new, metrics = process.next(state, clients_of(np.random.default_rng(2)))
  norm = float(metrics["aggregation"]["update_norm"])
  moved = np.sqrt(sum(np.sum(np.square(np.float64(a) - b)) for a, b in zip(new.weights,
                                                                            state.weights)))
  assert norm > capped.CAP  # The cap binds in this round.
  assert moved == pytest.approx(capped.CAP, rel=1e-4)
  assert list(state.method_state) == ["update_cap"]
  # A second stage that changes the update would make their order matter: refused in one line.
  with pytest.raises(ValueError, match="'update_cap' and 'again' both change the round's update"):
    again = capped.UpdateCap()
    again.key = "again"
    fedavg_process.FedAvgSSLProcess(model, SHAPE, server_step.server_optimizer_for(
        config, model.names), process.config, stages=(capped.UpdateCap(), again))


def test_the_table_example_runs_through_reproduce_and_checks_its_claim(tmp_path_factory, monkeypatch):
  """The example's registry line (at run time), its grid, then one round of each row on a tiny
  synthetic stand-in through `reproduce`: table.md checks the paper's claim (here "untested":
  one round clears no gate)."""
  fedx_gain = load(tmp_path_factory, "A paper table", "fedx_gain")
  monkeypatch.setitem(tasks.TABLES, fedx_gain.NAME, fedx_gain.SCALES)
  table = tasks.get_table("fedx_gain", "mini")
  assert [r.key for r in table.rows] == ["fedsimclr", "fedsimclr_fedx"]
  assert table.cell_config(table.rows[1], table.columns[0]).fedx
  tiny = table.variant(settings=dict(
      dataset="synthetic", encoder="resnet8", width=0.25, projector=(16, 8), predictor=(16, 8),
      num_clients=4, samples_per_client=8, clients_per_round=2)).capped(1)
  out = str(tmp_path_factory.mktemp("table"))
  result = reproduce.reproduce(tiny, out, progress=False)
  page = open(result["table_md"]).read()
  assert "FedSimCLR + FedX" in page and fedx_gain.SOURCE in page
  assert "Tally: the paper's claims: 1 checks, 0 hold, 0 fail, 1 untested." in page
  assert "untested: below the baselines" in page
