"""Process hygiene for TensorFlow Federated: no `worker_binary` outlives the program that started it.

TFF 0.87's local C++ execution context starts its executor service (`worker_binary`) as a child process
and relies on `ServiceManager.__del__` to stop it, which fails at interpreter shutdown. The orphan keeps
the parent's stdout open, so `program | tail` or a CI log reader waits forever. `install()` closes every
exit path:

  * normal exit, exceptions, SystemExit, KeyboardInterrupt: an `atexit` hook stops the workers
    (a worker runs in its own process group, so Ctrl-C interrupts the program, not the worker);
  * SIGTERM / SIGHUP: turned into SystemExit, so the `atexit` hook runs;
  * a Ctrl-C or SIGTERM whose exception Python dropped (raised inside a gc callback, which jax
    registers, or a `__del__`: "Exception ignored in ..."): the signal is recorded, and
    `raise_if_interrupted()`, called between rounds and steps and when a binary ends, raises it again;
  * SIGKILL (nothing in-process runs): each worker is started with the Linux parent-death signal set,
    so the kernel stops it when its parent dies.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.abc
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from typing import Any, Sequence

import psutil

_WORKER_NAME = "worker_binary"
_PR_SET_PDEATHSIG = 1
_installed = False
_lock = threading.Lock()


def _set_parent_death_signal() -> None:  # Runs in the child between fork and exec.
  # Its own process group: Ctrl-C in a terminal (SIGINT to the foreground group) reaches only the
  # Python program, which stops cleanly and then stops the worker, instead of the worker dying
  # mid-call under it.
  os.setpgrp()
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  except Exception:  # pylint: disable=broad-except
    pass  # Not Linux: the atexit hook still covers every exit path but SIGKILL.


_STOP_GRACE_SECONDS = 5.0


class _PopenWithParentDeath(subprocess.Popen):
  """subprocess.Popen whose child dies with its parent (used for TFF's worker only).

  `wait()` without a timeout is bounded: TFF stops a worker with SIGINT and an unbounded `wait()`
  (when its execution context is replaced, or its service looks down), and a worker whose gRPC
  server still holds an open call does not exit on SIGINT: that `wait()` hung a test process. After
  `_STOP_GRACE_SECONDS` the worker is killed.
  """

  def __init__(self, args, **kwargs):
    if sys.platform.startswith("linux") and "preexec_fn" not in kwargs:
      kwargs["preexec_fn"] = _set_parent_death_signal
    super().__init__(args, **kwargs)

  def wait(self, timeout=None):
    if timeout is not None:
      return super().wait(timeout)
    try:
      return super().wait(_STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
      self.kill()
      return super().wait()


class _LocalWorkerPopen(_PopenWithParentDeath):
  """A worker TFF's local context starts: remembered, so that `stop_workers` stops those and only
  those (not executor services the program started itself, such as bin/worker processes)."""

  def __init__(self, args, **kwargs):
    super().__init__(args, **kwargs)
    _local_pids.add(self.pid)


_local_pids: set[int] = set()


class _SubprocessShim:
  """Stands in for the `subprocess` module inside TFF's executor factory; only Popen differs."""

  Popen = _LocalWorkerPopen

  def __getattr__(self, name):
    return getattr(subprocess, name)


def worker_processes(parent: psutil.Process | None = None) -> list[psutil.Process]:
  """TFF worker processes among the descendants of `parent` (default: this process)."""
  parent = parent or psutil.Process()
  found = []
  for child in parent.children(recursive=True):
    try:
      if _WORKER_NAME in child.name() or any(_WORKER_NAME in a for a in child.cmdline()[:1]):
        found.append(child)
    except psutil.Error:
      continue
  return found


def resident_memory_mb() -> tuple[float, float]:
  """Current resident memory (MB) of this process and of its TFF worker processes together."""
  own = psutil.Process().memory_info().rss / 2**20
  workers = 0.0
  for w in worker_processes():
    try:
      workers += w.memory_info().rss / 2**20
    except psutil.Error:
      continue
  return own, workers


# TFF's local `ServiceManager`s (the objects that own the workers), each recorded as its executor
# factory is made (`_patch_factory`). A scan of `gc.get_objects()` found them too, at 0.3-1.5 s a
# call in a test process holding many graphs (68 s of one suite run in one test file's fixture).
_managers: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _service_managers() -> list:
  """TFF's local `ServiceManager`s alive in this process."""
  return list(_managers)


def stop_workers(timeout: float = 5.0) -> int:
  """Stops every TFF worker this process started for its local contexts; returns how many were
  running (the services of `serve_local_workers` are left to it, executor services the program
  started itself, such as bin/worker processes, to the program).

  TFF's service managers forget the stopped workers, so the next computation starts a fresh one (a
  manager that still held one would `os.kill` its reaped pid and fail)."""
  for manager in _service_managers():
    manager._stub, manager._process = None, None  # pylint: disable=protected-access
  local = [w for w in worker_processes() if w.pid in _local_pids]
  _local_pids.clear()  # Those not found have ended already (e.g. killed): none is left to watch.
  return _terminate(local, timeout)




@contextlib.contextmanager
def serve_local_workers(count: int, *, start_timeout: float = 60.0):
  """Starts `count` TFF executor services (what bin/worker runs) on free loopback ports, yields their
  `localhost:port` targets, and stops them on exit. Each dies with this process (parent-death signal)
  and sits in its own process group, like the local context's worker."""
  import portpicker  # pylint: disable=g-import-not-at-top
  if count < 1:
    raise ValueError(f"serve_local_workers needs count >= 1; got {count}")
  procs, targets = [], []
  try:
    for _ in range(count):
      port = portpicker.pick_unused_port()
      proc = _PopenWithParentDeath(
          [worker_binary_path(), f"--port={port}", "--max_concurrent_computation_calls=-1"],
          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
      procs.append(proc)
      targets.append(f"localhost:{port}")
    deadline = time.monotonic() + start_timeout
    for proc, target in zip(procs, targets):
      while workers_down([target], timeout=1.0):
        if proc.poll() is not None or time.monotonic() > deadline:
          raise WorkerUnavailableError(f"the local worker for {target} did not start "
                                       f"(exit status {proc.poll()}); run bin/worker "
                                       f"--port={target.rpartition(':')[2]} to see why")
    yield targets
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.terminate()
    for proc in procs:
      proc.wait()


def _terminate(workers: list[psutil.Process], timeout: float = 5.0) -> int:
  for w in workers:
    try:
      w.terminate()
    except psutil.Error:
      pass
  _, alive = psutil.wait_procs(workers, timeout=timeout)
  for w in alive:
    try:
      w.kill()
    except psutil.Error:
      pass
  return len(workers)


def limit_concurrent_slots(limit: int) -> None:
  """Runs at most `limit` TFF client slots of a computation at once (0: no limit, TFF's default).

  With the grouped simulation, a slot's working memory is its group's activations; running the slots
  of a round one after another (`limit=1`, with `group_size` dividing the round) bounds the worker's
  memory by one group's instead of the round's. Installs a fresh local C++ execution context (TFF's
  own, with its `max_concurrent_computation_calls`); call before the first computation runs.
  """
  configure_context(max_concurrent_slots=limit)


# The environment variable TFF_SSL_STATIC_GRAPH_OPTIMIZATION=0 turns TFF's static Grappler pass off
# in every context configured here (bin/train, bin/reproduce and any subprocess of theirs): the test
# session sets it for the binaries it runs (tests/conftest.py). Real runs leave it unset.
STATIC_GRAPH_OPTIMIZATION_ENV = "TFF_SSL_STATIC_GRAPH_OPTIMIZATION"
_context_options = {"max_concurrent_slots": 0,
                    "static_graph_optimization": os.environ.get(STATIC_GRAPH_OPTIMIZATION_ENV,
                                                                "1") != "0"}


def worker_binary_path() -> str:
  """TFF's executor service (`worker_binary`, shipped in the TFF wheel)."""
  import tensorflow_federated  # pylint: disable=g-import-not-at-top
  return os.path.join(os.path.dirname(tensorflow_federated.__file__), "data", _WORKER_NAME)


def parse_workers(text: str | Sequence[str]) -> list[str]:
  """`host:port` targets from "host1:port,host2:port" (or a list); ValueError names a bad one."""
  items = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
  for target in items:
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
      raise ValueError(f"--workers: {target!r} is not host:port (e.g. localhost:8000); start a "
                       f"worker with bin/worker --port=8000")
  if len(set(items)) != len(items):
    raise ValueError(f"--workers names a worker twice: {','.join(items)}")
  return items


def check_port_free(port: int) -> None:
  """Raises ValueError if TCP `port` is taken on this machine (a worker already serves there?)."""
  import socket  # pylint: disable=g-import-not-at-top
  with socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET) as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # As gRPC: TIME_WAIT is no conflict.
    try:
      s.bind(("", port))
    except OSError as e:
      raise ValueError(f"--port={port} is in use ({e.strerror}); stop what serves there or choose "
                       f"another port") from None


class WorkerUnavailableError(ValueError):
  """A remote TFF worker cannot be reached (it is not started, or it died)."""


_WORKER_CONNECT_SECONDS = 10.0


_REFUSED_GRACE_SECONDS = 3.0  # A bin/worker started with the run may not listen yet.


def _refuses_connections(target: str) -> bool:
  """Whether `target`'s host refuses TCP connections to its port (nothing listens there) for
  `_REFUSED_GRACE_SECONDS`. A host that does not answer at all, or a name that does not resolve, is
  left to gRPC's wait."""
  host, _, port = target.rpartition(":")
  deadline = time.monotonic() + _REFUSED_GRACE_SECONDS
  while True:
    try:
      with socket.create_connection((host, int(port)), timeout=2.0):
        return False
    except ConnectionRefusedError:
      if time.monotonic() > deadline:
        return True
      time.sleep(0.25)
    except (OSError, ValueError):
      return False


def _remote_factory(target: str):
  """A TFF executor factory on the executor service at `target` (host:port)."""
  # pylint: disable=g-import-not-at-top
  import grpc
  from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
  from tensorflow_federated.python.core.impl.executors import remote_executor
  from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub
  from tensorflow_federated.python.core.impl.types import placements
  # pylint: enable=g-import-not-at-top
  start_it = f"start it there with bin/worker --port={target.rpartition(':')[2]}"
  if _refuses_connections(target):  # Nothing listens there: said at once, not after the wait.
    raise WorkerUnavailableError(f"worker {target} does not answer (nothing listens on its "
                                 f"port); {start_it}")
  channel = grpc.insecure_channel(target, [("grpc.max_send_message_length", 2_000_000_000),
                                           ("grpc.max_receive_message_length", 2_000_000_000)])
  try:
    grpc.channel_ready_future(channel).result(timeout=_WORKER_CONNECT_SECONDS)
  except grpc.FutureTimeoutError:
    channel.close()
    raise WorkerUnavailableError(
        f"worker {target} does not answer (waited {_WORKER_CONNECT_SECONDS:.0f} s); "
        f"{start_it}") from None
  stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(channel)

  def stack_fn(cardinalities):
    if cardinalities.get(placements.CLIENTS) is None:
      cardinalities[placements.CLIENTS] = 0  # As TFF's local factory: no CLIENTS value, no clients.
    executor = remote_executor.RemoteExecutor(stub)
    executor.set_cardinalities(cardinalities)
    return executor

  return python_executor_stacks.ResourceManagingExecutorFactory(executor_stack_fn=stack_fn)


# How long a remote worker may fail to answer before the run stops (TFF's own context retries forever:
# a worker that died would hang the run).
WORKER_RETRY_SECONDS = 20.0


def _worker_context_class():
  """TFF's AsyncExecutionContext on one remote worker, retrying a failed call for at most
  WORKER_RETRY_SECONDS, then raising WorkerUnavailableError naming the worker."""
  import asyncio  # pylint: disable=g-import-not-at-top
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context
  from tensorflow_federated.python.core.impl.executors import executors_errors
  # pylint: enable=g-import-not-at-top
  invoke_once = async_execution_context.AsyncExecutionContext.invoke.__wrapped__

  class WorkerContext(async_execution_context.AsyncExecutionContext):

    def __init__(self, target: str, **kwargs):
      super().__init__(**kwargs)
      self.target = target

    async def invoke(self, comp, arg):
      deadline, wait = time.monotonic() + WORKER_RETRY_SECONDS, 0.25
      while True:
        try:
          return await invoke_once(self, comp, arg)
        except executors_errors.RetryableError:
          if time.monotonic() > deadline:
            raise WorkerUnavailableError(
                f"worker {self.target} stopped answering (retried for "
                f"{WORKER_RETRY_SECONDS:.0f} s)") from None
          await asyncio.sleep(wait)
          wait = min(2 * wait, 4.0)

  return WorkerContext


def configured_workers() -> list[str]:
  """The remote workers the current context runs on ([]: a local worker)."""
  return list(_context_options.get("workers") or [])


def workers_down(targets: Sequence[str], timeout: float = 2.0) -> list[str]:
  """The targets among `targets` whose executor service does not answer within `timeout`."""
  import grpc  # pylint: disable=g-import-not-at-top
  down = []
  for target in targets:
    channel = grpc.insecure_channel(target)
    try:
      grpc.channel_ready_future(channel).result(timeout=timeout)
    except grpc.FutureTimeoutError:
      down.append(target)
    finally:
      channel.close()
  return down


# (the options, the context) configure_context installed last: `keep_unchanged` keeps that context.
_current_context: tuple[dict, Any] | None = None


def _local_workers_alive() -> bool:
  """Whether every TFF worker this process's local contexts started still runs."""
  for pid in _local_pids:
    try:
      if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
        return False
    except psutil.Error:
      return False
  return True


def configure_context(*, max_concurrent_slots: int | None = None,
                      static_graph_optimization: bool | None = None,
                      workers: Sequence[str] | None = None,
                      keep_unchanged: bool = False) -> None:
  """Installs a fresh local C++ execution context with these options (None: keep the current one).

  keep_unchanged: where the context this function installed last is still TFF's, with the same
    options and a local worker that still runs, keep it (its worker and its compiled computations)
    instead of starting afresh: bin/train's main() run again in one process (the test suite, a
    notebook) saves the worker's start and the computations' compilation, ~1 s a run.

  workers: executor services (`host:port`, each started with bin/worker) to run every computation
    across instead of a local worker: TFF's mergeable-computation context splits a computation's
    CLIENTS over them and merges their partial aggregates (a computation may hold one aggregation,
    or several independent ones). An empty list goes back to the local worker.

  static_graph_optimization: TFF's context compiles each computation once, before its first call,
    with a static Grappler pass (function inlining, constant folding, arithmetic and loop
    optimization; the worker itself runs graphs without Grappler). For a full-width ResNet-18 BYOL
    process that pass takes ~40 s on 2 cores. False skips it: a faster start for smoke runs and tests
    of paper-scale configs, at the cost of unoptimized graphs (and results that may differ in float
    round-off). TFF notes the pass's function inlining is needed on GPUs: keep it for real runs.
  """
  if max_concurrent_slots is not None:
    if max_concurrent_slots < 0:
      raise ValueError(f"the slot concurrency limit must be >= 0 (0: no limit); got "
                       f"{max_concurrent_slots}")
    _context_options["max_concurrent_slots"] = max_concurrent_slots
  if static_graph_optimization is not None:
    _context_options["static_graph_optimization"] = bool(static_graph_optimization)
  if workers is not None:
    _context_options["workers"] = parse_workers(workers)
  global _current_context
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
  if (keep_unchanged and _current_context is not None
      and _current_context[0] == _context_options and not _context_options.get("workers")
      and context_stack_impl.context_stack.current is _current_context[1]
      and _local_workers_alive()):
    return
  _current_context = None
  from tensorflow_federated.python.core.backends.native import compiler
  from tensorflow_federated.python.core.environments.tensorflow_frontend import (
      tensorflow_computation)
  from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context
  from tensorflow_federated.python.core.impl.executor_stacks import executor_factory
  # pylint: enable=g-import-not-at-top
  stop_workers()  # The replaced context's workers, before TFF's own (SIGINT + wait) stop runs.
  _quiet_unused_asserts()
  compiler_fn = _lowering_secure_sums(
      compiler.desugar_and_transform_to_native
      if _context_options["static_graph_optimization"] else _compile_without_grappler)
  if _context_options.get("workers"):
    # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.backends.native import mergeable_comp_compiler
    from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context
    from tensorflow_federated.python.core.impl.execution_contexts import (
        mergeable_comp_execution_context)
    # pylint: enable=g-import-not-at-top
    worker_context = _worker_context_class()
    contexts = [worker_context(
        target, executor_fn=_remote_factory(target), compiler_fn=compiler_fn,
        transform_args=tensorflow_computation.transform_args,
        transform_result=tensorflow_computation.transform_result)
                for target in _context_options["workers"]]
    context = mergeable_comp_execution_context.MergeableCompExecutionContext(
        async_contexts=contexts,
        compiler_fn=mergeable_comp_compiler.compile_to_mergeable_comp_form,
        transform_args=tensorflow_computation.transform_args,
        transform_result=tensorflow_computation.transform_result)
    context_stack_impl.context_stack.set_default_context(context)
    return
  limit = _context_options["max_concurrent_slots"]
  factory = executor_factory.local_cpp_executor_factory(
      max_concurrent_computation_calls=limit if limit > 0 else -1)
  context = sync_execution_context.SyncExecutionContext(
      executor_fn=factory,
      compiler_fn=compiler_fn,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result)
  context_stack_impl.context_stack.set_default_context(context)
  _current_context = (dict(_context_options), context)


class _UnusedAssertFilter(logging.Filter):
  """Drops TF's "Object was never used" error: TFF traces its computations in graph mode, where the
  asserts of its secure sum (and of its lowered form) are run by the worker, not by Python: a false
  alarm, printed with a stack per assert."""

  def filter(self, record):
    return "Object was never used" not in record.getMessage()


def _quiet_unused_asserts():
  logger = logging.getLogger("tensorflow")
  if not any(isinstance(f, _UnusedAssertFilter) for f in logger.filters):
    logger.addFilter(_UnusedAssertFilter())


def _lowering_secure_sums(compiler_fn):
  """`compiler_fn` that first lowers TFF's secure-sum intrinsics (`federated_secure_sum_bitwidth`,
  ...) to TFF's own insecure reductions (`tff.backends.test`'s): the local worker binary does not
  implement them, and a simulation computes the same sum (the quantization stays; the crypto
  protocol is not run). Computations without them compile as before."""

  def compile_fn(comp):
    if b"federated_secure" in comp.to_compiled_building_block().proto.SerializeToString():
      # pylint: disable=g-import-not-at-top
      from tensorflow_federated.python.core.backends.test import compiler as test_compiler
      comp = test_compiler.replace_secure_intrinsics_with_bodies(comp)
    return compiler_fn(comp)

  return compile_fn


def _compile_without_grappler(comp):
  """TFF's `desugar_and_transform_to_native` without its static Grappler pass."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.backends.native import compiler
  from tensorflow_federated.python.core.environments.tensorflow_backend import (
      tensorflow_tree_transformations)
  from tensorflow_federated.python.core.impl.computation import computation_impl
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
  # pylint: enable=g-import-not-at-top
  desugared, _ = tensorflow_tree_transformations.replace_intrinsics_with_bodies(
      comp.to_building_block())
  return compiler.transform_to_native_form(
      computation_impl.ConcreteComputation(computation_proto=desugared.proto,
                                           context_stack=context_stack_impl.context_stack),
      grappler_config=None)


def _at_exit() -> None:
  # Stops the workers without touching TFF's managers: dropping their gRPC stubs while the
  # interpreter shuts down is what gRPC does not survive.
  _terminate(worker_processes())
  # TFF's ServiceManager.__del__ would try to stop the (stopped) worker while the interpreter tears
  # modules down, and print a traceback to stderr; its workers are ours to stop.
  for manager in _service_managers():
    type(manager).__del__ = lambda self: None


# The last SIGINT / SIGTERM / SIGHUP received and not yet acted on (None: none).
_pending_signal = [None]


def _exit_on_signal(signum, frame):  # pylint: disable=unused-argument
  _pending_signal[0] = signum
  raise SystemExit(128 + signum)


def _interrupt_on_signal(signum, frame):
  _pending_signal[0] = signum
  signal.default_int_handler(signum, frame)  # KeyboardInterrupt, as without this handler.


def raise_if_interrupted() -> None:
  """Raises the interruption a signal handler raised where Python drops exceptions: the program
  then runs on as if no Ctrl-C (KeyboardInterrupt) or SIGTERM / SIGHUP (SystemExit) had come. A
  CI run met it: jax's gc callback swallowed Ctrl-C's KeyboardInterrupt and the run went on to its
  end with exit status 0."""
  signum, _pending_signal[0] = _pending_signal[0], None
  if signum == signal.SIGINT:
    raise KeyboardInterrupt(f"signal {signum}")
  if signum is not None:
    raise SystemExit(128 + signum)


def interruption_handled() -> None:
  """Forgets the pending signal: its exception reached the code that handles it."""
  _pending_signal[0] = None


_FACTORY_MODULE = "tensorflow_federated.python.core.impl.executor_stacks.executor_factory"


def _patch_factory(module) -> None:
  if getattr(module, "subprocess", None) is subprocess:
    module.subprocess = _SubprocessShim()
  elif not isinstance(getattr(module, "subprocess", None), _SubprocessShim):
    logging.warning("tff_ssl.runtime: TFF's executor factory no longer uses `subprocess`; "
                    "workers are stopped at exit but not on SIGKILL")
  make = getattr(module, "local_cpp_executor_factory", None)
  if make is not None and not getattr(make, "_tff_ssl_records_managers", False):
    module.local_cpp_executor_factory = _recording_managers(make)
  # A new local worker answers ~0.1 s after it starts; TFF polls it every second, and gRPC's first
  # reconnect after the refused first try waits ~1 s: the first computation of every context took
  # 1.1 s where 0.2 s do (2 cores, AMX Xeon, 2026-12-06). gRPC raises a backoff under 100 ms to 100.
  if hasattr(module, "_LOCALHOST_SERVER_WAIT_TIME_SEC"):
    setattr(module, "_LOCALHOST_SERVER_WAIT_TIME_SEC", _WORKER_POLL_SECONDS)
  options = getattr(module, "_GRPC_CHANNEL_OPTIONS", None)
  if isinstance(options, list) and _BACKOFF_OPTION not in options:
    options.append(_BACKOFF_OPTION)


_WORKER_POLL_SECONDS = 0.05
_BACKOFF_OPTION = ("grpc.initial_reconnect_backoff_ms", 100)


def _scan_managers() -> list:
  """TFF's ServiceManagers found among all live objects: those made before `_patch_factory` (TFF
  imported before tff_ssl; its import makes a default context). Slow in a large process: once."""
  import gc  # pylint: disable=g-import-not-at-top
  return [obj for obj in gc.get_objects()
          if type(obj).__name__ == "ServiceManager"
          and type(obj).__module__.endswith("executor_factory")]


def _cell_value(cell):
  try:
    return cell.cell_contents
  except ValueError:  # An empty cell.
    return None


def _recording_managers(make):
  """TFF's `local_cpp_executor_factory`, recording the `ServiceManager` each factory holds (in its
  executor-stack function's closure, TFF 0.87) in `_managers`."""

  def factory(*args, **kwargs):
    made = make(*args, **kwargs)
    stack_fn = getattr(made, "_executor_stack_fn", None)
    found = [_cell_value(cell) for cell in getattr(stack_fn, "__closure__", None) or ()
             if type(_cell_value(cell)).__name__ == "ServiceManager"]
    if not found:
      logging.warning("tff_ssl.runtime: TFF's local executor factory no longer holds its "
                      "ServiceManager where 0.87 did; stop_workers cannot reset it")
    _managers.update(found)
    return made

  factory._tff_ssl_records_managers = True  # pylint: disable=protected-access
  return factory


