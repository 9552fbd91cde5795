"""Faults and bad input a user meets: each ends in one line on stderr and a documented exit status
(tff_ssl/cli.py: 2 error, 130 interrupted), never a traceback, leaves no worker process behind, and
loses no work: rerunning the same command resumes.

What needs a process of its own (Ctrl-C, a lock another process holds) runs bin/train; the rest runs its main() in the test process (`train_in_process`: the
same code from flag parsing on, ~6 s less a run), the runs a test compares with each other always in
the same kind of process."""

import gzip
import json
import os
import signal
import struct
import subprocess
import sys
import time

import psutil
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests.bin import binaries
from tff_ssl import cli, rundir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "bin", "train")
TINY = ["--task=synthetic_dcco_smoke", "--rounds=3", "--eval_steps=10", "--checkpoint_every=1"]


def train(out, *args, timeout=900, env=None):
  """bin/train in a process of its own."""
  return subprocess.run([sys.executable, TRAIN, f"--output_dir={out}", *TINY, *args],
                        capture_output=True, text=True, timeout=timeout, check=False, env=env)


def train_here(out, *args):
  """bin/train's main() in this process."""
  return binaries.train_in_process(f"--output_dir={out}", *TINY, *args)


def one_line(proc, status=cli.EXIT_ERROR):
  assert proc.returncode == status, proc.stderr[-3000:]
  assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr, proc.stderr
  return proc.stderr.strip()


def test_output_dir_that_is_a_file_or_cannot_be_created(tmp_path):
  a_file = tmp_path / "notes.txt"
  a_file.write_text("keep me")
  line = one_line(train_here(a_file))
  assert f"--output_dir {a_file} is an existing file" in line
  assert a_file.read_text() == "keep me"
  line = one_line(train_here(a_file / "run"))
  assert f"{a_file} is a file, not a folder" in line
  line = one_line(train_here("/proc/tff_ssl_run"))
  assert "cannot create --output_dir /proc/tff_ssl_run" in line


def _idx_gz(path, array_shape, keep_bytes=None):
  n = 1
  for d in array_shape:
    n *= d
  raw = struct.pack(">HBB", 0, 8, len(array_shape)) + struct.pack(
      ">" + "I" * len(array_shape), *array_shape) + bytes(n)
  data = gzip.compress(raw)
  path.write_bytes(data[:keep_bytes] if keep_bytes else data)


def test_truncated_fashion_mnist_file_is_a_data_error_naming_it(tmp_path, monkeypatch):
  data = tmp_path / "fmnist"
  data.mkdir()
  _idx_gz(data / "train-images-idx3-ubyte.gz", (60000, 28, 28), keep_bytes=200)
  _idx_gz(data / "train-labels-idx1-ubyte.gz", (60000,))
  _idx_gz(data / "t10k-images-idx3-ubyte.gz", (10000, 28, 28))
  _idx_gz(data / "t10k-labels-idx1-ubyte.gz", (10000,))
  out = tmp_path / "run"
  monkeypatch.setenv("TFF_SSL_FASHION_MNIST_DIR", str(data))
  proc = binaries.train_in_process(f"--output_dir={out}", "--task=synthetic_smoke",
                                   "--dataset=fashion_mnist")
  line = one_line(proc)
  assert f"{data / 'train-images-idx3-ubyte.gz'} cannot be read (EOFError" in line
  assert "reinstall it" in line and not out.exists()


def test_loss_becoming_nan_names_the_round_and_keeps_the_last_checkpoint(tmp_path):
  out = tmp_path / "run"
  line = one_line(train_here(out, "--server_learning_rate=1e30", "--rounds=6"))
  assert line.startswith("error: round ") and "loss became nan" in line, line
  assert "lower --server_learning_rate (now 1e+30)" in line and "is kept" in line
  assert not (out / "results.json").exists()
  assert os.listdir(out / "checkpoints")


