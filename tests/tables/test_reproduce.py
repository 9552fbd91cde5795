"""bin/reproduce's machinery on a tiny synthetic table: cells, skipped cells, learning-rate selection
on the validation split, resume, table.md / table.csv / curves.png."""

import csv
import dataclasses
import json
import os

import pytest

from tff_ssl import evaluation, reproduce, tables
from tff_ssl.experiment import ExperimentConfig

EVALS = (
    tables.Evaluation("linear_10", "Linear 10%", evaluation.LinearProbeConfig(0.1, steps=20)),
    tables.Evaluation("finetune_10", "Fine-tune 10%", evaluation.FineTuneConfig(0.1, steps=2,
                                                                               batch_size=32)),
    tables.Evaluation("linear_1", "Linear 1%", evaluation.LinearProbeConfig(0.01, steps=10,
                                                                          batch_size=16)),
)


def tiny_table() -> tables.Table:
  base = ExperimentConfig(method="dcco", dataset="synthetic", encoder="resnet14", width=0.25,
                          stem_stride=2, projector=(16, 16, 16), rounds=3, checkpoint_every=1,
                          log_every=1, seed=0)
  rows = (
      tables.Row("fedavg_cco", "CCO + FedAvg", dataclasses.replace(base, method="fedavg_cco")),
      tables.Row("dcco", "DCCO", base, learning_rates=(1e-3, 1e-2)),
      tables.Row("centralized_cco", "Centralized CCO", dataclasses.replace(
          base, method="centralized_cco", steps=3, batch_size=16)),
      tables.Row("supervised", "Supervised", dataclasses.replace(
          base, method="supervised", batch_size=32, learning_rate=0.01)),
  )
  columns = (tables.Column("noniid_1", "non-IID", 2000, 1, 16, 0.0),
             tables.Column("iid_4", "IID", 500, 4, 4, 1000.0))
  paper = {("linear_10", "dcco", "noniid_1"): 51.7, ("linear_10", "fedavg_cco", "iid_4"): "FAILED",
           ("linear_10", "centralized_cco", ""): 52.6}
  return tables.Table(name="tiny", scale="test", title="Tiny", rows=rows, columns=columns,
                      evaluations=EVALS, paper=paper, curve_every=2, selection_column="iid_4",
                      supervised_epochs=1, validation_fraction=0.1, pilot_fraction=0.5)


def test_cells_and_skips():
  todo, skipped = reproduce.cells(tiny_table())
  assert [c.path for c in todo] == [
      "cells/fedavg_cco/iid_4", "cells/dcco/noniid_1", "cells/dcco/iid_4", "cells/centralized_cco/all",
      "cells/supervised/labels_0.1", "cells/supervised/labels_0.01"]
  assert skipped == {("fedavg_cco", "noniid_1"): tables.WITHIN_CLIENT_NEEDS_TWO}


def test_pilot_holds_out_validation():
  table = tiny_table()
  pilot = table.pilot_config(table.row("dcco"), 1e-2, num_pilot_train=1800)
  assert (pilot.server_learning_rate, pilot.rounds, pilot.validation_fraction) == (1e-2, 2, 0.1)
  assert (pilot.num_clients, pilot.samples_per_client, pilot.clients_per_round) == (450, 4, 4)
  cell = table.cell_config(table.row("dcco"), table.column("noniid_1"), 1e-2)
  assert (cell.validation_fraction, cell.num_clients, cell.eval_every) == (0.0, 2000, 2)


def test_reproduce_tiny_table_end_to_end_and_resume(tmp_path):
  table = tiny_table()
  out = str(tmp_path / "table")
  result = reproduce.reproduce(table, out, progress=False)
  selection = json.load(open(os.path.join(out, "selection.json")))
  assert set(selection) == {"dcco"}
  scores = selection["dcco"]["validation_linear_probe"]
  assert set(scores) == {"0.001", "0.01"}
  assert selection["dcco"]["learning_rate"] == float(max(scores, key=scores.get))
  # The pilots trained on train minus validation and were scored on validation, not test.
  pilot = json.load(open(os.path.join(out, "selection/dcco/lr_0.01/hparams.json")))
  assert pilot["validation_fraction"] == 0.1 and pilot["rounds"] == 2
  cell = json.load(open(os.path.join(out, "cells/dcco/noniid_1/hparams.json")))
  assert cell["server_learning_rate"] == selection["dcco"]["learning_rate"]
  assert cell["validation_fraction"] == 0.0

  rows = list(csv.DictReader(open(os.path.join(out, "table.csv"))))
  by = {(r["evaluation"], r["row"], r["column"]): r for r in rows}
  assert len(rows) == 3 * (2 + 2 + 1 + 1)
  assert by[("linear_10", "fedavg_cco", "noniid_1")]["status"].startswith("not run: within-client")
  for ev in ("linear_10", "finetune_10", "linear_1"):
    for key in (("dcco", "noniid_1"), ("dcco", "iid_4"), ("fedavg_cco", "iid_4"),
                ("centralized_cco", ""), ("supervised", "")):
      assert 0 <= float(by[(ev, *key)]["ours"]) <= 100, (ev, key)
  assert by[("linear_10", "dcco", "noniid_1")]["paper"] == "51.7"
  results = json.load(open(os.path.join(out, "cells/dcco/iid_4/results.json")))
  assert float(by[("linear_10", "dcco", "iid_4")]["ours"]) == pytest.approx(
      100 * results["linear_probe_accuracy_pretrained"], abs=0.01)
  assert set(results["evaluations"]) == {"finetune_10", "linear_1"}
  md = open(os.path.join(out, "table.md")).read()
  assert "| DCCO |" in md and "(51.7)" in md and "—" in md and "validation" in md
  png = open(os.path.join(out, "curves.png"), "rb").read()
  assert png[:8] == b"\x89PNG\r\n\x1a\n"
  # A periodic probe (round 2 of 3) is on the curve, between round 0 (random init) and the end.
  xs, _ = reproduce.curve(os.path.join(out, "cells/dcco/iid_4"), results, 3,
                          json.load(open(os.path.join(out, "random_init.json")))[
                              "linear_probe_accuracy"])
  assert list(xs) == [0, 2, 3]

  # Resume: delete one cell's results (as if interrupted after its last checkpoint); only that
  # cell runs again, and it comes back with the same numbers.
  before = os.path.getmtime(os.path.join(out, "cells/centralized_cco/all/results.json"))
  os.remove(os.path.join(out, "cells/dcco/iid_4/results.json"))
  again = reproduce.reproduce(table, out, progress=False)
  assert os.path.getmtime(os.path.join(out, "cells/centralized_cco/all/results.json")) == before
  assert json.load(open(os.path.join(out, "cells/dcco/iid_4/results.json")))[
      "linear_probe_accuracy_pretrained"] == results["linear_probe_accuracy_pretrained"]
  assert [r["ours"] for r in again["records"]] == [r["ours"] for r in result["records"]]