# TFF_SSL_OP_TRACEBACKS=0: TensorFlow records no Python stack for each graph op it creates. Graph
# building is most of the test suite's time, and the stack walk 17% of it (py-spy, 2026-12-05); the
# stack is read only by error messages, whose "defined at" then names `_op_tracebacks_are_off`. The
# test session sets it (tests/conftest.py), for the binaries it starts too; real runs leave it
# unset.
OP_TRACEBACKS_ENV = "TFF_SSL_OP_TRACEBACKS"
_OPS_MODULE = "tensorflow.python.framework.ops"


def _op_tracebacks_are_off(tf_stack):
  return tf_stack.extract_stack(1)


class _FixedStack:
  """Stands in for `tf_stack` inside TF's ops module: every op gets one fixed (non-empty) stack."""

  def __init__(self, tf_stack):
    self._tf_stack = tf_stack
    self._fixed = _op_tracebacks_are_off(tf_stack)

  def extract_stack(self, stacklevel=1):  # pylint: disable=unused-argument
    return self._fixed

  def __getattr__(self, name):
    return getattr(self._tf_stack, name)


def _patch_ops(module) -> None:
  stack = getattr(module, "tf_stack", None)
  if os.environ.get(OP_TRACEBACKS_ENV, "1") != "0" or isinstance(stack, _FixedStack):
    return
  if not hasattr(stack, "extract_stack"):
    logging.warning("tff_ssl.runtime: TF's ops module no longer uses `tf_stack`; %s=0 does nothing",
                    OP_TRACEBACKS_ENV)
    return
  module.tf_stack = _FixedStack(stack)