def test_newest_checkpoint_cut_short_resumes_from_the_one_before(tmp_path):
  out = tmp_path / "run"
  proc = train_here(out)
  assert proc.returncode == 0, proc.stderr[-3000:]
  finished = json.loads((out / "results.json").read_text())
  metrics = (out / "metrics.csv").read_text()
  # What a crash (or a full disk) while writing round 3's checkpoint leaves: a cut-short file.
  (out / "results.json").unlink()
  newest = out / "checkpoints" / "program_state_3"
  # The one before it that the manager keeps (tff.program keeps the first and the newest).
  before = max(int(p.name.rsplit("_", 1)[1]) for p in (out / "checkpoints").iterdir()
               if p.name != newest.name)
  for root, _, files in os.walk(newest):
    for name in files:
      path = os.path.join(root, name)
      if os.path.getsize(path) > 16:
        with open(path, "r+b") as f:
          f.truncate(os.path.getsize(path) // 3)
  proc = train_here(out)
  assert proc.returncode == 0, proc.stderr[-3000:]
  warnings = [l for l in proc.stderr.splitlines() if l.startswith("warning: checkpoint")]
  assert warnings == [warnings[0]] and "round 3 does not read back" in warnings[0], proc.stderr
  assert f"resuming from the checkpoint of round {before}" in warnings[0]
  assert (out / "checkpoints" / "unreadable_program_state_3").is_dir()
  assert (out / "metrics.csv").read_text() == metrics
  again = json.loads((out / "results.json").read_text())
  for key in ("final_loss", "linear_probe_accuracy_pretrained"):
    assert again[key] == finished[key], key


def test_no_checkpoint_reads_back_is_an_error_not_a_fresh_start(tmp_path):
  out = tmp_path / "run"
  proc = train_here(out, "--rounds=1")
  assert proc.returncode == 0, proc.stderr[-3000:]
  (out / "results.json").unlink()
  variables = out / "checkpoints" / "program_state_1" / "variables"
  for f in variables.iterdir():
    f.write_bytes(b"not a checkpoint")
  line = one_line(train_here(out, "--rounds=1"))
  assert "no checkpoint in" in line and "reads back (round 1" in line
  assert (out / "checkpoints" / "program_state_1").is_dir()


def test_run_folder_of_another_version_is_refused(tmp_path):
  out = tmp_path / "run"
  proc = train_here(out, "--rounds=1")
  assert proc.returncode == 0, proc.stderr[-3000:]
  (out / "results.json").unlink()
  hparams = json.loads((out / "hparams.json").read_text())
  hparams["old_field"] = 1
  (out / "hparams.json").write_text(json.dumps(hparams))
  line = one_line(train_here(out, "--rounds=1"))
  assert "written by another version of tff-ssl" in line
  assert "lacks nothing and has ['old_field'] more" in line
  # A field added since the run was written reads as its default: missing where the flags set
  # another value, the same run where they do not.
  del hparams["old_field"], hparams["group_size"]
  (out / "hparams.json").write_text(json.dumps(hparams))
  line = one_line(train_here(out, "--rounds=1", "--group_size=3"))
  assert "lacks ['group_size'] and has nothing more" in line
  proc = train_here(out, "--rounds=1")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert json.loads((out / "hparams.json").read_text())["group_size"] == 0  # Written back whole.


def _snapshot(folder):
  """Every file under `folder`, its bytes and modification time; not the lock, which records the
  process that last held the folder (taken before hparams.json is read: a run may be writing it)."""
  return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
          for p in sorted(folder.rglob("*")) if p.is_file() and p.name != rundir.LOCK_FILE}


def test_a_corrupt_hparams_json_is_named_as_such_and_nothing_changes(tmp_path):
  out = tmp_path / "run"
  proc = train_here(out, "--rounds=1")
  assert proc.returncode == 0, proc.stderr[-3000:]
  (out / "results.json").unlink()  # Interrupted while evaluating: a rerun would resume it.
  good = json.loads((out / "hparams.json").read_text())
  for corrupt, what in [
      (b'{"method": "dcco", "rounds": ', "is not valid JSON (Expecting value at line 1)"),
      (b"", "is not valid JSON (Expecting value at line 1)"),
      (b"[1, 2]", "holds a JSON list, not a config's fields"),
      (b"\x89PNG\r\n\x1a\n\x00\xff", "is not text (not UTF-8)"),
      (json.dumps({**good, "rounds": -3}).encode(),
       "holds a value no run can have (rounds must be >= 1")]:
    (out / "hparams.json").write_bytes(corrupt)
    before = _snapshot(out)
    line = one_line(train_here(out, "--rounds=1"))
    assert line.startswith(f"error: {out / 'hparams.json'} {what}"), line
    assert line.endswith(f"the run in {out} cannot be resumed or read without it: delete the "
                         f"folder, or choose another --output_dir"), line
    after = _snapshot(out)
    assert after == before, [k for k in set(after) | set(before) if after.get(k) != before.get(k)]


