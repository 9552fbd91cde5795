"""bin/train loaded as a module, for tests that call its main() in the test process."""

import contextlib
import dataclasses
import importlib.machinery
import importlib.util
import os
import sys
import tempfile

from absl import flags
from absl.testing import flagsaver

from tff_ssl import cli, runtime

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "bin", "train")


def load_module(name: str, path: str):
  """The script at `path` as the module `name`, loaded once per process (a binary's absl flags can
  be defined only once)."""
  if name in sys.modules:
    return sys.modules[name]
  loader = importlib.machinery.SourceFileLoader(name, path)
  spec = importlib.util.spec_from_loader(name, loader)
  module = importlib.util.module_from_spec(spec)
  loader.exec_module(module)
  sys.modules[name] = module
  return module


def load_train():
  """bin/train as a module."""
  return load_module("bin_train", TRAIN)


@dataclasses.dataclass
class Ended:
  """What a bin/train run in this process ended with, as `subprocess.run` reports a process."""
  returncode: int
  stdout: str
  stderr: str


def train_in_process(*args: str) -> Ended:
  """`bin/train *args` as bin/train's main() in this process: the same code from flag parsing on
  (its exit status and its stdout and stderr, as captured here), without a new TensorFlow process
  (~6 s of imports and start-up a run). For what needs a process of its own (a signal, a kill, what
  outlives it), the tests start bin/train itself. The test session's TFF context is bin/train's
  (tests/conftest.py); a run with --workers leaves it, and this goes back to the local worker."""
  binary = load_train()
  # Files, not StringIO: what starts a TFF worker passes it this process's stderr by file number.
  with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
    with flagsaver.flagsaver(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      try:
        cli.parse_flags(["train", *args])
        code = binary.main(["train"])
      except SystemExit as e:
        code = e.code
      finally:
        flags.FLAGS.unparse_flags()
        if runtime.configured_workers():
          runtime.configure_context(workers=[])
    out.seek(0)
    err.seek(0)
    return Ended(code, out.read(), err.read())
