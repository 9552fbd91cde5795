"""bin/benchmark on the tiny model: the table, the CSV and the bad-input path (no timing asserted)."""

import csv
import math
import os
import subprocess
import sys

import portpicker
import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARK = os.path.join(ROOT, "bin", "benchmark")


def run(*args, timeout=900):
  return subprocess.run([sys.executable, BENCHMARK, *args], capture_output=True, text=True,
                        timeout=timeout, check=False)


def test_benchmark_writes_table_and_csv(tmp_path):
  out = tmp_path / "bench.csv"
  # The two-phase round and the one-computation round (--dcco_statistics=previous: its warm-up
  # round runs both phases, the timed one one phase) in one run.
  proc = run("--model=tiny", "--dataset=synthetic", "--scenarios=dcco_128x4,dcco_previous_128x4",
             "--rounds=1", "--warmup=1", "--profile", f"--output_csv={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert ("| dcco_128x4 | float32 | 512 |" in proc.stdout
          and "| dcco_previous_128x4 | float32 | 512 |" in proc.stdout)
  assert "profile dcco_128x4: phase1_tff_s" in proc.stdout
  rows = list(csv.DictReader(open(out)))
  assert [r["scenario"] for r in rows] == ["dcco_128x4", "dcco_previous_128x4"]
  for key in ("reference_s", "grouped_s", "baseline_s", "peak_rss_python_mb", "peak_rss_worker_mb"):
    assert float(rows[0][key]) > 0, key
  ratio = float(rows[0]["grouped_s"]) / float(rows[0]["baseline_s"])
  assert abs(float(rows[0]["grouped_ratio"]) - ratio) < 1e-6 * ratio


def test_benchmark_rejects_unknown_scenario(tmp_path):
  out = tmp_path / "bench.csv"
  proc = run("--scenarios=dcco_1x1", f"--output_csv={out}", timeout=600)
  assert proc.returncode == 2
  assert proc.stderr.strip().count("\n") == 0 and "unknown scenario 'dcco_1x1'" in proc.stderr
  assert not out.exists()
  proc = run("--precisions=float32,float16", f"--output_csv={out}", timeout=600)
  assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
  assert "float16" in proc.stderr and "mixed_bfloat16" in proc.stderr and not out.exists()


def test_aggregation_benchmark_writes_every_strategy(tmp_path):
  out = tmp_path / "agg.csv"
  proc = run("--aggregation", "--aggregation_model=tiny", "--dataset=synthetic",
             "--strategies=fedavg,mdawa,ldawa,ldawa_loss", "--clients=3", "--rounds=1",
             "--warmup=1", f"--output_csv={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "| ldawa_loss |" in proc.stdout
  rows = list(csv.DictReader(open(out)))
  assert [r["strategy"] for r in rows] == ["fedavg", "mdawa", "ldawa", "ldawa_loss"]
  # Each row against the first: 1 for the first, unless noise made its time 0 (then unmeasured).
  first = rows[0]
  assert (float(first["tff_process_ratio"]) == 1.0 if float(first["tff_process_s"]) > 0 else
          math.isnan(float(first["tff_process_ratio"])))
  for r in rows:
    assert float(r["tff_total_s"]) > 0 and float(r["client_stage_s"]) > 0
    assert float(r["server_stage_s"]) >= 0 and float(r["tff_process_s"]) >= 0
  proc = run("--aggregation", "--strategies=fedprox", f"--output_csv={tmp_path / 'x.csv'}",
             timeout=600)
  assert proc.returncode == 2 and "unknown strategy 'fedprox'" in proc.stderr


def test_workers_benchmark_times_local_one_and_two_workers(tmp_path):
  """--local_workers=2: the grouped round locally and across 1 and 2 TFF executor services it starts
  and stops; the bytes of a round from the computations' arguments (exact for the clients' data)."""
  out = tmp_path / "workers.csv"
  proc = run("--model=tiny", "--dataset=synthetic", "--scenarios=fedavg_cco_128x4", "--rounds=1",
             "--warmup=1", "--local_workers=2", f"--output_csv={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Grappler" not in proc.stderr and "Traceback" not in proc.stderr
  rows = list(csv.DictReader(open(out)))
  assert [(r["workers"], r["group_size"]) for r in rows] == [("0", "0"), ("1", "128"), ("2", "64")]
  for r in rows:
    assert float(r["round_s"]) > 0
    # 128 clients x 4 images of 28x28x1 uint8, their int64 ids and one int32 size per client.
    assert int(r["client_data_bytes"]) == 512 * 784 + 512 * 8 + 128 * 4
    assert int(r["server_bytes"]) > 0 and int(r["result_bytes"]) > 0
  per_worker = [float(r["bytes_per_worker"]) for r in rows]
  assert per_worker[0] == per_worker[1] > per_worker[2]  # Two workers share the clients' data.
  two = rows[2]
  assert float(two["bytes_per_round"]) == (2 * (int(two["server_bytes"]) + int(two["result_bytes"]))
                                           + int(two["client_data_bytes"]))
  ports = [t.rpartition(":")[2] for t in proc.stdout.split("local workers: ")[1].split()[0].split(",")]
  assert len(ports) == 2
  left = [p for p in psutil.process_iter(["cmdline"])
          if any(f"--port={port}" in " ".join(p.info["cmdline"] or []) for port in ports)]
  assert not left, left


def test_workers_benchmark_rejects_a_worker_that_does_not_answer(tmp_path):
  port = portpicker.pick_unused_port()
  proc = run("--model=tiny", f"--workers=localhost:{port}", f"--output_csv={tmp_path / 'w.csv'}",
             timeout=600)
  assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
  assert f"worker localhost:{port} does not answer" in proc.stderr
  assert not (tmp_path / "w.csv").exists()


def test_mini_model_is_the_mini_dcco_tables_model():
  """`--model=mini` times the DCCO mini table's own model: same tensors, same shapes."""
  import tasks  # pylint: disable=import-outside-toplevel
  from tff_ssl.benchmarks import common  # pylint: disable=import-outside-toplevel
  from tff_ssl.federated.ssl_model import ssl_model_builder  # pylint: disable=import-outside-toplevel
  table = tasks.get_table("dcco_table1", "mini")
  config = table.cell_config(table.row("dcco"), table.column("noniid_1"))
  want = ssl_model_builder(config, (28, 28, 1))()
  got = common.MODELS["mini"]((28, 28, 1))()
  assert [tuple(w.shape) for w in got.weights] == [tuple(w.shape) for w in want.weights]
  assert common.SCENARIOS["dcco_128x1"].clients == config.clients_per_round