_PATCHES = {_FACTORY_MODULE: _patch_factory, _OPS_MODULE: _patch_ops}


class _PatchOnImport(importlib.abc.MetaPathFinder):
  """Patches TFF's executor factory (and TF's ops module) the moment it is imported (neither TFF nor
  TF is imported early)."""

  def find_spec(self, fullname, path, target=None):
    if fullname not in _PATCHES:
      return None
    for finder in sys.meta_path:
      if finder is self or not hasattr(finder, "find_spec"):
        continue
      spec = finder.find_spec(fullname, path, target)
      if spec is not None and spec.loader is not None:
        spec.loader = _PatchingLoader(spec.loader, _PATCHES[fullname])
        return spec
    return None


class _PatchingLoader(importlib.abc.Loader):
  def __init__(self, loader, patch):
    self._loader, self._patch = loader, patch

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    self._loader.exec_module(module)
    self._patch(module)


def install() -> None:
  """Installs the worker clean-up for this process; idempotent.

  Runs when `tff_ssl` is imported, so any program using the library (not only `bin/`) is covered. It
  does not import TFF: if TFF's executor factory is not imported yet, it is patched on import.
  """
  global _installed
  with _lock:
    if _installed:
      return
    for name, patch in _PATCHES.items():
      if name in sys.modules:
        patch(sys.modules[name])
        if name == _FACTORY_MODULE:
          _managers.update(_scan_managers())
    if any(name not in sys.modules for name in _PATCHES):
      sys.meta_path.insert(0, _PatchOnImport())
    atexit.register(_at_exit)
    if threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
          signal.signal(sig, _exit_on_signal)
      if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # Not where it is ignored.
        signal.signal(signal.SIGINT, _interrupt_on_signal)
    _installed = True