def test_a_corrupt_hparams_json_ends_bin_train_with_exit_status_2(tmp_path):
  out = tmp_path / "run"
  out.mkdir()
  (out / "hparams.json").write_text('{"method": "dcco",')
  line = one_line(train(out, timeout=300))
  assert line.startswith(f"error: {out / 'hparams.json'} is not valid JSON"), line
  assert sorted(p.name for p in out.iterdir()) == sorted(["hparams.json", rundir.LOCK_FILE])
  assert (out / "hparams.json").read_text() == '{"method": "dcco",'


def _workers_of(pid):
  return [p for p in psutil.Process(pid).children(recursive=True)
          if "worker_binary" in " ".join(p.cmdline())]


def test_a_second_run_on_a_folder_in_use_is_refused(tmp_path):
  out = tmp_path / "run"
  out.mkdir()
  with rundir.session():
    rundir.lock(str(out))  # This process is the run in progress.
    line = one_line(train(out, timeout=600))
  assert f"--output_dir {out} is in use by another run (process {os.getpid()})" in line
  assert sorted(p.name for p in out.iterdir()) == [rundir.LOCK_FILE]
  # Released with the session (and by the kernel at exit): this process can lock it again.
  proc = train_here(out, "--rounds=1")
  assert proc.returncode == 0, proc.stderr[-3000:]


def test_ctrl_c_stops_cleanly_without_orphan_and_the_rerun_resumes(tmp_path):
  out = tmp_path / "run"
  args = [sys.executable, TRAIN, f"--output_dir={out}", *TINY, "--rounds=40"]
  # A new session: Ctrl-C in a terminal signals the whole foreground process group.
  # SIGINT at its default, as in a terminal: CI starts the suite in the background, where the shell
  # ignores SIGINT, and a program inherits that (and rightly keeps ignoring Ctrl-C).
  first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  try:
    deadline = time.time() + 240
    while not (out / "checkpoints" / "program_state_1").exists():
      assert first.poll() is None and time.time() < deadline, first.stderr.read()[-3000:]
      time.sleep(0.05)
    workers = _workers_of(first.pid)
    assert workers
    os.killpg(first.pid, signal.SIGINT)
    _, stderr = first.communicate(timeout=300)
  finally:
    if first.poll() is None:
      first.kill()
  assert first.returncode == cli.EXIT_INTERRUPTED, stderr[-3000:]
  lines = [l for l in stderr.splitlines() if l.strip()]
  assert lines == ["interrupted; rerun the same command to resume from the last checkpoint"], stderr
  time.sleep(0.5)
  assert not [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
  assert not (out / "results.json").exists()
  assert os.listdir(out / "checkpoints")

  proc = train_here(out, "--rounds=40")  # Resumes: the lock went with the process.
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert len((out / "metrics.csv").read_text().splitlines()) == 41


def test_disk_full_while_writing_metrics_is_one_line_and_resumable(tmp_path, monkeypatch):
  out = tmp_path / "run"
  real = tff.program.CSVFileReleaseManager.release

  async def full_disk(self, value, key=None):
    if key == 1:
      raise tf.errors.ResourceExhaustedError(None, None, "metrics.csv_temp1234; No space left on "
                                             "device\n\tsecond line")
    return await real(self, value, key=key)

  monkeypatch.setattr(tff.program.CSVFileReleaseManager, "release", full_disk)
  proc = train_here(out)
  assert proc.returncode == cli.EXIT_ERROR, proc.stderr[-3000:]
  err = proc.stderr
  # In-process: other tests' TensorFlow may log to the same stderr; the binary's own line is this.
  assert "Traceback" not in err, err
  assert [l for l in err.splitlines() if l.startswith("error")] == [("error: ResourceExhaustedError: metrics.csv_temp1234; No space left on device; fix "
                 "that (free disk space, ...) and rerun the same command to resume from the last "
                 "checkpoint")], err
  assert not (out / "results.json").exists()

  monkeypatch.setattr(tff.program.CSVFileReleaseManager, "release", real)  # Space freed.
  proc = train_here(out)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = (out / "metrics.csv").read_text().splitlines()
  assert [r.split(",")[0] for r in rows[1:]] == ["0", "1", "2"]
