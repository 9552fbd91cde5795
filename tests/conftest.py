"""Test-session set-up: quiet TensorFlow, stop every TFF worker this run starts."""

import os
import signal

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# No Python stack recorded per graph op (tff_ssl/runtime.py, OP_TRACEBACKS_ENV), here and in the
# binaries the tests start: 17% of graph building, most of the suite's time. Set it to 1 to see
# where an op in a TensorFlow error was defined.
os.environ.setdefault("TFF_SSL_OP_TRACEBACKS", "0")

import pytest  # noqa: E402

from tff_ssl import runtime  # noqa: E402


def _interrupt(signum, frame):  # pylint: disable=unused-argument
  raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):  # pylint: disable=unused-argument
  runtime.install()
  # runtime.install() turns SIGTERM into SystemExit, which pytest records as one test's failure and
  # runs on (`timeout 600 pytest` ran the suite past its limit): here it stops the session, as Ctrl-C
  # does, and pytest_sessionfinish stops the workers.
  for sig in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, _interrupt)
  # TFF's static Grappler pass costs ~40 s per paper-scale process, ~20 s of a 65 s bin/train smoke
  # run, and is no part of what the tests check: off here and, through the environment, in the
  # binaries the tests run (real runs keep it; BUILD-notes, "TFF process hygiene").
  os.environ[runtime.STATIC_GRAPH_OPTIMIZATION_ENV] = "0"
  runtime.configure_context(static_graph_optimization=False)
  # In-process runs of a config built before in this process take its built process (tff_ssl/runner.py,
  # `CACHE_ENV`): a kill-and-resume or a repeated smoke config skips 5-7 s of building and compiling.
  os.environ["TFF_SSL_CACHE_PROCESSES"] = "1"


# TFF's local worker keeps what a computation held after it returns: a pytest-xdist process that runs
# several paper-scale (full-width ResNet-18) tests in a row took its worker to 15-18 GB on a 24 GB
# machine, and the suite to a standstill. After a test that leaves the worker above this size, a fresh
# context (runtime.configure_context stops the old worker) starts the next test with a fresh one.
WORKER_RECYCLE_MB = 3000


@pytest.fixture(autouse=True)
def _recycle_a_bloated_worker():
  yield
  _, worker_mb = runtime.resident_memory_mb()
  if worker_mb > WORKER_RECYCLE_MB:
    runtime.configure_context()


def pytest_sessionfinish(session, exitstatus):  # pylint: disable=unused-argument
  runtime.stop_workers()


@pytest.fixture(scope="session")
def synthetic_train():
  from tff_ssl.data import synthetic  # pylint: disable=g-import-not-at-top
  return synthetic("train", num_examples=400, seed=0)


@pytest.fixture(scope="session")
def synthetic_test():
  from tff_ssl.data import synthetic  # pylint: disable=g-import-not-at-top
  return synthetic("test", num_examples=200, seed=0)
