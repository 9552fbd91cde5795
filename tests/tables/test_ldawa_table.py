"""L-DAWA's Table 2 as data: the grid is the paper's (Sec. 4.2), and the paper scale's L-DAWA_Loss row
runs on mock CIFAR-10 (2 rounds, local epochs capped, the model shrunk) and is built at paper size
(tests/tables/paper_smoke.py)."""

import csv
import json
import os

import numpy as np
import pytest

import tasks
from tasks import ldawa_table2
from tests.tables import gates
from tff_ssl import reproduce, table_report
from tests.tables import paper_smoke
from tests.tables.mock_data import mock_cifar


@pytest.mark.parametrize("scale", ["mini", "paper", "collapse"])
def test_grid_is_the_papers(scale):
  table = (tasks.get_table("ldawa_collapse", "mini") if scale == "collapse"
           else tasks.get_table("ldawa_table2", scale))
  paper_rows = ["fedavg", "loss", "fedu", "euc", "ldawa", "ldawa_fedavg", "ldawa_loss", "ldawa_fedu"]
  extra = [] if scale == "paper" else ["ldawa_warmup", "fedavg_s1", "ldawa_s1", "ldawa_fedavg_s1"]
  if scale == "collapse":  # The control run: plain convolutions.
    extra += ["fedavg_nows", "ldawa_nows"]
  assert [r.key for r in table.rows] == paper_rows + extra
  fractions = [e.label_fraction for e in table.evaluations]
  assert fractions == ([1.0, 0.1, 0.01] if scale == "paper" else [0.1, 0.1, 1.0, 0.1, 0.01])
  todo, skipped = reproduce.cells(table)
  assert not skipped and len(todo) == len(table.rows) * len(table.columns)
  aggregators = {"fedu": "fedavg", "ldawa_fedu": "ldawa_fedavg", "euc": "fedavg",
                 "ldawa_warmup": "ldawa", "fedavg_s1": "fedavg", "ldawa_s1": "ldawa",
                 "ldawa_fedavg_s1": "ldawa_fedavg", "fedavg_nows": "fedavg", "ldawa_nows": "ldawa"}
  method = {"fedu": "fedu", "ldawa_fedu": "fedu", "euc": "fedlama"}
  for cell in todo:
    c = table.cell_config(cell.row, cell.column)
    assert c.aggregator == aggregators.get(cell.row.key, cell.row.key)
    assert (c.method, c.ssl) == (method.get(cell.row.key, "fedavg"),
                                 "simclr" if cell.column.key.endswith("simclr") else "cco")
    # Cross-silo: all clients in every round, Dirichlet 0.1 over labels with unequal sizes.
    assert (c.num_clients, c.clients_per_round, c.partition, c.alpha) == (
        (10, 10) if scale == "paper" else (5, 5)) + ("dirichlet_split", 0.1)
    # Client SGD lr 0.03, momentum 0.9, weight decay 1e-4; the server takes the aggregate as is.
    assert (c.client_optimizer, c.client_learning_rate, c.client_weight_decay) == (
        "sgdm", 0.03, 1e-4)
    assert (c.server_optimizer, c.server_learning_rate, c.server_lr_schedule) == (
        "sgd", 1.0, "constant")
    assert c.eval_label_fraction == 1.0
    # Paper: ResNet-18; mini: the mini regime's ResNet-14 with grid pooling and milder crops.
    assert (c.encoder, c.pool_grid, c.crop_min_scale) == (
        ("resnet18", 1, 0.08) if scale == "paper" else ("resnet14", 2, 0.5))
    assert c.seed == (1 if cell.row.key.endswith("_s1") else 0)
    assert c.fedavg_warmup_rounds == (2 if cell.row.key == "ldawa_warmup" else 0)
    assert c.weight_standardization == (not cell.row.key.endswith("_nows"))
    if c.ssl == "cco":  # Barlow Twins' lambda 5e-3 in CCO's lambda / (d - 1) form.
      assert c.cco_lambda == pytest.approx(5e-3 * (c.projector[-1] - 1))
    if scale != "paper":  # Every cell records its kernel norms, and its divergence.
      assert c.measure_weight_norms and c.head_norm == "batch"
      assert c.measure_divergence == (c.aggregator in ("fedavg", "loss") and c.method != "fedlama")
      # The paper's order of local work: >= 150 steps a client a round, whatever its size.
      assert (c.local_unit, c.local_batch_size) == ("steps", 64)
  if scale == "paper":
    assert {c.key for c in table.columns} == {"cifar10_simclr", "cifar10_barlow_twins",
                                               "cifar100_simclr", "cifar100_barlow_twins"}
    c = table.cell_config(table.rows[0], table.column("cifar100_simclr"))
    assert (c.dataset, c.rounds, c.local_steps, c.local_batch_size, c.width, c.split_samples,
            c.local_unit) == ("cifar100", 200, 10, 256, 1.0, 0, "epochs")
  elif scale == "mini":
    assert [c.key for c in table.columns] == ["simclr", "barlow_twins"]
    c = table.cell_config(table.rows[0], table.columns[0])
    assert c.dataset == "fashion_mnist_shifted" and c.rounds == ldawa_table2.MINI_SIMCLR_ROUNDS == 3
    assert table.gate_keys == ("tuned_10_s0", "tuned_10_s1")
    assert (c.projector, c.temperature) == ((128, 128, 64), 0.1)  # The gate's SimCLR heads.
    assert c.local_steps == 300  # SimCLR's clients drift less per step (docs/results.md).
    # Barlow Twins as in the authors' code: the ResNet's 128-d output, lambda_BT 5e-3.
    bt = table.cell_config(table.rows[0], table.column("barlow_twins"))
    assert (bt.projector, bt.cco_lambda, bt.local_steps, bt.rounds) == (
        (128,), pytest.approx(0.635), 150, 4)
  else:  # The former mini column, as its committed run (docs/table_runs/ldawa_collapse_mini).
    assert [c.key for c in table.columns] == ["barlow_twins"] and table.name == "ldawa_collapse"
    bt = table.cell_config(table.rows[0], table.column("barlow_twins"))
    assert (bt.projector, bt.cco_lambda, bt.local_steps, bt.rounds) == (
        (512, 512, 512), pytest.approx(2.555), 150, 5)


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


