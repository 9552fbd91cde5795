"""bin/train loaded as a module, for tests that call its main() in the test process."""

import importlib.machinery
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "bin", "train")


def load_train():
  """bin/train as a module, loaded once per process (its absl flags can be defined only once)."""
  if "bin_train" in sys.modules:
    return sys.modules["bin_train"]
  loader = importlib.machinery.SourceFileLoader("bin_train", TRAIN)
  spec = importlib.util.spec_from_loader("bin_train", loader)
  module = importlib.util.module_from_spec(spec)
  loader.exec_module(module)
  sys.modules["bin_train"] = module
  return module
