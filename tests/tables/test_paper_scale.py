"""The paper-scale DCCO Table 1 constructs and runs: 2 rounds of DCCO and the supervised row on mock
CIFAR-100; the other rows' settings are checked from the table (the FedAvg process runs at paper scale
in test_ldawa_table.py, centralized pretraining is the same code at every scale)."""

import csv
import dataclasses
import json
import os

from tasks import dcco_table1
from tff_ssl import reproduce
from tests.tables.mock_data import mock_cifar


def mock_cifar100(num_train=50_000, num_test=100):
  return mock_cifar(100, num_train, num_test)


def check_hparams(hp, row):
  assert hp["dataset"] == "cifar100" and hp["encoder"] == "resnet14" and hp["stem_stride"] == 1
  if row.supervised:
    assert (hp["optimizer"], hp["learning_rate"], hp["batch_size"]) == ("adam", 0.01, 256)
    return
  assert tuple(hp["projector"]) == ((256, 256, 128) if row.key == "fedavg_simclr" else (1024,) * 3)
  if row.federated:
    # The paper's round: 3,125 clients of 16, 32 per round (global batch 512), client GD at 1.0,
    # server Adam at the first candidate.
    assert (hp["num_clients"], hp["samples_per_client"], hp["clients_per_round"]) == (3125, 16, 32)
    assert (hp["client_optimizer"], hp["client_learning_rate"], hp["local_steps"]) == ("sgd", 1, 1)
    assert (hp["server_optimizer"], hp["server_learning_rate"]) == ("adam", 5e-3)
  else:
    assert (hp["batch_size"], hp["optimizer"], hp["learning_rate"], hp["steps"]) == (
        512, "adam", 5e-3, 2)


def test_paper_scale_settings_of_every_row_and_two_rounds_of_dcco(tmp_path):
  table = dcco_table1.paper().capped(2)
  # One column (32 clients of 16 images per round), at the first candidate learning rate:
  # selection, resume and failures are the same code at every scale (tests/tables/test_reproduce.py).
  table = dataclasses.replace(
      table, rows=tuple(dataclasses.replace(r, learning_rates=r.learning_rates[:1])
                        for r in table.rows),
      columns=(table.column("noniid_16"),))
  column = table.column("noniid_16")
  for key in ("fedavg_cco", "fedavg_simclr", "centralized_cco"):
    row = table.row(key)
    check_hparams(dataclasses.asdict(table.cell_config(row, column if row.federated else None)), row)
  table = table.select(["dcco", "supervised"])
  out = str(tmp_path / "paper")
  with mock_cifar100():
    result = reproduce.reproduce(table, out, progress=False)
  todo, _ = reproduce.cells(table)
  assert [c.path for c in todo] == [
      "cells/dcco/noniid_16", "cells/supervised/labels_0.1", "cells/supervised/labels_0.01"]
  for cell in todo:
    hp = json.load(open(os.path.join(out, cell.path, "hparams.json")))
    check_hparams(hp, cell.row)
    if cell.row.federated:  # 2 rounds were run.
      with open(os.path.join(out, cell.path, "metrics.csv")) as f:
        assert [line.split(",")[0] for line in f.read().split()[1:]] == ["0", "1"]
  assert not os.path.exists(os.path.join(out, "selection"))  # One candidate: no pilots.
  rows = list(csv.DictReader(open(result["table_csv"])))
  ours = [r for r in rows if r["status"] == "ok"]
  # Three evaluations (linear 10%, fine-tuning 10%, linear 1%) of the two rows.
  assert len(ours) == 3 * 2 and all(0 <= float(r["ours"]) <= 100 for r in ours)
  assert {r["evaluation"] for r in ours} == {"linear_10", "finetune_10", "linear_1"}
  md = open(result["table_md"]).read()
  assert "smoke" in md and "| DCCO | **" in md and "(45.9)" in md
  assert open(result["curves_png"], "rb").read(4) == b"\x89PNG"
