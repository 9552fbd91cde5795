"""FedFoA's Tables 1-3 as data: the grid is the paper's (Sec. 4.1), the paper scale constructs and runs
2 rounds of every row (full-width ResNet-18 / the four heterogeneous architectures, projection 256, on
mock CIFAR-10), the checks are the paper's claim, and the appendix lays out each architecture."""

import dataclasses
import json
import os

import numpy as np
import pytest

import tasks
from tasks import fedfoa_table
from tff_ssl import experiment, reproduce
from tff_ssl.federated import runner
from tests.tables.mock_data import mock_cifar

ROW_KEYS = [k for k, _, _ in fedfoa_table.HOMOGENEOUS + fedfoa_table.HETEROGENEOUS]


@pytest.mark.parametrize("scale", ["mini", "paper"])
def test_grid_is_the_papers(scale):
  table = tasks.get_table("fedfoa", scale)
  assert [r.key for r in table.rows] == ROW_KEYS
  todo, skipped = reproduce.cells(table)
  assert not skipped and len(todo) == 8 * len(table.columns)
  n = 256 if scale == "paper" else 64
  for cell in todo:
    c = table.cell_config(cell.row, cell.column)
    # IID, every client in every round; SGD with momentum at 0.032, BYOL's target EMA 0.99;
    # FedFoA's lambda = 0.01 after 5 warm-up rounds; projection n.
    assert (c.alpha, c.clients_per_round, c.ssl) == (1000.0, c.num_clients, "byol")
    assert (c.client_optimizer, c.client_learning_rate, c.target_decay) == ("sgdm", 0.032, 0.99)
    assert c.fedfoa == cell.row.key.endswith("_foa")
    assert (c.fedfoa_lambda, c.fedfoa_warmup, c.projector[-1]) == (0.01, 5, n)
    assert c.local_batch_size == (500 if scale == "paper" else 128) >= n
    if c.method == "heterogeneous":
      assert c.num_clients == 4 and c.projector == (n,)  # The linear calibration layer.
      assert c.architectures == (("resnet18", "vgg9", "alexnet", "resnet34") if scale == "paper"
                                 else ("resnet14", "resnet18", "vgg9", "alexnet"))
    else:
      assert (c.num_clients, c.encoder) == (5, "resnet18")
      assert c.method == {"fedbyol": "fedbyol", "fedu": "fedu", "fedema": "fedema"}[
          cell.row.key.removesuffix("_foa")]
  column = table.columns[0].key
  assert table.paper[("linear_100", "fedema_foa", column)] == 78.82
  assert table.paper[("linear_100", "hetero_byol", column)] == 74.33
  if scale == "paper":
    assert table.paper[("linear_100", "fedu_foa", "cifar100")] == 47.29
    c = table.cell_config(table.rows[0], table.columns[0])
    assert (c.rounds, c.local_steps, c.width, c.projector) == (100, 5, 1.0, (4096, 256))


def test_checks_are_the_papers_claim():
  table = fedfoa_table.mini()
  ours = {"fedbyol": 0.60, "fedbyol_foa": 0.62, "fedu": 0.61, "fedu_foa": 0.60, "fedema": 0.63,
          "fedema_foa": 0.64, "hetero_byol": 0.50, "hetero_foa": 0.55}
  records = [{"evaluation": "linear_100", "row": r, "column": "fashion_mnist", "ours": v}
             for r, v in ours.items()]
  assert table.checks(table, records) == [
      "Fashion-MNIST: FedBYOL + FedFoA 62.0 is above FedBYOL 60.0 (+2.0 points)",
      "Fashion-MNIST: FedU + FedFoA 60.0 **is not above** FedU 61.0 (-1.0 points)",
      "Fashion-MNIST: FedEMA + FedFoA 64.0 is above FedEMA 63.0 (+1.0 points)",
      "Fashion-MNIST: FedFoA (heterogeneous) 55.0 is above BYOL (alone, heterogeneous) 50.0 "
      "(+5.0 points)"]


@pytest.mark.parametrize("row_key", ROW_KEYS)  # One test a row: pytest-xdist spreads them.
def test_paper_scale_runs_two_rounds(row_key):
  """The paper-scale row built and run for 2 rounds of one local epoch on mock CIFAR-10, one client a
  round. FedFoA factorizes a batch's 256-dimensional projections, so its clients hold 256 images
  (the paper's batch 500 takes them whole); the others 8 (the paper's 10,000 do not fit the suite)."""
  table = fedfoa_table.paper()
  row = table.row(row_key)
  config = table.cell_config(row, table.columns[0])
  samples = 256 if config.fedfoa else 8
  config = dataclasses.replace(config, samples_per_client=samples, local_steps=1,
                               num_clients=len(config.architectures)
                               if config.method == "heterogeneous" else 2, clients_per_round=1)
  with mock_cifar(10, 1100, 10):
    train, _ = experiment.load_splits(config)
    runs = list(runner.trajectory(config, train, 2))
  assert [r for r, _, _, _ in runs] == [0, 1]
  metrics = [m for _, _, _, m in runs]
  assert all(np.isfinite(m["loss"]) for m in metrics)
  if config.fedfoa:  # R of the batches' 256-dim projections reached the bank.
    agg = metrics[-1]["aggregation"]
    assert agg["fedfoa_trace"] > 0 and agg["fedfoa_bank_entries"] == 1  # Capacity: 1 a round.
    assert agg["fedfoa_partners"] == 0  # 2 rounds are inside the 5-round warm-up.
  if config.method == "heterogeneous":
    assert runs[-1][2] == []  # No global weights.
    assert {f"loss_{a}" for a in config.architectures} & set(metrics[0]["aggregation"])


def test_appendix_lays_out_each_architecture_beside_the_papers(tmp_path):
  table = fedfoa_table.mini()
  out = str(tmp_path)
  archs = table.row("hetero_foa").config.architectures
  with open(os.path.join(out, "hetero_random_init.json"), "w") as f:
    json.dump({"fashion_mnist": {a: 0.5 for a in archs}}, f)
  for key, acc in (("hetero_byol", 0.6), ("hetero_foa", 0.7)):
    cell = os.path.join(out, "cells", key, "fashion_mnist")
    os.makedirs(cell)
    with open(os.path.join(cell, "results.json"), "w") as f:
      json.dump({"linear_probe_accuracy_pretrained": acc,
                 "linear_probe_accuracy_pretrained_each": {a: acc for a in archs}}, f)
  md = table.appendix(table, out)
  assert md.startswith("## Heterogeneous clients, each architecture")
  assert "| random init | 50.0 | 50.0 | 50.0 | 50.0 | 50.0 |" in md
  assert "| FedFoA (heterogeneous) | 70.0 | 70.0 | 70.0 | 70.0 | 70.0 |" in md
  assert "| FedFoA | 80.45 | 75.86 | 71.95 | 81.14 | 77.35 |" in md  # Table 1 as printed.
  assert "| FedMD | 76.45 | 74.32 | 70.13 | 76.74 | 74.41 |" in md
