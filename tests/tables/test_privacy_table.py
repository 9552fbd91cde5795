"""The privacy table as data: its grid (rows in their papers' settings, epsilon columns), each DP
cell's calibrated noise, and its checks and plot on hand-made results."""

import json
import math
import os

import numpy as np
import pytest

import tasks
from tasks import privacy_table
from tests.tables import gates
from tff_ssl import privacy, reproduce, table_report
from tff_ssl.privacy import accounting


@pytest.mark.parametrize("scale", ["mini", "paper"])
def test_grid(scale):
  table = tasks.get_table("privacy", scale)
  assert [r.key for r in table.rows] == ["dcco", "fedavg_simclr", "ldawa_simclr"]
  assert [c.key for c in table.columns] == ["eps_inf", "eps_8", "eps_2"]
  todo, skipped = reproduce.cells(table)
  assert not skipped and len(todo) == 9
  for cell in todo:
    c = table.cell_config(cell.row, cell.column)
    eps = privacy_table.epsilon_of(cell.column)
    assert c.dp == ("off" if math.isinf(eps) else "gaussian_fixed")
    assert (c.method, c.ssl) == {"dcco": ("dcco", "cco"), "fedavg_simclr": ("fedavg", "simclr"),
                                 "ldawa_simclr": ("fedavg", "simclr")}[cell.row.key]
    if cell.row.key == "ldawa_simclr":  # L-DAWA's cross-silo setting, with DP-FedAvg's mean.
      assert (c.partition, c.alpha, c.aggregator, c.simulation) == (
          "dirichlet_split", 0.1, "uniform", "reference")
    else:  # DCCO's Table 1, non-IID clients of 4 images.
      assert (c.partition, c.alpha, c.samples_per_client) == ("dirichlet", 0.0, 4)
      assert c.clients_per_round == (32 if scale == "mini" else 128)
    assert c.dp_clip > 0 and (c.method != "dcco" or c.dp_statistics_clip > 0)
    if scale == "mini":
      assert c.dataset == "fashion_mnist_shifted" and c.pool_grid == 2
    if eps == 8.0 and scale == "mini":  # (Each calibration takes ~5 s.)
      # The calibrated noise ends the planned run at epsilon (delta = 1 / population).
      p = privacy.from_config(c, releases=2 if c.method == "dcco" else 1)
      got = accounting.run_epsilon([p.sigma] * p.releases, c.num_clients, c.clients_per_round,
                                   c.rounds, 1.0 / c.num_clients)
      assert eps - 0.01 <= got <= eps


def _fake_run(table, out):
  """Results of every cell and the baselines, as bin/reproduce leaves them."""
  acc = {"eps_inf": 0.70, "eps_8": 0.60, "eps_2": 0.50}
  for r, drop in (("dcco", 0.0), ("fedavg_simclr", 0.02), ("ldawa_simclr", 0.05)):
    for c, a in acc.items():
      path = os.path.join(out, "cells", r, c)
      os.makedirs(path)
      results = {"evaluations": {"tuned_10_s0": a - drop, "tuned_10_s1": a - drop + 0.01}}
      if c != "eps_inf":
        results.update(epsilon=float(c[4:]) - 0.001, delta=1e-4, dp_noise_multiplier=1.5)
      with open(os.path.join(path, "results.json"), "w") as f:
        json.dump(results, f)
  with open(os.path.join(out, "random_init.json"), "w") as f:
    json.dump({"baselines": {k: {"raw_pixels": 0.64, "random_init": 0.36}
                             for k in ("tuned_10_s0", "tuned_10_s1")}}, f)


def test_checks_and_appendix(tmp_path):
  table = tasks.get_table("privacy", "mini")
  out = str(tmp_path)
  _fake_run(table, out)
  cells, base = privacy_table.main_probe(table, out)
  assert cells[("dcco", "eps_8")] == pytest.approx(0.605) and base["raw_pixels"] == 0.64
  text = privacy_table.appendix(table, out)
  assert os.path.exists(os.path.join(out, "privacy_curve.png")) and "privacy_curve.png" in text
  assert "| DCCO | ε = 8 | 7.999 |" in text
  records = [{"evaluation": k, "row": r, "column": c,
              "ours": cells[(r, c)] + (0.005 if k.endswith("s1") else -0.005)}
             for (r, c) in cells for k in ("tuned_10_s0", "tuned_10_s1")]
  lines = privacy_table.checks(table, records, gates.passing(records))
  claims = table_report.claim_lines(table, records, gates.passing(records))
  assert len(claims) == len(table.columns)  # DCCO above Contrastive + FedAvg at each epsilon.
  assert any(l.startswith("[1] ε = 8: DCCO") and "is above Contrastive + FedAvg" in l and
             l.endswith("holds") for l in claims), claims
  assert any(l.startswith("DCCO at ε = 2: 50.0 / 51.0 (-20.0 / -20.0 points") for l in lines), lines
  np.testing.assert_allclose(sorted(cells.values())[0], 0.455)
