"""bin/benchmark on the tiny model: the table, the CSV and the bad-input path (no timing asserted)."""

import csv
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARK = os.path.join(ROOT, "bin", "benchmark")


def run(*args, timeout=300):
  return subprocess.run([sys.executable, BENCHMARK, *args], capture_output=True, text=True,
                        timeout=timeout, check=False)


def test_benchmark_writes_table_and_csv(tmp_path):
  out = tmp_path / "bench.csv"
  proc = run("--model=tiny", "--dataset=synthetic", "--scenarios=dcco_128x4",
             "--rounds=1", "--warmup=1", "--profile", f"--output_csv={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "| dcco_128x4 | 512 |" in proc.stdout
  assert "profile dcco_128x4: phase1_tff_s" in proc.stdout
  rows = list(csv.DictReader(open(out)))
  assert len(rows) == 1 and rows[0]["scenario"] == "dcco_128x4"
  for key in ("reference_s", "grouped_s", "baseline_s", "peak_rss_python_mb", "peak_rss_worker_mb"):
    assert float(rows[0][key]) > 0, key
  ratio = float(rows[0]["grouped_s"]) / float(rows[0]["baseline_s"])
  assert abs(float(rows[0]["grouped_ratio"]) - ratio) < 1e-6 * ratio


def test_benchmark_rejects_unknown_scenario(tmp_path):
  out = tmp_path / "bench.csv"
  proc = run("--scenarios=dcco_1x1", f"--output_csv={out}", timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip().count("\n") == 0 and "unknown scenario 'dcco_1x1'" in proc.stderr
  assert not out.exists()


def test_aggregation_benchmark_writes_every_strategy(tmp_path):
  out = tmp_path / "agg.csv"
  proc = run("--aggregation", "--aggregation_model=tiny", "--dataset=synthetic",
             "--strategies=fedavg,mdawa,ldawa,ldawa_loss", "--clients=3", "--rounds=1",
             "--warmup=1", f"--output_csv={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "| ldawa_loss |" in proc.stdout
  rows = list(csv.DictReader(open(out)))
  assert [r["strategy"] for r in rows] == ["fedavg", "mdawa", "ldawa", "ldawa_loss"]
  assert float(rows[0]["tff_process_ratio"]) == 1.0
  for r in rows:
    assert float(r["tff_total_s"]) > 0 and float(r["client_stage_s"]) > 0
    assert float(r["server_stage_s"]) >= 0 and float(r["tff_process_s"]) >= 0
  proc = run("--aggregation", "--strategies=fedprox", f"--output_csv={tmp_path / 'x.csv'}",
             timeout=120)
  assert proc.returncode == 2 and "unknown strategy 'fedprox'" in proc.stderr
