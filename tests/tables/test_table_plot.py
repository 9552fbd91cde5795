"""tff_ssl.table_plot on hand-written run folders: each cell's loss and probe series (a failed
run's ending at its last finite loss), the y range a diverging run does not flatten, and a legend
that lies inside the figure."""

import json
import os

import numpy as np

import tasks
from tff_ssl import reproduce, table_plot

RANDOM_ACC, RAW_PIXELS = 0.36, 0.64


def _write(path, text):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write(text)


def _folder(tmp_path):
  """DCCO (ran), one-computation DCCO (diverged, then nan at round 125) in noniid_1, centralized
  CCO (ran, logged every 50 steps, a probe after step 450): their metrics.csv and results.json or
  failed.json."""
  table = tasks.get_table("dcco_statistics", "mini").select(
      rows=["dcco", "dcco_previous", "centralized_cco"], columns=["noniid_1"])
  todo, _ = reproduce.cells(table)
  out = str(tmp_path)
  results = {}
  for cell in todo:
    run = os.path.join(out, cell.path)
    if cell.row.key == "dcco":
      lines = ["round,loss"] + [f"{r},{470 - 0.3 * r}" for r in range(1000)]
      results[cell.path] = {"linear_probe_accuracy_pretrained": 0.64}
    elif cell.row.key == "dcco_previous":
      lines = ["round,loss"] + [f"{r},{469 * 1.25 ** r}" for r in range(125)] + ["125,nan"]
      results[cell.path] = {"failed": "round 125: loss became nan"}
    else:
      lines = ["step,loss,linear_probe_accuracy"] + [
          f"{s},{465 - 0.3 * s},{'0.6' if s == 450 else ''}" for s in range(0, 1000, 50)] + [
              "999,160,"]
      results[cell.path] = {"linear_probe_accuracy_pretrained": 0.66}
    _write(os.path.join(run, "metrics.csv"), "\n".join(lines) + "\n")
    name = "failed.json" if "failed" in results[cell.path] else "results.json"
    _write(os.path.join(run, name), json.dumps(results[cell.path]))
  return table, out, todo, results


def test_series_of_each_cell(tmp_path):
  _, out, todo, results = _folder(tmp_path)
  s = {c.row.key: table_plot.series(out, c, results[c.path], RANDOM_ACC) for c in todo}
  assert not s["dcco"].failed and s["dcco"].rounds[-1] == 999 and s["dcco"].length == 1000
  assert list(s["dcco"].probe_rounds) == [0, 1000]
  np.testing.assert_allclose(s["dcco"].probe_accuracy, [RANDOM_ACC, 0.64])
  failed = s["dcco_previous"]
  assert failed.failed and failed.rounds[-1] == 124 and len(failed.rounds) == 125
  assert np.isfinite(failed.losses).all() and failed.losses[-1] > 1e12
  assert list(failed.probe_rounds) == [0]  # Round 0 alone: a failed run has no final probe.
  central = s["centralized_cco"]
  assert list(central.probe_rounds) == [0, 451, 1000] and central.rounds[-1] == 999


def test_a_diverging_run_does_not_flatten_the_others():
  kept = [np.linspace(470, 170, 1000)]
  linthresh, (bottom, top) = table_plot.loss_axis(kept, [469 * 1.25 ** np.arange(125)])
  assert linthresh is None and 100 < bottom < 170 and 470 < top < 2000
  linthresh, (bottom, top) = table_plot.loss_axis([np.linspace(5e4, -1, 100)], [])
  assert linthresh is not None and bottom < -1 and top >= 5e4


def test_figure_draws_the_failed_run_and_keeps_its_legend_inside(tmp_path):
  table, out, todo, results = _folder(tmp_path)
  fig = table_plot.figure(table, out, todo, results, RANDOM_ACC, RAW_PIXELS)
  fig.canvas.draw()
  legend = next(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)
  labels = [t.get_text() for t in legend.get_texts()]
  assert any("(failed)" in label and "One-computation" in label for label in labels)
  assert fig.bbox.contains(*legend.get_window_extent().p0)
  assert fig.bbox.contains(*legend.get_window_extent().p1)
  loss_ax = next(ax for ax in fig.axes if ax.get_ylabel() == "training loss")
  crosses = [line for line in loss_ax.get_lines() if line.get_marker() == "x"]
  assert len(crosses) == 1 and crosses[0].get_xdata()[0] == 124
  assert crosses[0].get_ydata()[0] == loss_ax.get_ylim()[1]  # Off the top: at the top edge.
  path = table_plot.plot(table, out, todo, results, RANDOM_ACC, RAW_PIXELS)
  assert path == os.path.join(out, "curves.png")
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert not [f for f in os.listdir(out) if f.startswith(".tmp")]


def test_a_long_legend_fits(tmp_path):
  table = tasks.get_table("ldawa_table2", "mini")  # 12 rows, some of long names.
  todo, _ = reproduce.cells(table)
  results = {}
  for cell in todo:
    _write(os.path.join(str(tmp_path), cell.path, "metrics.csv"), "round,loss\n0,5\n1,4\n2,3\n")
    results[cell.path] = {"linear_probe_accuracy_pretrained": 0.7}
  fig = table_plot.figure(table, str(tmp_path), todo, results, RANDOM_ACC, RAW_PIXELS)
  fig.canvas.draw()
  legend = next(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)
  assert len(legend.get_texts()) == len(table.rows) + 1
  box = legend.get_window_extent()
  assert fig.bbox.contains(*box.p0) and fig.bbox.contains(*box.p1)
