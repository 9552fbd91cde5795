"""No TFF worker_binary outlives the program that started it, on any exit path."""

import contextlib
import os
import signal as signal_lib
import subprocess
import sys
import textwrap
import time
from unittest import mock

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
    from tff_ssl import runtime  # Importing tff_ssl is the whole clean-up: no install() call.

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
                        capture_output=True, text=True, timeout=600, check=False)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("worker ")]
  assert lines, proc.stderr[-2000:]
  assert proc.returncode == code, proc.stderr[-2000:]
  pid = int(lines[0].split()[1])
  deadline = time.time() + 10
  while _alive(pid) and time.time() < deadline:
    time.sleep(0.1)
  assert not _alive(pid)


USER_SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    sys.path.insert(0, {root!r})
    import numpy as np
    import tensorflow as tf
    import tensorflow_federated as tff
    import tff_ssl
    from tff_ssl import models, runtime
    from tff_ssl.federated import common, functional
    from tff_ssl.methods import dcco

    shape = (8, 8, 1)
    def build():
      enc = models.build_encoder("resnet14", shape, width=0.25)
      x = tf.keras.Input(shape)
      return tf.keras.Model(x, models.build_mlp_head(enc.output_shape[-1], [8, 8])(enc(x)))
    model = functional.FunctionalModel(build)
    process = dcco.DCCOProcess(model, shape, tff.learning.optimizers.build_sgdm(1e-3))
    images = np.random.default_rng(0).integers(0, 256, (4,) + shape, dtype=np.uint8)
    clients = [common.client_inputs(images[i:i + 2], np.arange(i, i + 2)) for i in (0, 2)]
    state, metrics = process.next(process.initialize(), clients)
    print("round 1 loss", metrics["loss"], flush=True)
    print("worker", runtime.worker_processes()[0].pid, flush=True)
