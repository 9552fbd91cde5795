"""FedEMA's Table 3 as data: the grid is the paper's setting (Sec. 5), the checks are its orderings, and
the paper scale runs 2 rounds of every row on mock CIFAR-10 with the model shrunk, and its paper-size
model and round types are built (tests/tables/paper_smoke.py)."""

import csv
import json
import os

import pytest

import tasks
from tasks import fedema_table3
from tests.tables import gates
from tff_ssl import reproduce, table_report
from tff_ssl.tables import TUNED_GATE
from tests.tables import paper_smoke
from tests.tables.mock_data import mock_cifar


@pytest.mark.parametrize("scale", ["mini", "paper"])
def test_grid_is_the_papers(scale):
  table = tasks.get_table("fedema_table3", scale)
  assert [r.key for r in table.rows] == ["fedsimclr", "fedmoco", "fedsimsiam", "fedbyol", "fedu",
                                         "fedema_lambda", "fedema_tau"]
  # The main probe: tuned, 10% of the labels, at the two label seeds the gate reads; then the LARS
  # probe and the authors' kNN monitor on every label.
  assert [type(e.protocol).__name__ for e in table.evaluations] == [
      "TunedLinearProbeConfig", "TunedLinearProbeConfig", "LinearProbeConfig", "KNNConfig"]
  assert [(e.protocol.label_fraction, e.protocol.seed) for e in table.evaluations[:2]] == [
      (0.1, 0), (0.1, 1)]
  assert table.gate_evaluations == ("tuned_10_s0", "tuned_10_s1")
  knn = table.evaluations[3].protocol
  assert (knn.k, knn.temperature, knn.label_fraction) == (200, 0.1, 1.0)
  todo, skipped = reproduce.cells(table)
  assert not skipped and len(todo) == 7 * len(table.columns)
  methods = {"fedsimclr": ("fedavg", "simclr"), "fedmoco": ("fedmoco", "moco"),
             "fedsimsiam": ("fedavg", "simsiam"),
             "fedbyol": ("fedbyol", "byol"), "fedu": ("fedu", "byol"),
             "fedema_lambda": ("fedema", "byol"), "fedema_tau": ("fedema", "byol")}
  for cell in todo:
    c = table.cell_config(cell.row, cell.column)
    assert (c.method, c.ssl) == methods[cell.row.key]
    # K = 5 clients, all in every round, each holding a few classes; client SGD 0.032.
    assert (c.num_clients, c.clients_per_round, c.partition) == (5, 5, "classes")
    assert (c.client_learning_rate, c.target_decay) == (0.032, 0.99)
    assert (c.server_optimizer, c.server_learning_rate, c.server_lr_schedule) == (
        "sgd", 1.0, "constant")
    assert c.encoder == ("resnet18" if scale == "paper" else "resnet14")
    assert c.eval_label_fraction == 1.0  # The runs' own LARS probe (curves): every label.
    if scale == "mini":  # The mini regime (issue 31).
      assert (c.dataset, c.head_norm, c.pool_grid, c.stem_stride, c.crop_min_scale) == (
          "fashion_mnist_shifted", "batch", 2, 2, 0.5)
      assert (c.client_weight_decay, c.samples_per_client, c.local_batch_size) == (5e-4, 2000, 64)
      if c.method == "fedmoco":
        assert c.moco_queue <= c.samples_per_client  # Sized to a client's data.
  lam = table.cell_config(table.row("fedema_lambda"), table.columns[0])
  tau = table.cell_config(table.row("fedema_tau"), table.columns[0])
  # The paper's lambda; the mini regime's from the divergence measured at its model's size.
  assert (lam.fedema_lambda, tau.fedema_lambda, tau.fedema_tau) == (
      0.8 if scale == "paper" else fedema_table3.MINI_FEDEMA_LAMBDA, 0.0, 0.7)
  if scale == "paper":
    c10 = table.cell_config(table.rows[0], table.column("cifar10"))
    c100 = table.cell_config(table.rows[0], table.column("cifar100"))
    assert (c10.dataset, c10.classes_per_client, c100.dataset, c100.classes_per_client) == (
        "cifar10", 2, "cifar100", 20)
    assert (c10.rounds, c10.local_steps, c10.local_batch_size, c10.samples_per_client,
            c10.width) == (100, 5, 128, 10000, 1.0)
  else:
    c = table.cell_config(table.rows[0], table.columns[0])
    assert (c.dataset, c.classes_per_client, c.rounds) == (
        "fashion_mnist_shifted", 2, fedema_table3.MINI_ROUNDS)


