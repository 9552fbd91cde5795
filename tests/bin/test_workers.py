"""bin/train --workers: every federated computation of a run across two TFF executor services
(bin/worker) on the loopback address gives the local run's metrics, a worker that dies stops the run
with one line naming it, and the rerun resumes; no worker process outlives the test."""

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import portpicker
import psutil
import pytest

from tff_ssl import cli, reproduce, runtime
from tff_ssl import runner
from tests.tables.test_reproduce import tiny_table
from tests import spread
from tests.bin import binaries

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "bin", "train")
WORKER = os.path.join(ROOT, "bin", "worker")
TINY = ["--task=synthetic_dcco_smoke", "--eval_steps=10", "--checkpoint_every=1"]


class Workers:
  """bin/worker processes on the loopback address (restartable)."""

  def __init__(self, count):
    self.ports = [portpicker.pick_unused_port() for _ in range(count)]
    self.procs = [None] * count
    self.seen = []
    for i in range(count):
      self.start(i)

  @property
  def targets(self):
    return [f"localhost:{p}" for p in self.ports]

  def start(self, i):
    self.procs[i] = subprocess.Popen([sys.executable, WORKER, f"--port={self.ports[i]}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    self.seen.append(self.procs[i].pid)
    deadline = time.time() + 60
    while runtime.workers_down([self.targets[i]], timeout=1.0):
      assert self.procs[i].poll() is None and time.time() < deadline, "bin/worker did not start"

  def kill(self, i):
    self.procs[i].kill()
    self.procs[i].wait()

  def stop(self):
    for proc in self.procs:
      if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def workers():
  pool = Workers(2)
  try:
    yield pool
  finally:
    pool.stop()
    # bin/worker execs TFF's executor service: the pid it had is the service; none is left.
    assert not [pid for pid in pool.seen if psutil.pid_exists(pid) and
                psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


def train(out, *args, timeout=900):
  """bin/train in a process of its own."""
  return subprocess.run([sys.executable, TRAIN, f"--output_dir={out}", *TINY, *args],
                        capture_output=True, text=True, timeout=timeout, check=False)


def train_here(out, *args):
  """bin/train's main() in this process (the same code from flag parsing on; ~6 s less a run)."""
  return binaries.train_in_process(f"--output_dir={out}", *TINY, *args)


def _same_run(local, remote, rtol):
  a = (local / "metrics.csv").read_text().splitlines()
  b = (remote / "metrics.csv").read_text().splitlines()
  assert a[0] == b[0] and len(a) == len(b)
  header = a[0].split(",")
  for x, y in zip(a[1:], b[1:]):
    for name, u, v in zip(header, x.split(","), y.split(",")):
      assert (u == "") == (v == ""), (x, y)
      if u:
        spread.within(f"two workers vs local, {name} of round {x.split(',')[0]}",
                      abs(float(u) - float(v)) / max(1.0, abs(float(u))), rtol)


# Workers sum their slots' partial aggregates, then TFF merges them: another summation order than one
# local worker's, so float32 round-off (round 0 of the grouped DCCO smoke run: 2e-5 relative), which
# server Adam amplifies over rounds, as between the grouped and the reference simulation
# (tests/bin/test_train_federated.py).
ROUND_OFF = 1e-3


@pytest.mark.parametrize("name,args", [
    ("dcco", ["--rounds=3", "--clients_per_round=16", "--simulation=grouped", "--group_size=6"]),
    ("fedavg_ldawa", ["--rounds=3", "--method=fedavg", "--ssl=byol", "--aggregator=ldawa",
                      "--samples_per_client=4", "--projector=32,16", "--predictor=32,16",
                      "--local_steps=2", "--group_size=3"]),
])
def test_run_across_two_workers_equals_the_local_run(tmp_path, workers, name, args):
  local, remote = tmp_path / f"{name}_local", tmp_path / f"{name}_workers"
  proc = train_here(local, *args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  proc = train_here(remote, *args, f"--workers={','.join(workers.targets)}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  _same_run(local, remote, ROUND_OFF)
  if name == "fedavg_ldawa":  # The aggregator's per-layer measurements too.
    assert ((local / "aggregation.csv").read_text().splitlines()[0] ==
            (remote / "aggregation.csv").read_text().splitlines()[0])


def test_a_worker_that_dies_stops_the_run_in_one_line_and_the_rerun_resumes(tmp_path, workers,
                                                                              monkeypatch):
  """The three runs in this process (bin/train's main()), so the resumed run is compared bit for bit
  with an uninterrupted run of the same kind; worker 1 is killed right after round 2's metrics are
  written, a point the run reaches in every set-up (a timed kill from outside may miss it)."""
  args = ["--rounds=6", "--group_size=2", f"--workers={','.join(workers.targets)}"]
  uninterrupted = tmp_path / "uninterrupted"
  proc = train_here(uninterrupted, *args)
  assert proc.returncode == 0, proc.stderr[-3000:]

  out = tmp_path / "run"
  release = runner.CSVReleaseManager.release

  async def release_then_kill_worker_1(self, value, key=None):
    await release(self, value, key=key)
    if key == 2 and str(self._file_path) == str(out / "metrics.csv"):  # pylint: disable=protected-access
      workers.kill(1)

  monkeypatch.setattr(runner.CSVReleaseManager, "release", release_then_kill_worker_1)
  monkeypatch.setattr(runtime, "WORKER_RETRY_SECONDS", 2.0)  # 20 s in a real run.
  proc = train_here(out, *args)
  assert proc.returncode == cli.EXIT_ERROR, proc.stderr[-3000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
  assert lines[0].startswith("error: round 3") and f"worker {workers.targets[1]}" in lines[0], lines
  assert "rerun the same command to resume from the checkpoint of round" in lines[0], lines
  assert not (out / "results.json").exists()

  monkeypatch.setattr(runner.CSVReleaseManager, "release", release)
  workers.start(1)  # The worker is back: the same command resumes and ends as if uninterrupted.
  proc = train_here(out, *args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (out / "metrics.csv").read_text() == (uninterrupted / "metrics.csv").read_text()
  a = json.loads((out / "results.json").read_text())
  b = json.loads((uninterrupted / "results.json").read_text())
  assert a["linear_probe_accuracy_pretrained"] == b["linear_probe_accuracy_pretrained"]


def test_unreachable_worker_is_one_line_before_anything_is_written(tmp_path):
  port = portpicker.pick_unused_port()
  out = tmp_path / "run"
  proc = train(out, "--rounds=1", f"--workers=localhost:{port}", timeout=600)  # As a user sees it.
  assert proc.returncode == cli.EXIT_ERROR
  assert proc.stderr.strip().count("\n") == 0, proc.stderr
  assert f"worker localhost:{port} does not answer (nothing listens on its port)" in proc.stderr
  assert f"bin/worker --port={port}" in proc.stderr and not out.exists()
  proc = train_here(out, "--rounds=1", "--workers=localhost")
  assert proc.returncode == cli.EXIT_ERROR and "'localhost' is not host:port" in proc.stderr
  proc = train_here(out, "--rounds=1", f"--workers=localhost:{port},localhost:{port + 1}")
  assert proc.returncode == cli.EXIT_ERROR and "set --group_size=4 or less" in proc.stderr
  assert not out.exists()


def test_a_worker_port_that_accepts_but_never_answers_is_waited_for_then_named(monkeypatch):
  """A closed port is refused within its grace (above); a port that accepts connections but answers
  no gRPC is waited for (10 s in a run), then named the same way."""
  monkeypatch.setattr(runtime, "_WORKER_CONNECT_SECONDS", 0.5)
  with socket.socket() as server:
    server.bind(("localhost", 0))
    server.listen()
    port = server.getsockname()[1]
    with pytest.raises(runtime.WorkerUnavailableError,
                       match=rf"worker localhost:{port} does not answer \(waited 0 s\); start "
                             rf"it there with bin/worker --port={port}"):
      runtime._remote_factory(f"localhost:{port}")  # pylint: disable=protected-access


def tiny_grid():
  """Two federated cells: DCCO and CCO + FedAvg, in one column, under one evaluation (the linear
  probe at 10%: one baseline pair and one probe a cell; the others add time, not coverage)."""
  table = tiny_table()
  return dataclasses.replace(table, rows=table.rows[:2], columns=table.columns[1:], curve_every=100,
                             evaluations=table.evaluations[:1])


REPRODUCE_TINY = textwrap.dedent("""
    import os, runpy, sys
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.path.insert(0, {root!r})
    import tasks
    from tests.bin.test_workers import tiny_grid

    tasks.TABLES["tiny"] = {{"mini": tiny_grid}}
    sys.argv = ["reproduce", "--table=tiny", *sys.argv[1:]]
    runpy.run_path(os.path.join({root!r}, "bin", "reproduce"), run_name="__main__")
""")


def reproduce_tiny(*args):
  """bin/reproduce in a process of its own, on a two-cell table registered for the test."""
  return subprocess.run([sys.executable, "-c", REPRODUCE_TINY.format(root=ROOT), *args],
                        capture_output=True, text=True, timeout=900, check=False)


def test_reproduce_runs_a_tables_cells_across_two_workers_as_it_runs_them_locally(tmp_path,
                                                                                    workers):
  """Both cells' losses to round-off (ROUND_OFF); their accuracies within 1 of the 200 test images
  per evaluation (a prediction at a tie may flip with the round-off); a cell that would leave a worker
  without clients is refused in one line before anything is written."""
  fixed = ["--set=server_learning_rate=0.001", "--max_rounds=2"]  # No pilots: the cells alone.
  targets = f"--workers={','.join(workers.targets)}"
  refused = tmp_path / "refused"
  proc = reproduce_tiny(f"--output_dir={refused}", *fixed, targets)  # One slot a round: 1 worker.
  assert proc.returncode == cli.EXIT_ERROR, proc.stderr[-3000:]
  line = proc.stderr.strip()
  assert line.count("\n") == 0 and line.startswith("error: cell fedavg_cco/iid_4: --workers names "
                                                   "2 workers but a round has 1 TFF client slot"), line
  assert "set --set=group_size=2 or less" in line and not refused.exists()

  local, remote = tmp_path / "local", tmp_path / "workers"
  # The local reference in this process: what bin/reproduce runs after its flags.
  reproduce.reproduce(tiny_grid().variant(settings={"server_learning_rate": 0.001, "group_size": 2})
                      .capped(2), str(local), progress=False)
  proc = reproduce_tiny(f"--output_dir={remote}", *fixed, "--set=group_size=2", targets)
  assert proc.returncode == 0, proc.stderr[-3000:]
  for row in ("dcco", "fedavg_cco"):
    a, b = (d / "cells" / row / "iid_4" for d in (local, remote))
    _same_run(a, b, ROUND_OFF)
    ours, theirs = (json.loads((d / "results.json").read_text())["evaluations"] for d in (a, b))
    assert sorted(ours) == sorted(theirs)
    for key, value in ours.items():
      assert abs(value - theirs[key]) <= 1 / 200 + 1e-9, (row, key, value, theirs[key])
