"""tff_ssl.reproduce's planning on a small table: cells, skipped cells, pilot runs on the validation
split, curves (the end-to-end run, with resume, is tests/tables/test_paper_scale.py)."""

import dataclasses

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


def test_curve_reads_periodic_probes(tmp_path):
  (tmp_path / "metrics.csv").write_text(
      "round,loss,linear_probe_accuracy\n0,5.0,\n1,4.0,0.5\n2,3.0,\n3,2.5,0.6\n4,2.0,\n")
  xs, ys = reproduce.curve(str(tmp_path), {"linear_probe_accuracy_pretrained": 0.7}, 5, 0.3)
  assert list(xs) == [0, 2, 4, 5] and list(ys) == [0.3, 0.5, 0.6, 0.7]
  # A centralized run's metrics.csv (step, loss, linear_probe_accuracy) reads the same way.
  xs, _ = reproduce.curve(str(tmp_path / "missing"), {"failed": "nan"}, 5, 0.3)
  assert list(xs) == [0]
