"""The DP levers table as data (issue 74): its grid (every lever on in the grid's DP cells, the
field's accounting convention, synthetic init from a row that pretrains on no task image), its
ablation (each step adds exactly one lever to the one before it), and its checks and appendix on
hand-made results."""

import json
import math
import os

import pytest

import tasks
from tasks import privacy_levers_table as levers
from tests.tables import gates
from tff_ssl import reproduce, table_report


def _cells(table):
  todo, skipped = reproduce.cells(table)
  return {(c.row.key, c.column.key if c.column else ""): reproduce.with_init(
      table, c.row, table.cell_config(c.row, c.column), "out") for c in todo}, skipped


def test_grid():
  table = tasks.get_table("privacy_levers", "mini")
  configs, _ = _cells(table)
  synthetic = configs.pop(("synthetic", ""))  # Centralized, on images of no task: the init.
  assert (synthetic.method, synthetic.dataset, synthetic.probe_dataset) == (
      "centralized", "synthetic_leaves", "fashion_mnist_shifted")
  grid = [c for c in table.columns if not c.key.startswith("abl_")]
  assert {(levers.epsilon_of(c), dict(c.in_images)["clients_per_round"]) for c in grid} == {
      (8.0, 1024), (8.0, 4096), (2.0, 1024), (2.0, 4096), (math.inf, 4096)}
  rows = [r.key for r in table.rows if r.federated]
  assert rows == ["dcco_cco", "dcco_cco_synth", "dcco_vicreg", "dcco_vicreg_synth",
                  "fedavg_simclr", "fedavg_simclr_synth"]
  for r in rows:
    for c in grid:
      cfg = configs[(r, c.key)]
      assert cfg.init_from == ("out/cells/synthetic/all" if r.endswith("_synth") else "")
      k = dict(c.in_images)["clients_per_round"]
      assert cfg.rounds == levers.MINI_ROUNDS[k] and cfg.client_sampling == "poisson"
      assert cfg.dataset == "fashion_mnist_shifted"
      if math.isinf(levers.epsilon_of(c)):
        assert cfg.dp == "off" and cfg.dp_augmentations == 1
        continue
      assert (cfg.dp, cfg.dp_accountant, cfg.dp_target_epsilon) == (
          "gaussian_adaptive", "pld", levers.epsilon_of(c))
      assert cfg.dp_augmentations == levers.MULTIPLICITY and cfg.ema_eval == levers.EMA_DECAY
      if r.startswith("dcco"):  # One-image users; unit projections, the clip at their bound.
        assert (cfg.partition, cfg.samples_per_client, cfg.num_clients, cfg.clients_per_round) == (
            "per_image", 1, 60_000, k)
        assert cfg.projector_output == "unit" and cfg.dp_statistics_clip_at_bound
        assert cfg.dp_statistics_clip_rate == 0.0
      else:  # Users of 4 images: the same images a round.
        assert (cfg.samples_per_client, cfg.num_clients, cfg.clients_per_round) == (4, 15_000,
                                                                                   k // 4)
  assert "PLD, Poisson sampling, add/remove" in table.column_heading
  assert "RDP, fixed-size sampling, replace-one" in table.column_heading  # The ablation's start.


def test_each_ablation_step_adds_one_lever():
  table = tasks.get_table("privacy_levers", "mini")
  configs, _ = _cells(table)
  steps = [(r, c) for r, c, _, _ in levers.ABLATION]
  assert steps[3:5] == [("dcco_cco", "k4096"), ("dcco_cco_synth", "k4096")]  # The grid's cells.
  assert {r for r, c in configs if c.startswith("abl_")} == {"dcco_cco", "dcco_cco_synth"}
  changed = []
  for before, after in zip(steps, steps[1:]):
    a, b = configs[before], configs[after]
    changed.append({f for f in a.__dataclass_fields__ if getattr(a, f) != getattr(b, f)})
  first = configs[steps[0]]  # The DP scaling table's convention and clips.
  assert (first.client_sampling, first.dp_accountant, first.projector_output) == (
      "fixed", "rdp", "linear")
  assert first.dp_statistics_clip_rate == 1.0 and first.dp_statistics_quantile == 0.9
  assert changed == [{"client_sampling", "dp_accountant"},
                     {"projector_output", "dp_statistics_clip_at_bound", "dp_statistics_clip",
                      "dp_statistics_clip_rate", "dp_statistics_quantile"},
                     {"ema_eval"}, {"init_from"}, {"dp_augmentations"}]
  assert configs[steps[-1]].dp_augmentations == levers.ABLATION_MULTIPLICITY > levers.MULTIPLICITY
  assert all(configs[s].dp_target_epsilon == 8.0 and configs[s].clients_per_round == 4096
             and configs[s].rounds == levers.MINI_ROUNDS[4096] for s in steps)


def _fake_run(table, out):
  """results.json of every federated cell and of the synthetic row, and the baselines."""
  for r in table.rows:
    for c in (table.columns if r.federated else [None]):
      if c is not None and r.skip_reason(c):
        continue
      acc = 0.70 if r.key == "synthetic" else 0.6 + (0.1 if r.init_from else 0.0)
      if c is not None and c.key == "k4096_nodp":
        acc += 0.05
      if c is not None and c.key.startswith("abl_"):
        acc = {"abl_scaling": 0.40, "abl_pld": 0.42, "abl_unit": 0.5,
               "abl_multiplicity": 0.75}[c.key]
      path = os.path.join(out, "cells", r.key, c.key if c is not None else "all")
      os.makedirs(path)
      results = {"evaluations": {"tuned_10_s0": acc, "tuned_10_s1": acc + 0.01}}
      if c is not None and not math.isinf(levers.epsilon_of(c)):
        results.update(epsilon=levers.epsilon_of(c) - 0.001, dp_noise_multiplier=1.5)
      with open(os.path.join(path, "results.json"), "w") as f:
        json.dump(results, f)
  with open(os.path.join(out, "random_init.json"), "w") as f:
    json.dump({"baselines": {k: {"raw_pixels": 0.64, "random_init": 0.36}
                             for k in ("tuned_10_s0", "tuned_10_s1")}}, f)


def test_checks_and_ablation_on_hand_made_results(tmp_path):
  table = tasks.get_table("privacy_levers", "mini")
  out = str(tmp_path)
  _fake_run(table, out)
  steps = levers.ablation_steps(table, out)
  assert [s[2] for s in steps] == pytest.approx([0.405, 0.425, 0.505, 0.605, 0.705, 0.755])
  text = levers.appendix(table, out)
  assert "| + Poisson sampling, add/remove, PLD | 42.5 | +2.0 |" in text, text
  assert "| + synthetic init | 70.5 | +10.0 |" in text, text
  assert "| + M = 2 view pairs a user | 75.5 | +5.0 |" in text, text
  assert "| DP-DCCO (CCO) | K = 1,024, ε = 8 | 900 | 7.999 | 1.500 |" in text, text
  records = [{"evaluation": k, "row": r.key, "column": c.key if c is not None else "",
              "ours": json.load(open(os.path.join(
                  out, "cells", r.key, c.key if c is not None else "all",
                  "results.json")))["evaluations"][k]}
             for r in table.rows for c in (table.columns if r.federated else [None])
             if c is None or not r.skip_reason(c) for k in ("tuned_10_s0", "tuned_10_s1")]
  lines = levers.checks(table, records, gates.passing(records))
  assert "DP-DCCO (CCO), synthetic init at K = 4,096, ε = 8: 70.0 / 71.0; passes the gate; over " \
      "synthetic init +0.0 / +0.0; from no DP at K = 4,096 -5.0 / -5.0" in lines, lines
  assert any(l.startswith("DP-DCCO (CCO) at K = 4,096, ε = 8, ablation step '+ PLD': 42.0 / 43.0; "
                          "passes the gate") for l in lines), lines
  assert not any("K = 4,096, ε = 2" in l for l in lines)  # The goal is at epsilon = 8.
  claims = table_report.claim_lines(table, records, gates.passing(records))
  goal = [l for l in claims if "is at least 3 points above Synthetic init" in l]
  assert len(goal) == 6 and all(l.endswith("(+0.0 / +0.0 points) — **fails**") for l in goal), goal
  assert sum(l.endswith("— holds") for l in claims) == 15  # Synthetic init over random, 3 x 5.


def test_the_synthetic_row_is_not_drawn_among_the_private_rows_curves(tmp_path):
  """curves.png leaves out a row whose probes read other images than it trained on (the synthetic
  init, a centralized row drawn otherwise in every column's panels)."""
  from tff_ssl import table_plot  # pylint: disable=g-import-not-at-top
  table = tasks.get_table("privacy_levers", "mini")
  out = str(tmp_path)
  _fake_run(table, out)
  todo, _ = reproduce.cells(table)
  results = {c.path: json.load(open(os.path.join(out, c.path, "results.json"))) for c in todo}
  fig = table_plot.figure(table, out, todo, results, 0.36)
  labels = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
  assert "DP-DCCO (CCO), synthetic init" in labels
  assert not any(l.startswith("Synthetic init") for l in labels), labels
