"""No code outside a method's own module asks which method it is running: no comparison of a method
field with a registered method's name, and no `isinstance` of a class from another method's module.
A method is one module and one registry line; a branch like that elsewhere is where the next method
would have to be special-cased instead. The same for aggregation strategies outside
`tff_ssl/aggregators/`: what a caller needs of one is a property of its registry entry
(`aggregators.Strategy`), as what it needs of a method is the method's (`Method.dp_releases`, its
fields). The library (`tff_ssl/`), the binaries (`bin/`), the paper tables (`tasks/`, whose rows name
methods and strategies as values, never in a comparison) and the tools (`tools/`) are checked."""

import pathlib
import re

import pytest

import tff_ssl
from tff_ssl import aggregators, methods

ROOT = pathlib.Path(tff_ssl.__file__).parent
METHOD_MODULES = frozenset(p.stem for p in (ROOT / "methods").glob("*.py") if p.stem != "__init__")
QUOTED = r"""(['"])(\w+)\1"""


def comparisons(text: str, field: str, names) -> list[str]:
  """Comparisons of a `field`-named value with one of `names` in `text`."""
  found = []
  # config.method == "dcco", "dcco" != self.method, method in ("fedu", "fedema"), ...
  for pattern in (rf"\b{field}\w*\s*(?:==|!=)\s*{QUOTED}",
                  rf"{QUOTED}\s*(?:==|!=)\s*[\w.]*\b{field}\b"):
    found += [m.group(0) for m in re.finditer(pattern, text) if m.group(2) in names]
  for m in re.finditer(rf"\b{field}\w*\s+(?:not\s+)?in\s*[(\[{{]([^)\]}}]*)", text):
    if any(q[1] in names for q in re.findall(QUOTED, m.group(1))):
      found.append(m.group(0))
  return found


def offenses(text: str, own_module: str | None = None) -> list[str]:
  """The branches on a method in `text` (a module's source; `own_module`: the method module it is,
  whose own classes and name it may use)."""
  found = comparisons(text, "method", set(methods.METHODS))
  # isinstance(x, layerwise.LayerwiseProcess), or of a class imported from a method's module.
  imported = {}
  for m in re.finditer(r"from tff_ssl\.methods\.(\w+) import ([^\n]+)", text):
    for name in re.findall(r"\w+", m.group(2)):
      imported[name] = m.group(1)
  for m in re.finditer(r"isinstance\(\s*[^,]+,\s*([^)]*)\)", text):
    for dotted in re.findall(r"[\w.]+", m.group(1)):
      parts = dotted.split(".")
      modules = [p for p in parts[:-1] if p in METHOD_MODULES]
      if parts[0] in imported:
        modules.append(imported[parts[0]])
      if any(mod != own_module for mod in modules):
        found.append(m.group(0))
  return found


def sources():
  top = ROOT.parent
  files = (sorted(ROOT.rglob("*.py")) + sorted((top / "bin").glob("*")) +
           sorted((top / "tasks").glob("*.py")) + sorted((top / "tools").glob("*.py")))
  for path in files:
    if path.is_file():
      own = path.stem if path.parent == ROOT / "methods" else None
      yield str(path.relative_to(top)), path.read_text(), own


def test_no_module_branches_on_another_methods_name_or_class():
  found = {path: hits for path, text, own in sources() if (hits := offenses(text, own))}
  assert not found, (f"branches on a method outside its module (move the behaviour into the "
                     f"method's module, a ClientTerm or a ServerStage): {found}")


@pytest.mark.parametrize("line", [
    'if config.method == "dcco":',
    'extra = {} if self.method != "fedlama" else {"a": 1}',
    'if "dcco" == config.method:',
    'if config.method in ("fedu", "fedema"):',
    'if isinstance(process, layerwise.LayerwiseProcess):',
    'from tff_ssl.methods.depth_dropout import DepthDropout\nok = isinstance(t, DepthDropout)',
    'if isinstance(p, (fedavg.FedAvgSSLProcess, int)):',
])
def test_the_check_finds_a_branch_added_back(line):
  assert offenses(line), line


@pytest.mark.parametrize("line", [
    'if aggregator.name == "fedavg":',  # An aggregation strategy, not a method.
    'if isinstance(factory, aggregators.StrategyFactory):',
    'Scenario("dcco_512x1", "dcco", 512, 1)',  # Data naming a method: no branch.
])
def test_the_check_leaves_other_comparisons_alone(line):
  assert not offenses(line), line


def test_a_method_may_use_its_own_classes():
  assert not offenses("isinstance(x, fedfoa.FedFoAStage)", own_module="fedfoa")
  assert offenses("isinstance(x, fedfoa.FedFoAStage)", own_module="fedlama")


def strategy_offenses(text: str) -> list[str]:
  """Branches on an aggregation strategy's name, or on a list of names, in `text`."""
  return (comparisons(text, "aggregator", set(aggregators.AGGREGATORS)) +
          re.findall(r"aggregator\w*\s+(?:not\s+)?in\s+(?:aggregators\.)?_?[A-Z][A-Z_]{2,}\b",
                     text))


def test_no_module_outside_aggregators_branches_on_a_strategys_name():
  found = {path: hits for path, text, _ in sources()
           if not path.startswith("tff_ssl/aggregators/") and (hits := strategy_offenses(text))}
  assert not found, f"branches on a strategy's name (ask its aggregators.Strategy entry): {found}"


@pytest.mark.parametrize("line", [
    'if config.aggregator in aggregators.DIVERGENCE_AWARE:',
    'if mini and c.aggregator in _MEASURED:',
    'if c.aggregator == "ldawa":',
    'if config.aggregator not in ("fedavg", "uniform"):',
])
def test_the_strategy_check_finds_a_branch_added_back(line):
  assert strategy_offenses(line), line
