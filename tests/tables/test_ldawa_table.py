"""L-DAWA's Table 2 as data: the grid is the paper's (Sec. 4.2), and the paper scale's L-DAWA_Loss row
runs on mock CIFAR-10 (2 rounds, local epochs capped, the model shrunk) and is built at paper size
(tests/tables/paper_smoke.py)."""

import csv
import json
import os

import pytest

import tasks
from tasks import ldawa_table2
from tests.tables import gates
from tff_ssl import reproduce, table_report
from tests.tables import paper_smoke
from tests.tables.mock_data import mock_cifar


@pytest.mark.parametrize("scale", ["mini", "paper"])
def test_grid_is_the_papers(scale):
  table = tasks.get_table("ldawa_table2", scale)
  assert [r.key for r in table.rows] == ["fedavg", "loss", "fedu", "euc", "ldawa", "ldawa_fedavg",
                                         "ldawa_loss", "ldawa_fedu"]
  assert [e.label_fraction for e in table.evaluations] == [1.0, 0.1, 0.01]
  todo, skipped = reproduce.cells(table)
  assert not skipped and len(todo) == 8 * len(table.columns)
  aggregators = {"fedu": "fedavg", "ldawa_fedu": "ldawa_fedavg", "euc": "fedavg"}
  method = {"fedu": "fedu", "ldawa_fedu": "fedu", "euc": "fedlama"}
  for cell in todo:
    c = table.cell_config(cell.row, cell.column)
    assert c.aggregator == aggregators.get(cell.row.key, cell.row.key)
    assert (c.method, c.ssl) == (method.get(cell.row.key, "fedavg"),
                                 "simclr" if cell.column.key.endswith("simclr") else "cco")
    # Cross-silo: 10 clients, all in every round, Dirichlet 0.1 over labels with unequal sizes.
    assert (c.num_clients, c.clients_per_round, c.partition, c.alpha) == (
        10, 10, "dirichlet_split", 0.1)
    # Client SGD lr 0.03, momentum 0.9, weight decay 1e-4; the server takes the aggregate as is.
    assert (c.client_optimizer, c.client_learning_rate, c.client_weight_decay) == (
        "sgdm", 0.03, 1e-4)
    assert (c.server_optimizer, c.server_learning_rate, c.server_lr_schedule) == (
        "sgd", 1.0, "constant")
    assert c.eval_label_fraction == 1.0
    # Paper: ResNet-18; mini: the mini regime's ResNet-14 with grid pooling and milder crops.
    assert (c.encoder, c.pool_grid, c.crop_min_scale) == (
        ("resnet18", 1, 0.08) if scale == "paper" else ("resnet14", 2, 0.5))
    if c.ssl == "cco":  # Barlow Twins' lambda 5e-3 in CCO's lambda / (d - 1) form.
      assert c.cco_lambda == pytest.approx(5e-3 * (c.projector[-1] - 1))
  if scale == "paper":
    assert {c.key for c in table.columns} == {"cifar10_simclr", "cifar10_barlow_twins",
                                               "cifar100_simclr", "cifar100_barlow_twins"}
    c = table.cell_config(table.rows[0], table.column("cifar100_simclr"))
    assert (c.dataset, c.rounds, c.local_steps, c.local_batch_size, c.width, c.split_samples) == (
        "cifar100", 200, 10, 256, 1.0, 0)
  else:
    c = table.cell_config(table.rows[0], table.columns[0])
    assert c.dataset == "fashion_mnist" and c.rounds == ldawa_table2.MINI_ROUNDS
    # The regime's amount of training: about its 3000 centralized steps of batch 128.
    seen = c.split_samples * c.local_steps * c.rounds
    assert 0.9 * 3000 * 128 <= seen <= 1.1 * 3000 * 128
    bt = table.cell_config(table.rows[0], table.column("barlow_twins"))
    assert bt.cco_lambda == pytest.approx(2.555)  # Near the regime's CCO lambda of 2.


