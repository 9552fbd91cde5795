"""No TFF worker_binary outlives the program that started it, on any exit path."""

import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tff_ssl import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = textwrap.dedent("""
    import os, signal, sys, time
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    sys.path.insert(0, {root!r})
    import numpy as np
    import tensorflow_federated as tff
    from tff_ssl import runtime
    runtime.install()

    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def mean(x):
      return tff.federated_mean(x)

    assert float(mean([1.0, 2.0, 6.0])) == 3.0
    print("worker", runtime.worker_processes()[0].pid, flush=True)
    how = sys.argv[1]
    if how == "raise":
      raise RuntimeError("boom")
    if how in ("SIGTERM", "SIGKILL"):
      os.kill(os.getpid(), getattr(signal, how))
      time.sleep(30)
""")


def _alive(pid):
  try:
    return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return False


@pytest.mark.parametrize("how,code", [("exit", 0), ("raise", 1), ("SIGTERM", 128 + 15),
                                      ("SIGKILL", -9)])
def test_worker_is_stopped_on_every_exit_path(how, code):
  # Reading the output through a pipe is the point: an orphan holding it open would hang here.
  proc = subprocess.run([sys.executable, "-c", PROGRAM.format(root=ROOT), how],
                        capture_output=True, text=True, timeout=120, check=False)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("worker ")]
  assert lines, proc.stderr[-2000:]
  assert proc.returncode == code, proc.stderr[-2000:]
  pid = int(lines[0].split()[1])
  deadline = time.time() + 10
  while _alive(pid) and time.time() < deadline:
    time.sleep(0.1)
  assert not _alive(pid)


def test_stop_workers_in_this_process_is_idempotent():
  runtime.install()
  runtime.install()
  runtime.stop_workers()
  assert runtime.worker_processes() == []


def test_slot_concurrency_limit_rejects_negative_values():
  with pytest.raises(ValueError, match="must be >= 0"):
    runtime.limit_concurrent_slots(-1)
