"""The paper-scale DCCO Table 1 constructs and runs: 2 rounds of every row on mock CIFAR-100."""

import csv
import dataclasses
import json
import os

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from tasks import dcco_table1
from tff_ssl import reproduce


def mock_cifar100(num_train=50_000, num_test=100):
  """tfds' mock of `cifar100`: random 32x32x3 images, labels cycling over the 100 classes."""
  def as_dataset(self, split, **kwargs):  # pylint: disable=unused-argument
    n = num_train if str(split).startswith("train") else num_test
    rng = np.random.default_rng(0 if n == num_train else 1)
    return tf.data.Dataset.from_tensor_slices({
        "image": rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
        "label": (np.arange(n) % 100).astype(np.int64)})
  return tfds.testing.mock_data(as_dataset_fn=as_dataset)


def test_paper_scale_runs_two_rounds_of_every_row(tmp_path):
  table = dcco_table1.paper().capped(2)
  # Two columns keep the test short: 512 one-image clients per round (DCCO only) and 32 clients of 16.
  # Learning-rate selection runs for DCCO (two 1-round pilots), centralized CCO takes its choice; the
  # FedAvg rows take the first candidate.
  rows = tuple(r if r.key in ("dcco", "centralized_cco") else
               dataclasses.replace(r, learning_rates=r.learning_rates[:1]) for r in table.rows)
  table = dataclasses.replace(table, rows=rows, columns=tuple(
      c for c in table.columns if c.key in ("noniid_1", "noniid_16")))
  out = str(tmp_path / "paper")
  with mock_cifar100():
    result = reproduce.reproduce(table, out, progress=False)
  todo, _ = reproduce.cells(table)
  assert [c.path for c in todo] == [
      "cells/fedavg_cco/noniid_16", "cells/fedavg_simclr/noniid_16", "cells/dcco/noniid_1",
      "cells/dcco/noniid_16", "cells/centralized_cco/all", "cells/supervised/labels_0.1",
      "cells/supervised/labels_0.01"]
  for cell in todo:
    hp = json.load(open(os.path.join(out, cell.path, "hparams.json")))
    assert hp["dataset"] == "cifar100" and hp["encoder"] == "resnet14" and hp["stem_stride"] == 1
    if cell.row.federated:
      # The paper's round: global batch 512, ResNet-14, its projector; 2 rounds were run.
      assert hp["samples_per_client"] * hp["clients_per_round"] == 512
      assert hp["projector"] == ([256, 256, 128] if cell.row.key == "fedavg_simclr" else [1024] * 3)
      with open(os.path.join(out, cell.path, "metrics.csv")) as f:
        assert [line.split(",")[0] for line in f.read().split()[1:]] == ["0", "1"]
  selection = json.load(open(os.path.join(out, "selection.json")))
  scores = selection["dcco"]["validation_linear_probe"]
  assert set(scores) == {"0.005", "0.001"}
  # The best validation score wins; ties go to the first candidate listed (5e-3).
  best = max(table.row("dcco").learning_rates, key=lambda lr: scores[f"{lr:g}"])
  assert selection["dcco"]["learning_rate"] == best
  # Centralized CCO takes DCCO's choice rather than running pilots of its own.
  assert selection["centralized_cco"]["learning_rate"] == best
  assert selection["centralized_cco"]["selected_with"] == "dcco"
  assert not os.path.exists(os.path.join(out, "selection", "centralized_cco"))
  # Pilots train on train minus the validation split and are scored on it (never on test).
  pilot = json.load(open(os.path.join(out, "selection/dcco/lr_0.001/hparams.json")))
  assert (pilot["validation_fraction"], pilot["rounds"], pilot["samples_per_client"]) == (0.1, 1, 16)
  cell = json.load(open(os.path.join(out, "cells/dcco/noniid_1/hparams.json")))
  assert (cell["validation_fraction"], cell["server_learning_rate"]) == (
      0.0, selection["dcco"]["learning_rate"])
  rows = list(csv.DictReader(open(result["table_csv"])))
  ours = [r for r in rows if r["status"] == "ok"]
  assert len(ours) == 3 * 7 and all(0 <= float(r["ours"]) <= 100 for r in ours)
  skipped = [r for r in rows if r["status"].startswith("not run: within-client")]
  assert {(r["row"], r["column"]) for r in skipped} == {("fedavg_cco", "noniid_1"),
                                                         ("fedavg_simclr", "noniid_1")}
  md = open(result["table_md"]).read()
  assert "smoke" in md and "| DCCO | **" in md and "(51.7)" in md
  assert open(result["curves_png"], "rb").read(4) == b"\x89PNG"

  # Resume: finished cells are skipped; a cell whose results are gone runs again, to the same numbers.
  mtimes = {c.path: os.path.getmtime(os.path.join(out, c.path, "results.json")) for c in todo}
  redo = "cells/supervised/labels_0.01"
  os.remove(os.path.join(out, redo, "results.json"))
  with mock_cifar100():
    again = reproduce.reproduce(table, out, progress=False)
  for path, mtime in mtimes.items():
    if path != redo:
      assert os.path.getmtime(os.path.join(out, path, "results.json")) == mtime, path
  assert [r["ours"] for r in again["records"]] == [r["ours"] for r in result["records"]]