""")


def test_user_script_importing_tff_ssl_leaves_no_worker(tmp_path):
  """A user's own script (not bin/): import tff_ssl, run one DCCO round, exit -- through a pipe."""
  script = tmp_path / "my_script.py"
  script.write_text(USER_SCRIPT.format(root=ROOT))
  # `python my_script.py | cat`: the shell returns only when every holder of the pipe has exited.
  proc = subprocess.run(f"{sys.executable} {script} | cat", shell=True, capture_output=True,
                        text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = [l for l in proc.stdout.splitlines() if l.startswith("worker ")]
  assert lines and "round 1 loss" in proc.stdout, proc.stdout + proc.stderr[-3000:]
  pid = int(lines[0].split()[1])
  deadline = time.time() + 10
  while _alive(pid) and time.time() < deadline:
    time.sleep(0.1)
  assert not _alive(pid)
  assert "Exception ignored" not in proc.stderr, proc.stderr[-3000:]


def test_stop_workers_in_this_process_is_idempotent_and_tff_starts_a_new_worker():
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def mean(x):
    return tff.federated_mean(x)

  runtime.install()
  runtime.install()
  assert float(mean([1.0, 2.0, 6.0])) == 3.0
  first = [w.pid for w in runtime.worker_processes()]
  assert first
  # TFF's worker start is polled at 50 ms, with gRPC's first reconnect after 100 ms (not 1 s each).
  # pylint: disable=g-import-not-at-top,protected-access
  from tensorflow_federated.python.core.impl.executor_stacks import executor_factory
  assert executor_factory._LOCALHOST_SERVER_WAIT_TIME_SEC == 0.05
  assert ("grpc.initial_reconnect_backoff_ms", 100) in executor_factory._GRPC_CHANNEL_OPTIONS
  # pylint: enable=g-import-not-at-top,protected-access
  # The context's ServiceManager was recorded as TFF made its factory (what stop_workers resets).
  managers = runtime._service_managers()  # pylint: disable=protected-access
  assert any(m._process is not None and m._process.pid in first for m in managers), managers
  assert runtime.stop_workers() == len(first)
  assert all(m._process is None for m in managers)
  assert runtime.worker_processes() == []
  assert runtime.stop_workers() == 0
  # Later computations in this process (other tests of this pytest worker) still run.
  assert float(mean([1.0, 3.0])) == 2.0
  assert [w.pid for w in runtime.worker_processes()] != first


def test_keep_unchanged_keeps_the_context_and_worker_only_while_both_still_hold():
  """configure_context(keep_unchanged=True), bin/train's call: the context installed last, with the
  same options and a live worker, is kept (its worker pid too); other options, a dead worker, or a
  call without it install a fresh one."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl  # pylint: disable=g-import-not-at-top

  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def mean(x):
    return tff.federated_mean(x)

  def current():
    return context_stack_impl.context_stack.current

  try:
    runtime.configure_context(static_graph_optimization=False)
    first = current()
    assert float(mean([1.0, 2.0, 6.0])) == 3.0
    pids = [w.pid for w in runtime.worker_processes()]
    assert len(pids) == 1
    runtime.configure_context(static_graph_optimization=False, keep_unchanged=True)
    assert current() is first and [w.pid for w in runtime.worker_processes()] == pids
    runtime.configure_context(max_concurrent_slots=1, keep_unchanged=True)  # Other options.
    assert current() is not first and runtime.worker_processes() == []
    runtime.configure_context(max_concurrent_slots=0)
    second = current()
    assert float(mean([1.0, 3.0])) == 2.0
    worker = runtime.worker_processes()[0]
    worker.kill()
    worker.wait(10)
    runtime.configure_context(keep_unchanged=True)  # Its worker is gone: a fresh context.
    assert current() is not second and float(mean([2.0, 4.0])) == 3.0
    third = current()
    runtime.configure_context()  # Without keep_unchanged: always fresh (tests/conftest.py's recycling).
    assert current() is not third
  finally:
    runtime.configure_context(max_concurrent_slots=0, static_graph_optimization=False)


def test_slot_concurrency_limit_rejects_negative_values():
  with pytest.raises(ValueError, match="must be >= 0"):
    runtime.limit_concurrent_slots(-1)


def test_tff_stopping_a_worker_that_ignores_sigint_does_not_hang():
  """TFF stops its worker with SIGINT and an unbounded wait(); a worker that does not exit on SIGINT
  (a gRPC server with an open call) hung a test process there. The worker's Popen bounds it."""
  child = runtime._PopenWithParentDeath(  # pylint: disable=protected-access
      [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
       "print('ready', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
  assert child.stdout.readline().strip() == "ready"
  start = time.time()
  os.kill(child.pid, signal_lib.SIGINT)  # What TFF's ServiceManager does ...
  assert child.wait() == -signal_lib.SIGKILL  # ... then wait(): killed after the grace period.
  assert time.time() - start < runtime._STOP_GRACE_SECONDS + 5  # pylint: disable=protected-access


def test_context_without_the_static_grappler_pass_computes_the_same(monkeypatch):
  """configure_context(static_graph_optimization=False) compiles without TFF's Grappler pass (the
  test session's setting) and gives what TFF's own compiler gives; True restores TFF's compiler."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.environments.tensorflow_backend import (  # pylint: disable=g-import-not-at-top
      compiled_computation_transformations as transformations)

  def run(values):
    @tff.tensorflow.computation(tff.TensorType(np.float32, [3]))
    def energy(x):
      return tf.reduce_sum(tf.square(x)) / 3.0

    @tff.federated_computation(tff.FederatedType(tff.TensorType(np.float32, [3]), tff.CLIENTS))
    def mean_energy(x):
      return tff.federated_mean(tff.federated_map(energy, x))

    return float(mean_energy(values))

  values = [np.array([1.0, 2.0, 3.0], np.float32), np.array([0.5, -1.0, 4.0], np.float32)]
  optimized = []
  real = transformations.optimize_tensorflow_graphs
  monkeypatch.setattr(transformations, "optimize_tensorflow_graphs",
                      lambda *a, **k: optimized.append(1) or real(*a, **k))
  try:
    runtime.configure_context(static_graph_optimization=False)
    plain = run(values)
    assert not optimized
    runtime.configure_context(static_graph_optimization=True)
    assert run(values) == pytest.approx(plain, rel=1e-6) and optimized
  finally:
    runtime.configure_context(static_graph_optimization=False)  # The session's setting.
  assert plain == pytest.approx((14 / 3 + 17.25 / 3) / 2, rel=1e-6)


SWALLOWED = textwrap.dedent("""
    import gc, os, signal, sys
    sys.path.insert(0, {root!r})
    from tff_ssl import cli  # Importing tff_ssl installs the handlers.

    def ctrl_c_inside_a_gc_callback(phase, info):  # Where jax's callback met the CI run's Ctrl-C.
      if phase == "start":
        gc.callbacks.remove(ctrl_c_inside_a_gc_callback)
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))  # The handler runs here; Python prints "Exception ignored" and goes on.

    with cli.one_line_errors():
      gc.callbacks.append(ctrl_c_inside_a_gc_callback)
      gc.collect()
      print("ran on", flush=True)
""")


def test_a_ctrl_c_that_python_swallowed_still_ends_the_binary_interrupted():
  proc = subprocess.run([sys.executable, "-c", SWALLOWED.format(root=ROOT)], capture_output=True,
                        text=True, timeout=60, start_new_session=True,
                        preexec_fn=lambda: signal_lib.signal(signal_lib.SIGINT, signal_lib.SIG_DFL))
  assert "Exception ignored" in proc.stderr and "ran on" in proc.stdout, proc.stderr
  assert proc.returncode == 130, proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith("interrupted;"), proc.stderr


def test_a_swallowed_interrupt_stops_the_rounds_before_the_next_one():
  """run_rounds raises it between rounds, and forgets it once raised: the next run starts afresh."""
  from tff_ssl import runner  # pylint: disable=g-import-not-at-top

  class State:
    def __init__(self, round_num):
      self.round_num = round_num

  class Process:
    def next(self, state, clients, **_):
      if state.round_num == 0:
        try:  # Ctrl-C's handler raising where the exception is dropped, as in a gc callback.
          runtime._interrupt_on_signal(signal_lib.SIGINT, None)  # pylint: disable=protected-access
        except KeyboardInterrupt:
          pass
      return State(state.round_num + 1), {"loss": 0.0}

  seen = []

  class Rounds(runner.observers_lib.Observer):
    def after_round(self, round_num, state, metrics, released):
      seen.append(round_num)

  run = lambda start, rounds: runner.run_rounds(  # noqa: E731
      Process(), State(start), rounds, lambda r: ([], []), None, [Rounds()],
      lambda r: contextlib.nullcontext())
  with pytest.raises(KeyboardInterrupt):
    run(0, 5)
  assert seen == [0]
  assert run(1, 3).round_num == 3 and seen == [0, 1, 2]


def test_the_suite_records_no_stack_per_graph_op_and_a_run_without_the_variable_does():
  """tests/conftest.py turns TF's per-op stack off (OP_TRACEBACKS_ENV): an op's error then names
  `_op_tracebacks_are_off` as where it was defined; a process without the variable keeps TF's."""
  import types  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.python.framework import ops  # pylint: disable=g-import-not-at-top
  from tensorflow.python.util import tf_stack  # pylint: disable=g-import-not-at-top

  if os.environ[runtime.OP_TRACEBACKS_ENV] != "0":
    pytest.skip(f"{runtime.OP_TRACEBACKS_ENV} set to keep TF's stacks in this session")
  assert isinstance(ops.tf_stack, runtime._FixedStack)  # pylint: disable=protected-access

  @tf.function
  def checked(x):
    return tf.debugging.check_numerics(x / 0.0, "not finite")

  with pytest.raises(tf.errors.InvalidArgumentError, match="_op_tracebacks_are_off"):
    checked(tf.constant(0.0))
  fake = types.SimpleNamespace(tf_stack=tf_stack)
  with mock.patch.dict(os.environ, {runtime.OP_TRACEBACKS_ENV: "1"}):
    runtime._patch_ops(fake)  # pylint: disable=protected-access
  assert fake.tf_stack is tf_stack
  with mock.patch.dict(os.environ, {runtime.OP_TRACEBACKS_ENV: "0"}):
    runtime._patch_ops(fake)  # pylint: disable=protected-access
  assert isinstance(fake.tf_stack, runtime._FixedStack)  # pylint: disable=protected-access