def test_paper_numbers_are_table_2():
  paper = ldawa_table2.paper().paper
  # CIFAR-10 SimCLR: FedAvg 71.07 (100%), 53.32 (1%), 66.13 (10%) — the paper's column order.
  assert paper[("linear_100", "fedavg", "cifar10_simclr")] == 71.07
  assert paper[("linear_1", "fedavg", "cifar10_simclr")] == 53.32
  assert paper[("linear_10", "fedavg", "cifar10_simclr")] == 66.13
  assert paper[("linear_100", "ldawa_loss", "cifar100_barlow_twins")] == 41.89
  assert paper[("linear_1", "loss", "cifar100_barlow_twins")] == 11.08
  # FedU: 64.55 (100%), 50.95 (1%), 61.96 (10%) on CIFAR-10 Barlow Twins; L-DAWA_FedU on CIFAR-100.
  assert [paper[(e, "fedu", "cifar10_barlow_twins")] for e in ("linear_100", "linear_1",
                                                              "linear_10")] == [64.55, 50.95, 61.96]
  assert [paper[(e, "ldawa_fedu", "cifar100_simclr")] for e in ("linear_100", "linear_1",
                                                               "linear_10")] == [50.59, 21.72, 39.76]
  # EUC: 70.51 (100%), 60.77 (1%), 69.37 (10%) on CIFAR-10 SimCLR; 12.43 (1%) on CIFAR-100 BT.
  assert [paper[(e, "euc", "cifar10_simclr")] for e in ("linear_100", "linear_1",
                                                       "linear_10")] == [70.51, 60.77, 69.37]
  assert paper[("linear_1", "euc", "cifar100_barlow_twins")] == 12.43
  mini = ldawa_table2.mini().paper  # The mini table shows CIFAR-10's numbers.
  assert mini[("linear_100", "ldawa", "barlow_twins")] == 69.31
  assert len(mini) == 3 * 8 * 2


def test_checks_on_hand_made_numbers():
  table = ldawa_table2.mini()
  records = [{"evaluation": "linear_100", "row": row, "column": col, "ours": v}
             for (row, col), v in {("fedavg", "simclr"): 0.70, ("ldawa", "simclr"): 0.72,
                                   ("ldawa_fedavg", "simclr"): 0.69, ("loss", "simclr"): 0.60,
                                   ("ldawa_loss", "simclr"): 0.61, ("fedu", "simclr"): 0.66,
                                   ("ldawa_fedu", "simclr"): 0.66,
                                   ("fedavg", "barlow_twins"): 0.65}.items()]
  lines = table.checks(table, records, gates.passing(records))
  assert lines[0] == ("Fashion-MNIST SimCLR: L-DAWA 72.0 beats FedAvg 70.0 (+2.0 points) — holds")
  assert lines[1].startswith("Fashion-MNIST SimCLR: L-DAWA_FedAvg 69.0 beats FedAvg")
  assert lines[1].endswith("— **fails**")
  assert lines[2].endswith("(+1.0 points) — holds")
  assert lines[3] == ("Fashion-MNIST SimCLR: L-DAWA_FedU 66.0 beats FedU 66.0 (+0.0 points) — "
                      "**fails**")
  assert len(lines) == 4  # Barlow Twins has no L-DAWA result yet.


def mock_cifar10(num_train=400, num_test=100):
  return mock_cifar(10, num_train, num_test, size=paper_smoke.SMOKE_IMAGE_SIZE)


