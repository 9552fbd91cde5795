"""The package's import graph has no cycle, and no module imports a `tff_ssl` module inside a function
(the usual way of hiding a cycle)."""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "tff_ssl")


def _module_name(path: str) -> str:
  rel = os.path.relpath(path, ROOT)[:-len(".py")].replace(os.sep, ".")
  return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def _modules() -> dict[str, str]:
  out = {}
  for folder, _, files in os.walk(PACKAGE):
    for f in files:
      if f.endswith(".py"):
        out[_module_name(os.path.join(folder, f))] = os.path.join(folder, f)
  return out


def _imported(node: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
  """The tff_ssl modules an import statement names (`from a import b` names a.b when it is a module)."""
  names = set()
  if isinstance(node, ast.Import):
    names = {a.name for a in node.names}
  elif isinstance(node, ast.ImportFrom):
    if node.level:
      base = module.split(".")
      base = base[:len(base) - node.level + (1 if is_package else 0)]
      prefix = ".".join(base + ([node.module] if node.module else []))
    else:
      prefix = node.module or ""
    # `from P import m` imports module P.m (P is then already being imported: not an edge to P);
    # `from P import name` needs P itself.
    names = {f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in known else prefix for a in node.names}
  return {n for n in names if n in known}


def _graph():
  modules = _modules()
  known = set(modules)
  edges, in_functions = {}, []
  for name, path in modules.items():
    tree = ast.parse(open(path).read())
    is_package = path.endswith("__init__.py")
    edges[name] = set()
    for node in ast.walk(tree):
      found = _imported(node, name, is_package, known)
      edges[name] |= found
    for fn in ast.walk(tree):
      if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for node in ast.walk(fn):
          if _imported(node, name, is_package, known):
            in_functions.append(f"{name}.{fn.name}")
  for name in edges:
    edges[name].discard(name)
  return edges, in_functions


def test_the_package_imports_no_tff_ssl_module_inside_a_function():
  _, in_functions = _graph()
  assert in_functions == []


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
  """One cycle of a directed graph (its nodes, first repeated last), or None."""
  state, stack = {}, []

  def visit(n):
    state[n] = "open"
    stack.append(n)
    for m in sorted(edges.get(n, ())):
      if state.get(m) == "open":
        return stack[stack.index(m):] + [m]
      if m not in state:
        found = visit(m)
        if found:
          return found
    stack.pop()
    state[n] = "done"
    return None

  for n in sorted(edges):
    if n not in state:
      found = visit(n)
      if found:
        return found
  return None


def test_the_import_graph_has_no_cycle():
  edges, _ = _graph()
  assert find_cycle(edges) is None


def test_the_cycle_finder_finds_cycles():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
