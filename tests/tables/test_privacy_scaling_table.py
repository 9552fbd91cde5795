"""The DP scaling table as data (issue 53): its grid (one-image users against users of 4 images at
the same images a round, cohorts, epsilons, simulated noise cohorts), and its checks, appendix and
plot on hand-made results."""

import json
import math
import os

import pytest

import tasks
from tasks import privacy_scaling_table as scaling
from tests.tables import gates
from tff_ssl import reproduce, table_report
from tff_ssl.tables import Column


@pytest.mark.parametrize("scale", ["mini", "paper"])
def test_grid(scale):
  table = tasks.get_table("privacy_scaling", scale)
  assert [r.key for r in table.rows] == ["dcco_cco", "dcco_vicreg", "fedavg_simclr"]
  todo, skipped = reproduce.cells(table)
  simulated = [c for c in table.columns if scaling.noise_cohort_of(c)]
  # The simulated noise cohorts extrapolate DP-DCCO (CCO) alone; every row runs the real cohorts.
  assert set(skipped) == {(r, c.key) for r in ("dcco_vicreg", "fedavg_simclr") for c in simulated}
  assert len(todo) == 3 * len(table.columns) - len(skipped)
  cohorts = sorted({scaling.cohort_of(c) for c in table.columns})
  assert cohorts == ([128, 1024, 4096] if scale == "mini" else [4096, 8192, 16384])
  population = 60_000 if scale == "mini" else 50_000
  for cell in todo:
    c = table.cell_config(cell.row, cell.column)
    k, eps = scaling.cohort_of(cell.column), scaling.epsilon_of(cell.column)
    assert c.dp == ("off" if math.isinf(eps) else "gaussian_adaptive")
    assert c.client_sampling == "fixed" and c.dp_clip > 0
    if cell.row.key.startswith("dcco"):  # One-image users over the whole split.
      assert (c.method, c.partition, c.samples_per_client, c.num_clients) == (
          "dcco", "per_image", 1, population)
      assert c.clients_per_round == k and c.dp_statistics_clip > 0
      assert c.dp_statistics_quantile == scaling.STATISTICS_QUANTILE
      assert c.dp_statistics_clip_rate == scaling.STATISTICS_CLIP_RATE
      assert c.dp_noise_cohort == scaling.noise_cohort_of(cell.column)
    else:  # Users of 4 images: the same images a round, a quarter of the users.
      assert (c.method, c.ssl, c.samples_per_client, c.num_clients) == (
          "fedavg", "simclr", 4, population // 4)
      assert c.clients_per_round == k // 4
      assert c.dp_noise_cohort == scaling.noise_cohort_of(cell.column) // 4
    if scale == "mini":
      assert c.dataset == "fashion_mnist_shifted" and c.rounds == scaling.MINI_ROUNDS[k]
  largest = max(cohorts)
  assert {(scaling.cohort_of(c), scaling.epsilon_of(c)) for c in table.columns
          if not scaling.noise_cohort_of(c)} == {(k, 8.0) for k in cohorts} | {
              (largest, 2.0), (largest, math.inf)}
  assert simulated and all(  # The extrapolation: at the largest K, whose own cells differ from it
      # only in the noise.
      scaling.cohort_of(c) == largest < scaling.noise_cohort_of(c) <= population
      and scaling.epsilon_of(c) == 8.0 for c in simulated)
  assert len(table.claims) == 2  # Each DP-DCCO row above DP-FedAvg.


def test_a_column_in_images_must_divide_into_clients():
  column = Column("k6", "", in_images=(("clients_per_round", 6),))
  row = tasks.get_table("privacy_scaling", "mini").row("fedavg_simclr")
  with pytest.raises(ValueError, match="no whole number of clients of 4 images"):
    column.apply(row.config)


def _fake_run(table, out):
  """Every cell's results.json and aggregation.csv, and the baselines, as bin/reproduce leaves
  them: accuracy rising with K, noise-to-signal falling with it (no files where a row does not run)."""
  for r, drop in (("dcco_cco", 0.0), ("dcco_vicreg", -0.01), ("fedavg_simclr", 0.03)):
    for c in table.columns:
      if table.row(r).skip_reason(c):
        continue
      k, eps = scaling.cohort_of(c), scaling.epsilon_of(c)
      acc = 0.72 if math.isinf(eps) else 0.55 + 0.03 * math.log2(k / 128) / 2 - drop
      path = os.path.join(out, "cells", r, c.key)
      os.makedirs(path)
      results = {"evaluations": {"tuned_10_s0": acc, "tuned_10_s1": acc + 0.01}}
      if not math.isinf(eps):
        results.update(epsilon=eps - 0.001, delta=1.7e-5, dp_noise_multiplier=2.0)
        if scaling.noise_cohort_of(c):
          results["dp_label"] = f"noise simulated for a cohort of {scaling.noise_cohort_of(c)}"
        ratio = 100.0 / k
        with open(os.path.join(path, "aggregation.csv"), "w") as f:
          if r.startswith("dcco"):
            f.write("round,statistics_noise_to_signal,statistics_clipped_fraction,statistics_clip,"
                    "update_noise_to_signal,update_clipped_fraction,update_clip\n")
            for i in range(3):
              f.write(f"{i},{ratio / 10},0.5,400,{ratio * (1 + i)},0.4,{1000 - i}\n")
          else:
            f.write("round,noise_to_signal,clipped_fraction,dp_clip\n")
            for i in range(3):
              f.write(f"{i},{ratio * 2},0.5,5\n")
      with open(os.path.join(path, "results.json"), "w") as f:
        json.dump(results, f)
  with open(os.path.join(out, "random_init.json"), "w") as f:
    json.dump({"baselines": {k: {"raw_pixels": 0.64, "random_init": 0.36}
                             for k in ("tuned_10_s0", "tuned_10_s1")}}, f)


def test_checks_appendix_and_plot(tmp_path):
  table = tasks.get_table("privacy_scaling", "mini")
  out = str(tmp_path)
  _fake_run(table, out)
  summary = scaling.noise_summary(os.path.join(out, "cells", "dcco_cco", "k1024"))
  assert summary["update"]["noise_to_signal"] == pytest.approx(2 * 100 / 1024)  # The median.
  assert summary["statistics"]["clip"] == 400.0 and summary["update"]["clip"] == 998.0
  fedavg = scaling.noise_summary(os.path.join(out, "cells", "fedavg_simclr", "k128"))
  assert fedavg["update"]["noise_to_signal"] == pytest.approx(200 / 128)
  text = scaling.appendix(table, out)
  assert os.path.exists(os.path.join(out, "privacy_scaling.png")) and "privacy_scaling.png" in text
  assert "| DP-DCCO (CCO) | K = 1,024, ε = 8 | 900 | 7.999 | 2.000 | 0.00977, 0.50 | 0.195, 0.40 | - |" \
      in text, text
  assert "noise simulated for a cohort of 16384 |" in text
  cells, _ = scaling.main_probe(table, out)
  records = [{"evaluation": k, "row": r, "column": c,
              "ours": cells[(r, c)] + (0.005 if k.endswith("s1") else -0.005)}
             for (r, c) in cells for k in ("tuned_10_s0", "tuned_10_s1")]
  lines = scaling.checks(table, records, gates.passing(records))
  assert any(l.startswith("DP-DCCO (CCO) at ε = 8, largest cohort run (K = 4,096): passes")
             for l in lines), lines
  assert any(l.startswith("DP-DCCO (CCO) at K = 128, ε = 8: 55.0 / 56.0 (-17.0 / -17.0 points from no DP")
             for l in lines), lines
  failing = scaling.checks(table, records, gates.passing(records, but=[("dcco_vicreg", "k4096")]))
  assert any(l.startswith("DP-DCCO (VICReg) at ε = 8, largest cohort run (K = 4,096): does not "
                          "pass the gate (over raw pixels +5.0, +0.5") for l in failing), failing
  claims = table_report.claim_lines(table, records, gates.passing(records))
  assert any("DP-DCCO (VICReg)" in l and "DP-FedAvg" in l and l.endswith("holds") for l in claims)
