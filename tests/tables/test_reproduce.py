"""tff_ssl.reproduce on a tiny synthetic table: planning, learning-rate selection on the validation
split, resume, diverged runs, changed settings (the paper-scale grid runs in test_paper_scale.py)."""

import csv
import dataclasses
import json
import os
import shutil
import time
import types

import pytest

from tff_ssl import evaluation, experiment, reproduce, table_plot, table_report, tables
from tff_ssl.experiment import ExperimentConfig

EVALS = (
    tables.Evaluation("linear_10", "Linear 10%", evaluation.LinearProbeConfig(0.1, steps=20)),
    tables.Evaluation("finetune_10", "Fine-tune 10%", evaluation.FineTuneConfig(0.1, steps=2,
                                                                               batch_size=32)),
    tables.Evaluation("linear_1", "Linear 1%", evaluation.LinearProbeConfig(0.01, steps=10,
                                                                          batch_size=16)),
)


def tiny_table() -> tables.Table:
  base = ExperimentConfig(method="dcco", dataset="synthetic", encoder="resnet8", width=0.25,
                          stem_stride=2, projector=(16, 16, 16), rounds=3, checkpoint_every=1,
                          log_every=1, seed=0)
  rows = (
      tables.Row("fedavg_cco", "CCO + FedAvg", dataclasses.replace(base, method="fedavg", ssl="cco")),
      tables.Row("dcco", "DCCO", base, learning_rates=(1e-3, 1e-2)),
      tables.Row("centralized_cco", "Centralized CCO", dataclasses.replace(
          base, method="centralized", ssl="cco", steps=3, batch_size=16), learning_rates=(1e-3, 1e-2),
                 select_with="dcco"),
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


def test_end_to_end_selection_resume_and_failures(tmp_path, monkeypatch):
  # One column, no supervised row, no periodic probes: a short run through every part of the runner.
  table = tiny_table()
  table = dataclasses.replace(table, rows=table.rows[:3], columns=table.columns[1:], curve_every=100)
  out = str(tmp_path / "tiny")
  real_run = experiment.run

  def run(config, output_dir, **kwargs):  # The fedavg cell diverges: the paper's FAILED.
    if output_dir.endswith(os.path.join("fedavg_cco", "iid_4")):
      raise FloatingPointError("round 1: loss became nan")
    return real_run(config, output_dir, **kwargs)

  monkeypatch.setattr(experiment, "run", run)
  # Two candidates: the best is always at an edge. The pilots beyond it have their own test
  # (tests/tables/test_tables.py); here the grid alone.
  monkeypatch.setattr(reproduce, "MAX_BEYOND_EDGE", 0)
  result = reproduce.reproduce(table, out, progress=False)

  # Pilots: DCCO's two candidates on train minus the validation split, scored on it; centralized CCO
  # takes DCCO's choice without pilots of its own.
  selection = json.load(open(os.path.join(out, "selection.json")))
  scores = selection["dcco"]["validation_linear_probe"]
  assert set(scores) == {"0.001", "0.01"} and all(0 <= v <= 1 for v in scores.values())
  best = max((1e-3, 1e-2), key=lambda lr: scores[f"{lr:g}"])  # Ties: the first listed.
  assert selection["dcco"]["learning_rate"] == best
  assert selection["centralized_cco"] == {**selection["dcco"], "field": "learning_rate",
                                          "selected_with": "dcco"}
  assert sorted(os.listdir(os.path.join(out, "selection"))) == ["dcco"]
  pilot = json.load(open(os.path.join(out, "selection", "dcco", "lr_0.01", "hparams.json")))
  assert (pilot["validation_fraction"], pilot["rounds"], pilot["num_clients"]) == (0.1, 2, 450)
  for path, field in (("cells/dcco/iid_4", "server_learning_rate"),
                      ("cells/centralized_cco/all", "learning_rate")):
    hp = json.load(open(os.path.join(out, path, "hparams.json")))
    assert (hp[field], hp["validation_fraction"]) == (best, 0.0)

  rows = {(r["evaluation"], r["row"], r["column"]): r for r in csv.DictReader(open(result["table_csv"]))}
  assert rows[("linear_10", "fedavg_cco", "iid_4")]["status"] == "FAILED: round 1: loss became nan"
  ok = [r for r in rows.values() if r["status"] == "ok"]
  assert len(ok) == 3 * 2 and all(0 <= float(r["ours"]) <= 100 for r in ok)
  md = open(result["table_md"]).read()
  assert "| CCO + FedAvg | **failed** (FAILED) |" in md and "DCCO's choice" in md
  # Baselines under each frozen-feature protocol (not fine-tuning): raw pixels and random init.
  base = json.load(open(os.path.join(out, "random_init.json")))
  assert sorted(base["baselines"]) == ["linear_1", "linear_10"]
  assert all(0 <= v <= 1 for b in base["baselines"].values() for v in b.values())
  # ... shown as rows under each frozen-feature evaluation's methods, and in table.csv.
  for key, name in table_report.BASELINE_ROWS:
    assert md.count(f"| *{name}* |") == 2
    for e in ("linear_1", "linear_10"):
      assert float(rows[(e, key, "")]["ours"]) == pytest.approx(100 * base["baselines"][e][key],
                                                                abs=0.005)
  assert (f"| *Raw pixels* | {table_report.fmt(base['baselines']['linear_10']['raw_pixels'])} |"
          in md)
  assert md.count("Pretrained cells above the raw-pixel row:") == 2
  # The centralized row's margin over raw pixels, in points (the mini regime's bar: +3).
  central = next(r["ours"] for r in result["records"]
                 if (r["evaluation"], r["row"]) == ("linear_10", "centralized_cco"))
  raw = base["baselines"]["linear_10"]["raw_pixels"]
  assert (f"Centralized rows minus raw pixels, points: Centralized CCO "
          f"{table_report.fmt(central)} ({100 * (central - raw):+.1f})." in md)

  # Resume: finished and failed cells are kept; a cell whose results are gone runs again, to the same
  # numbers (a federated cell resumes from its checkpoint: here, its last round).
  def mtimes():
    return {p: os.path.getmtime(os.path.join(out, p)) for p in (
        "cells/centralized_cco/all/results.json", "cells/fedavg_cco/iid_4/failed.json",
        "selection/dcco/lr_0.001/results.json")}
  before = mtimes()
  os.remove(os.path.join(out, "cells", "dcco", "iid_4", "results.json"))
  again = reproduce.reproduce(table, out, progress=False)
  assert mtimes() == before
  assert [r["ours"] for r in again["records"]] == [r["ours"] for r in result["records"]]
  assert len(json.load(open(os.path.join(out, "timing.json")))["invocations"]) == 2

  # A finished cell run with other settings than the table's now is an error, not silently reused.
  changed = dataclasses.replace(table, rows=tuple(
      dataclasses.replace(r, config=dataclasses.replace(r.config, width=0.5))
      if r.key == "centralized_cco" else r for r in table.rows))
  with pytest.raises(ValueError, match="centralized_cco.*run with other settings"):
    reproduce.reproduce(changed, out, progress=False)
  timing = lambda: json.load(open(os.path.join(out, "timing.json")))["invocations"]  # noqa: E731
  assert len(timing()) == 2  # A refused invocation is not part of the table's run time ...

  # The clock reproduce reads: an interrupted part of the dcco cell lasts 1,000 s on it.
  offset = [0.0]
  monkeypatch.setattr(reproduce, "time", types.SimpleNamespace(
      perf_counter=lambda: time.perf_counter() + offset[0]))

  def interrupted(config, output_dir, **kwargs):
    offset[0] += 1000.0
    raise KeyboardInterrupt
  monkeypatch.setattr(experiment, "run", interrupted)
  os.remove(os.path.join(out, "cells", "dcco", "iid_4", "results.json"))
  with pytest.raises(KeyboardInterrupt):
    reproduce.reproduce(table, out, progress=False)
  assert len(timing()) == 3 and timing()[-1] > 1000  # ... an interrupted one is (sessions end).
  with pytest.raises(KeyboardInterrupt):  # Interrupted twice: the parts add up.
    reproduce.reproduce(table, out, progress=False)
  runs = lambda: json.load(open(os.path.join(out, "timing.json")))  # noqa: E731
  assert 2000 <= runs()["interrupted"]["cells/dcco/iid_4"] < 2100
  # The run that finishes the cell reports its time with the interrupted parts'.
  monkeypatch.setattr(experiment, "run", real_run)
  reproduce.reproduce(table, out, progress=False)
  assert runs()["runs"]["cells/dcco/iid_4"] >= 2000 and "interrupted" not in runs()
  # A cell deleted to run again starts its time over.
  monkeypatch.setattr(experiment, "run", interrupted)
  os.remove(os.path.join(out, "cells", "dcco", "iid_4", "results.json"))
  with pytest.raises(KeyboardInterrupt):
    reproduce.reproduce(table, out, progress=False)
  shutil.rmtree(os.path.join(out, "cells", "dcco", "iid_4"))
  with pytest.raises(KeyboardInterrupt):
    reproduce.reproduce(table, out, progress=False)
  assert 1000 <= runs()["interrupted"]["cells/dcco/iid_4"] < 1100


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
  rounds, losses, probe_rounds, probe = table_plot.read_metrics(str(tmp_path / "metrics.csv"))
  assert list(rounds) == [0, 1, 2, 3, 4] and list(losses) == [5.0, 4.0, 3.0, 2.5, 2.0]
  assert list(probe_rounds) == [2, 4] and list(probe) == [0.5, 0.6]  # After the round probed.
  # A centralized run's metrics.csv (step, loss, linear_probe_accuracy) reads the same way; a
  # missing one is empty.
  assert all(len(x) == 0 for x in table_plot.read_metrics(str(tmp_path / "missing.csv")))


def test_baselines_are_keyed_by_what_changes_them(tmp_path, monkeypatch):
  """A grid whose second column trains on another dataset (other images, another size) is gated
  against that dataset's raw pixels and random init, not the first's; a folder's baselines of the
  older layout (keyed by evaluation alone: they could be another dataset's) are measured again."""
  from tff_ssl.data import synthetic  # pylint: disable=g-import-not-at-top
  base = ExperimentConfig(method="dcco", dataset="synthetic", encoder="resnet8", width=0.25,
                          stem_stride=2, projector=(16, 16, 16), rounds=2, seed=0)
  columns = (tables.Column("a", "", 100, 1, 4, 0.0, title="synthetic"),
             tables.Column("b", "", 100, 1, 4, 0.0, overrides=(("dataset", "cifar10"),),
                           title="CIFAR-10"))
  table = tables.Table(name="two", scale="test", title="Two datasets",
                       rows=(tables.Row("dcco", "DCCO", base),), columns=columns,
                       evaluations=tables.TUNED_10_TWO_SEEDS, paper={}, curve_every=0,
                       selection_column="a", supervised_epochs=0,
                       gate_evaluations=tables.TUNED_GATE)
  small = lambda split, **kw: synthetic(split, num_examples=8, **kw)  # noqa: E731
  splits = {"synthetic": (small("train"), small("test")),
            "cifar10": tuple(dataclasses.replace(small(s, image_size=16, channels=3),
                                                 name="cifar10") for s in ("train", "test"))}
  # Raw pixels: 90% on the first dataset, 30% on the second; random init: 50%, 20%.
  def fake_evaluate(encoder, train, test, protocol):
    del test, protocol
    raw = encoder.name == "raw_pixels"
    return {("synthetic", True): 0.90, ("cifar10", True): 0.30, ("synthetic", False): 0.50,
            ("cifar10", False): 0.20}[(train.name, raw)]
  accuracy = {"a": 0.92, "b": 0.45}

  def fake_run(config, run_dir, **kwargs):
    del kwargs
    a = accuracy[os.path.basename(run_dir)]
    return {"linear_probe_accuracy_pretrained": a, "evaluations": {k: a for k in tables.TUNED_GATE}}

  monkeypatch.setattr(reproduce.evaluation, "evaluate", fake_evaluate)
  monkeypatch.setattr(reproduce.experiment, "load_splits", lambda config: splits[config.dataset])
  monkeypatch.setattr(reproduce.experiment, "run", fake_run)
  out = str(tmp_path / "two")
  os.makedirs(out)
  with open(os.path.join(out, "random_init.json"), "w") as f:  # Stale: the first dataset's.
    json.dump({"baselines": {k: {"raw_pixels": 0.90, "random_init": 0.50}
                             for k in tables.TUNED_GATE}}, f)
  logged = []
  result = reproduce.reproduce(table, out, progress=False, log=logged.append)
  md = open(result["table_md"]).read()
  assert "| DCCO, CIFAR-10 (against its own baselines) | +15.0, +15.0 | +25.0, +25.0 | passes" in md
  assert "| DCCO, synthetic | +2.0, +2.0 | +42.0, +42.0 | passes |" in md
  # The baseline rows show each column's own, and each cell is counted against its own.
  assert "| *Raw pixels* | 90.0 | 30.0 |" in md
  assert "Pretrained cells above the raw-pixel row: 2 of 2 (best 45.0 vs 30.0)." in md
  assert any("older layout" in line for line in logged)
  stored = json.load(open(os.path.join(out, "random_init.json")))
  assert stored["version"] == reproduce.BASELINES_VERSION
  assert sorted(stored["raw_pixels"].values()) == [0.30, 0.30, 0.90, 0.90]
  keys = list(stored["raw_pixels"])
  assert any(k.startswith("cifar10 16x16x3 | ") for k in keys)
  assert any(k.startswith("synthetic 28x28x1 | ") for k in keys)


def test_render_only_runs_nothing_and_shows_what_is_finished(tmp_path, monkeypatch):
  """`render_only`: the report of the finished cells and the stored choices; no pilot, no cell, no
  invocation recorded (only missing baselines are measured)."""
  table = tiny_table()
  table = dataclasses.replace(table, rows=table.rows[1:3], columns=table.columns[:1],
                              evaluations=EVALS[:1], selection_column="noniid_1")
  out = str(tmp_path / "tiny")
  done = os.path.join(out, "cells", "dcco", "noniid_1")
  os.makedirs(done)
  with open(os.path.join(done, "results.json"), "w") as f:
    json.dump({"linear_probe_accuracy_pretrained": 0.7}, f)
  with open(os.path.join(out, "selection.json"), "w") as f:
    json.dump({"dcco": {"learning_rate": 1e-2, "field": "server_learning_rate",
                        "validation_linear_probe": {"0.001": 0.5, "0.01": 0.6}, "pilot_length": 2,
                        "column": "noniid_1", "validation_fraction": 0.1}}, f)

  def no_run(*args, **kwargs):
    raise AssertionError("render_only ran a cell or a pilot")

  monkeypatch.setattr(experiment, "run", no_run)
  monkeypatch.setattr(reproduce.evaluation, "evaluate", lambda *a: 0.5)
  result = reproduce.reproduce(table, out, progress=False, render_only=True)
  md = open(result["table_md"]).read()
  assert "| DCCO | **70.0** (51.7) |" in md and "| Centralized CCO | … (52.6) |" in md
  assert "| Centralized CCO | learning_rate = 0.01 | DCCO's choice" in md
  assert not os.path.exists(os.path.join(out, "timing.json"))


def test_a_row_starts_from_another_rows_encoder_which_runs_before_the_pilots(tmp_path,
                                                                            monkeypatch):
  """`Row.init_from`: the centralized row runs first; the federated row's pilots and cell start from
  its encoder (`--init_from`); a table or a selection that breaks the link is refused."""
  monkeypatch.setattr(reproduce, "MAX_BEYOND_EDGE", 0)  # The grid's two pilots; more add no link.
  base = ExperimentConfig(method="dcco", dataset="synthetic", encoder="resnet8", width=0.25,
                          stem_stride=2, projector=(16, 16, 16), rounds=1, checkpoint_every=1,
                          log_every=1, seed=0)
  rows = (
      tables.Row("pretrained", "Centralized CCO", dataclasses.replace(
          base, method="centralized", ssl="cco", steps=2, batch_size=16)),
      tables.Row("dcco", "DCCO from it", base, learning_rates=(1e-3, 1e-2), init_from="pretrained"))
  evals = (tables.Evaluation("linear_10", "Linear 10%", evaluation.LinearProbeConfig(0.1, steps=5)),)
  table = tables.Table(name="init", scale="test", title="Init", rows=rows,
                       columns=(tables.Column("iid_4", "IID", 500, 4, 4, 1000.0),),
                       evaluations=evals, paper={}, curve_every=100, selection_column="iid_4",
                       supervised_epochs=1, pilot_fraction=1.0)
  out = str(tmp_path / "init")
  reproduce.reproduce(table, out, progress=False)
  start = os.path.join(out, "cells", "pretrained", "all")
  pilots = sorted(os.listdir(os.path.join(out, "selection", "dcco")))
  assert len(pilots) >= 2
  first_pilot = min(os.path.getmtime(os.path.join(out, "selection", "dcco", p, "hparams.json"))
                    for p in pilots)
  assert os.path.getmtime(os.path.join(start, "results.json")) < first_pilot  # Ran first.
  for run in [os.path.join("selection", "dcco", p) for p in pilots] + ["cells/dcco/iid_4"]:
    assert json.load(open(os.path.join(out, run, "hparams.json")))["init_from"] == start, run
  result = json.load(open(os.path.join(out, "cells", "dcco", "iid_4", "results.json")))
  assert result["init_from"] == start  # The starting encoder's probes are its own row's cell.
  with pytest.raises(ValueError, match="row 'dcco' starts from the encoder of row 'nope': it must"):
    dataclasses.replace(table, rows=(rows[0], dataclasses.replace(rows[1], init_from="nope")))
  with pytest.raises(ValueError, match="of row 'pretrained'; select 'pretrained' too"):
    table.select(["dcco"])