def test_claims_on_hand_made_numbers():
  """The paper scale's claims read its one probe: L-DAWA above each baseline (FedAvg, Loss, FedU,
  EUC), each L-DAWA_X above X; a column without numbers yet says so."""
  table = ldawa_table2.paper()
  assert {(c.better, c.base) for c in table.claims} == {
      ("ldawa", "fedavg"), ("ldawa", "loss"), ("ldawa", "fedu"), ("ldawa", "euc"),
      ("ldawa_fedavg", "fedavg"), ("ldawa_loss", "loss"), ("ldawa_fedu", "fedu")}
  records = [{"evaluation": "linear_100", "row": row, "column": col, "ours": v, "status": "ok"}
             for (row, col), v in {("fedavg", "cifar10_simclr"): 0.70,
                                   ("ldawa", "cifar10_simclr"): 0.72,
                                   ("ldawa_fedavg", "cifar10_simclr"): 0.69,
                                   ("loss", "cifar10_simclr"): 0.74,
                                   ("ldawa_loss", "cifar10_simclr"): 0.75,
                                   ("fedu", "cifar10_simclr"): 0.66,
                                   ("euc", "cifar10_simclr"): 0.60,
                                   ("ldawa_fedu", "cifar10_simclr"): 0.66,
                                   ("fedavg", "cifar10_barlow_twins"): 0.65}.items()]
  gate = table_report.Gate(("linear_100",), {(r["row"], r["column"]): {"linear_100": (0.05, 0.2)}
                                              for r in records})
  lines = table_report.claim_lines(table, records, gate)
  simclr = [l for l in lines if "CIFAR-10 SimCLR:" in l]
  assert simclr == [
      "[1] CIFAR-10 SimCLR: L-DAWA 72.0 is above FedAvg 70.0 (+2.0 points) — holds",
      "[2] CIFAR-10 SimCLR: L-DAWA 72.0 is above Loss 74.0 (-2.0 points) — **fails**",
      "[3] CIFAR-10 SimCLR: L-DAWA 72.0 is above FedU 66.0 (+6.0 points) — holds",
      "[4] CIFAR-10 SimCLR: L-DAWA 72.0 is above EUC (FedLAMA) 60.0 (+12.0 points) — holds",
      "[5] CIFAR-10 SimCLR: L-DAWA_FedAvg 69.0 is above FedAvg 70.0 (-1.0 points) — **fails**",
      "[6] CIFAR-10 SimCLR: L-DAWA_Loss 75.0 is above Loss 74.0 (+1.0 points) — holds",
      "[7] CIFAR-10 SimCLR: L-DAWA_FedU 66.0 is above FedU 66.0 (+0.0 points) — **fails**"]
  assert ("[1] CIFAR-10 Barlow Twins: L-DAWA is above FedAvg — untested: L-DAWA, CIFAR-10 Barlow "
          "Twins not run yet") in lines
  assert len(lines) == 7 * len(table.columns)  # Every claim in every column: none vanishes.