def test_paper_scale_runs_two_rounds(tmp_path):
  """L-DAWA_Loss (the most involved strategy; the rows differ in --aggregator, FedU's rows also in
  their stateful clients, whose paper-scale smoke run is test_fedema_table.py's) on Barlow Twins /
  CIFAR-10: its paper settings, then 2 rounds of 1 local epoch on mock 8 px images with the model
  shrunk (tests/tables/paper_smoke.py)."""
  paper = ldawa_table2.paper().select(["ldawa_loss"], ["cifar10_barlow_twins"])
  c = paper.cell_config(paper.row("ldawa_loss"), paper.column("cifar10_barlow_twins"))
  assert (c.dataset, c.encoder, c.width, c.aggregator, c.local_batch_size, c.projector, c.rounds,
          c.local_steps, c.num_clients) == (
              "cifar10", "resnet18", 1.0, "ldawa_loss", 256, (2048, 2048), 200, 10, 10)
  table = paper_smoke.smoke(paper, local_steps=1)
  out = str(tmp_path / "paper")
  with mock_cifar10(num_train=60, num_test=60):
    result = reproduce.reproduce(table, out, progress=False)
  run = os.path.join(out, "cells", "ldawa_loss", "cifar10_barlow_twins")
  hp = json.load(open(os.path.join(run, "hparams.json")))
  assert (hp["dataset"], hp["encoder"], hp["aggregator"], hp["rounds"]) == (
      "cifar10", "resnet18", "ldawa_loss", 2)
  with open(os.path.join(run, "aggregation.csv")) as f:
    rows = list(csv.DictReader(f))
  assert [r["round"] for r in rows] == ["0", "1"]
  assert all(float(r["clients"]) == 10 for r in rows)
  assert -1 <= float(rows[0]["model_delta"]) <= 1 and 0 < float(rows[0]["max_weight"]) <= 1
  with open(os.path.join(run, "metrics.csv")) as f:
    losses = [float(r["loss"]) for r in csv.DictReader(f)]
  assert len(losses) == 2 and all(x > 0 for x in losses)
  rows = list(csv.DictReader(open(result["table_csv"])))
  ours = [r for r in rows if r["status"] == "ok"]
  assert len(ours) == 3 and all(0 <= float(r["ours"]) <= 100 for r in ours)
  md = open(result["table_md"]).read()
  assert "| SSL method |" in md and "(69.5)" in md  # The paper's L-DAWA_Loss, CIFAR-10 BT, 100%.
  assert table_report.fmt(0.5) == "50.0"


def test_paper_size_model_and_types():
  """The L-DAWA_Loss row at paper size, built and not trained: ResNet-18 with Barlow Twins' 2048 x 2
  projector; each client uploads its update and its mean loss (the softmax weight's input)."""
  table = ldawa_table2.paper()
  config = table.cell_config(table.row("ldawa_loss"), table.column("cifar10_barlow_twins"))
  model, params, process = paper_smoke.paper_model(config, (32, 32, 3))
  assert params == paper_smoke.RESNET18_PARAMS + paper_smoke.head_params(512, (2048, 2048))
  sig = process.run_round.type_signature
  assert str(sig.parameter.weights) == f"float32[{params}]@SERVER"
  assert str(sig.parameter.data) == "{<images=uint8[?,32,32,3],ids=int64[?]>}@CLIENTS"
  assert [tuple(t.shape) for t in sig.result.update.member] == [w.shape for w in
                                                                 model.initial_weights]


def test_a_diverged_dawa_run_names_the_warmup():
  from tff_ssl import runner  # pylint: disable=g-import-not-at-top
  table = ldawa_table2.mini()
  column = table.column("barlow_twins")
  hint = runner._divergence_hint(table.cell_config(table.row("ldawa"), column))  # pylint: disable=protected-access
  assert hint.startswith("ldawa shrinks layers whose cosine to the global model is low: start with "
                         "FedAvg rounds (--fedavg_warmup_rounds=2")
  assert hint.endswith("or lower --server_learning_rate (now 1.0)")
  warm = table.select(["ldawa"]).with_settings({"fedavg_warmup_rounds": 2})
  assert runner._divergence_hint(warm.cell_config(warm.row("ldawa"), column)) == (  # pylint: disable=protected-access
      "lower --server_learning_rate (now 1.0)")
  assert runner._divergence_hint(table.cell_config(table.row("fedavg"), column)) == (  # pylint: disable=protected-access
      "lower --server_learning_rate (now 1.0)")