def test_claims_are_the_papers_at_each_label_seed():
  """FedEMA above every other row, FedU at least FedBYOL, FedBYOL above the contrastive rows,
  FedSimSiam below the rest: each with its source, at both label seeds; a missing number makes its
  claims untested, never silent."""
  table = fedema_table3.mini()
  pairs = {(c.better, c.base, c.relation) for c in table.claims}
  assert {("fedbyol", "fedsimclr", "above"), ("fedbyol", "fedmoco", "above"),
          ("fedu", "fedbyol", "at_least")} <= pairs
  assert {(ema, other, "above") for ema in ("fedema_tau", "fedema_lambda")
          for other in ("fedu", "fedbyol", "fedsimclr", "fedmoco", "fedsimsiam")} <= pairs
  assert {(other, "fedsimsiam", "above") for other in ("fedsimclr", "fedmoco", "fedbyol",
                                                       "fedu")} <= pairs
  assert all(c.source for c in table.claims)
  ours = {"fedsimclr": (0.75, 0.75), "fedmoco": (0.76, 0.76), "fedsimsiam": (0.60, 0.61),
          "fedbyol": (0.70, 0.70), "fedu": (0.72, 0.69), "fedema_lambda": (0.71, 0.70),
          "fedema_tau": (0.77, 0.77)}
  records = [{"evaluation": k, "row": r, "column": "fashion_mnist", "ours": v[i], "status": "ok"}
             for r, v in ours.items() for i, k in enumerate(TUNED_GATE)]
  lines = table_report.claim_lines(
      table, records, gates.passing(records, but=[("fedsimsiam", "fashion_mnist")]))
  group = "Fashion-MNIST (shifted) 2 of 10 classes"
  assert len(lines) == len(table.claims)
  assert (f"[1] {group}: FedEMA (τ = 0.7) 77.0 / 77.0 is above FedU 72.0 / 69.0 (+5.0 / +8.0 "
          "points) — holds") in lines
  assert (f"[6] {group}: FedEMA (constant λ) 71.0 / 70.0 is above FedU 72.0 / 69.0 (-1.0 / +1.0 "
          "points) — **fails** at tuned_10_s0 (holds at tuned_10_s1)") in lines
  assert (f"[11] {group}: FedU 72.0 / 69.0 is at least FedBYOL 70.0 / 70.0 (+2.0 / -1.0 points) — "
          "**fails** at tuned_10_s1 (holds at tuned_10_s0)") in lines
  assert (f"[12] {group}: FedBYOL 70.0 / 70.0 is above FedSimCLR 75.0 / 75.0 (-5.0 / -5.0 "
          "points) — **fails**") in lines
  assert (f"[16] {group}: FedBYOL 70.0 / 70.0 is above FedSimSiam 60.0 / 61.0 (+10.0 / +9.0 "
          "points) — untested: below the baselines (fedsimsiam: over raw pixels +5.0, +0.5, over "
          "random init +20.0, +20.0 points)") in lines
  # A seed missing from a row: its claims say so.
  lines = table_report.claim_lines(table, records[:-1], gates.passing(records))
  assert (f"[1] {group}: FedEMA (τ = 0.7) is above FedU — untested: FedEMA (τ = 0.7), {group} not "
          "run yet") in lines


def test_paper_rows_run_two_rounds_and_write_their_cells(tmp_path):
  """Each row's paper settings; then the rows no other smoke runs through `reproduce` for 2 rounds
  of one local epoch, 2 clients of 8 mock images, the model shrunk (tests/tables/paper_smoke.py), in one table."""
  paper = fedema_table3.paper().select(columns=["cifar10"])
  for row in paper.rows:
    c = paper.cell_config(row, paper.column("cifar10"))
    assert (c.dataset, c.encoder, c.width, c.projector, c.rounds, c.local_steps,
            c.local_batch_size, c.num_clients, c.clients_per_round) == (
                "cifar10", "resnet18", 1.0, (4096, 256), 100, 5, 128, 5, 5)
  # Two rounds of the rows whose code no other paper smoke runs: FedBYOL and FedU run (with FedFoA)
  # in tests/tables/test_fedfoa_table.py's smoke, and FedSimCLR is FedAvg + SimCLR, every mini
  # table's; each with other numbers, and every method in tests/methods/test_contract.py.
  paper = paper.select(["fedmoco", "fedsimsiam", "fedema_lambda", "fedema_tau"], columns=["cifar10"])
  table = paper_smoke.smoke(paper, local_steps=1, samples_per_client=8, local_batch_size=8,
                            num_clients=2, clients_per_round=2)
  out = str(tmp_path / "paper")
  with mock_cifar(10, 60, 40, size=paper_smoke.SMOKE_IMAGE_SIZE):
    result = reproduce.reproduce(table, out, progress=False)
  for row in table.rows:
    run = os.path.join(out, "cells", row.key, "cifar10")
    hp = json.load(open(os.path.join(run, "hparams.json")))
    assert (hp["dataset"], hp["encoder"], hp["rounds"]) == (
        "cifar10", paper_smoke.SHALLOW["resnet18"], 2)
    assert hp["method"] == row.config.method and hp["ssl"] == row.config.ssl
    with open(os.path.join(run, "metrics.csv")) as f:
      losses = [float(r["loss"]) for r in csv.DictReader(f)]
    assert len(losses) == 2 and all(x == x for x in losses)  # Not NaN.
    assert os.path.isdir(os.path.join(run, "client_states")) == (row.config.method != "fedavg")
  rows = list(csv.DictReader(open(result["table_csv"])))
  ours = [r for r in rows if r["status"] == "ok"]
  assert len(ours) == len(table.evaluations) * len(table.rows) and all(0 <= float(r["ours"]) <= 100 for r in ours)
  md = open(result["table_md"]).read()
  assert "kNN monitor" in md and md.count("| *Raw pixels* |") == len(table.evaluations)


def test_paper_size_model_and_types():
  """FedEMA's row at paper size, built and not trained: ResNet-18 with BYOL's 4096 -> 256 heads, and
  the round's TFF types (each client's online and target networks in its state)."""
  table = fedema_table3.paper()
  config = table.cell_config(table.row("fedema_tau"), table.column("cifar10"))
  model, params, process = paper_smoke.paper_model(config, (32, 32, 3))
  assert params == (paper_smoke.RESNET18_PARAMS + paper_smoke.head_params(512, (4096, 256))
                    + paper_smoke.head_params(256, (4096, 256)))
  sig = process.run_round.type_signature.parameter
  assert str(sig.weights) == f"float32[{params}]@SERVER"
  assert str(sig.data) == "{<images=uint8[?,32,32,3],ids=int64[?]>}@CLIENTS"
  state = sig.states.member
  for network in ("online", "target"):
    assert [tuple(t.shape) for t in state[network]] == [w.shape for w in model.initial_weights]