def test_mini_claims_read_both_label_seeds_and_name_a_failed_run():
  table = ldawa_table2.mini()
  assert {("ldawa_s1", "fedavg_s1"), ("ldawa_fedavg_s1", "fedavg_s1"),
          ("ldawa_warmup", "fedavg")} <= {(c.better, c.base) for c in table.claims}
  values = {("fedavg", "simclr"): (0.80, 0.81), ("ldawa", "simclr"): (0.82, 0.80),
            ("fedavg_s1", "simclr"): (0.79, 0.79), ("ldawa_s1", "simclr"): (0.80, 0.81),
            ("fedavg", "barlow_twins"): (0.75, 0.76)}
  records = [{"evaluation": e, "row": row, "column": col, "ours": v[i], "status": "ok"}
             for (row, col), v in values.items()
             for i, e in enumerate(("tuned_10_s0", "tuned_10_s1"))]
  records += [{"evaluation": e, "row": "ldawa", "column": "barlow_twins", "ours": None,
               "status": "FAILED: round 3: loss became nan; lower --server_learning_rate"}
              for e in ("tuned_10_s0", "tuned_10_s1")]
  lines = table_report.claim_lines(table, records, gates.passing(records))
  assert ("[1] Fashion-MNIST (shifted) SimCLR: L-DAWA 82.0 / 80.0 is above FedAvg 80.0 / 81.0 "
          "(+2.0 / -1.0 points) — **fails** at tuned_10_s1 (holds at tuned_10_s0)") in lines
  assert ("[8] Fashion-MNIST (shifted) SimCLR: L-DAWA, seed 1 80.0 / 81.0 is above FedAvg, seed 1 "
          "79.0 / 79.0 (+1.0 / +2.0 points) — holds") in lines
  assert ("[1] Fashion-MNIST (shifted) Barlow Twins: L-DAWA is above FedAvg — untested: L-DAWA, "
          "Fashion-MNIST (shifted) Barlow Twins failed (round 3: loss became nan)") in lines


def test_divergence_appendix_reads_each_cells_aggregation_csv(tmp_path):
  """The mean delta over the layers L-DAWA scales (not GroupNorm's or the heads' batch statistics),
  the whole-model cosine and the kernel norms, per round; a warm-up round scales nothing."""
  table = ldawa_table2.mini().select(["fedavg", "ldawa_warmup"], ["simclr"])
  run = tmp_path / "cells" / "ldawa_warmup" / "simclr"
  run.mkdir(parents=True)
  (run / "aggregation.csv").write_text(
      "round,clients,fedavg_warmup,model_delta,layer_delta/encoder/stem_conv,"
      "layer_delta/encoder/stem_gn,layer_delta/projector/projector_bn1,"
      "layer_delta/projector/projector_dense1,kernel_norm_conv,kernel_norm_dense\n"
      "0,5.0,1.0,0.9,0.5,1.0,1.0,0.7,1.1,1.2\n"
      "1,5.0,0.0,0.8,0.6,1.0,1.0,0.8,0.95,0.9\n")
  fedavg = tmp_path / "cells" / "fedavg" / "simclr"
  fedavg.mkdir(parents=True)
  (fedavg / "aggregation.csv").write_text("round,clients,max_weight,model_delta,kernel_norm_conv\n"
                                          "0,5.0,0.3,0.91,1.25\n")
  series = ldawa_table2.round_series(str(run / "aggregation.csv"))
  assert np.isnan(series["layer_delta"][0]) and series["layer_delta"][1] == pytest.approx(0.7)
  assert series["model_delta"] == [0.9, 0.8] and series["kernel_norm_dense"] == [1.2, 0.9]
  md = ldawa_table2.divergence_appendix(table, str(tmp_path))
  assert "| FedAvg | - | 0.91 | 1.25 | - |" in md
  assert "| L-DAWA, FedAvg warm-up (authors' code) | - 0.70 | 0.90 0.80 | 1.10 0.95 | 1.20 0.90 |" in md


def mock_cifar10(num_train=400, num_test=100):
  return mock_cifar(10, num_train, num_test, size=paper_smoke.SMOKE_IMAGE_SIZE)


def test_paper_scale_runs_two_rounds(tmp_path):
  """L-DAWA_Loss (the most involved strategy; the rows differ in --aggregator, FedU's rows also in
  their stateful clients, whose paper-scale smoke run is test_fedfoa_table.py's) on Barlow Twins /
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
      "cifar10", paper_smoke.SHALLOW["resnet18"], "ldawa_loss", 2)
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


def test_the_control_runs_plain_convolutions_are_gated_against_their_own_initialization():
  """`reproduce.encoder_baselines` gives a cell whose encoder is not the table's its own random-init
  baseline: the plain-convolution rows are another architecture; the second seed's are not."""
  table = ldawa_table2.collapse()
  key = lambda row: reproduce.encoder_key(  # noqa: E731
      table.cell_config(table.row(row), table.column("barlow_twins")))
  assert key("fedavg_nows") == key("ldawa_nows") == key("fedavg") + " weight_standardization=False"
  assert key("fedavg_s1") == key("ldawa_warmup") == key("fedavg")
