"""The federated core's layering (docs/adding_a_method.md): the round anatomy (`tff_ssl/federated/`)
imports no method, no run layer and no worker configuration, and FedAvg's process names no other
method's config or state. (No import cycle at all: tests/test_imports.py.)"""

import inspect
import re

from tests.test_imports import _graph
from tff_ssl.federated import fedavg_process

ABOVE_THE_ANATOMY = ("tff_ssl.methods", "tff_ssl.runner", "tff_ssl.runtime", "tff_ssl.experiment",
                     "tff_ssl.reproduce", "tff_ssl.tables", "tff_ssl.benchmarks")


def test_the_round_anatomy_imports_no_method_run_layer_or_worker_configuration():
  edges, _ = _graph()
  for name, imported in edges.items():
    if name.startswith("tff_ssl.federated"):
      bad = sorted(m for m in imported if m.startswith(ABOVE_THE_ANATOMY))
      assert not bad, (name, bad)


def test_fedavg_names_no_other_methods_config_or_state():
  source = open(fedavg_process.__file__).read()
  assert not re.findall(r"fedfoa|alignment|depth_dropout|droppable|feature_correlation", source,
                        re.I)
  assert len(inspect.getsource(fedavg_process.FedAvgSSLProcess.__init__).splitlines()) <= 80
