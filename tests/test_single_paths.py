"""One implementation of each shared step: a round's assembly (`federated.composer`), a client's local
training (`client_work.local_training`, which DCCO runs through its statistics term) and a DP release (`privacy.release`: the clip and sum
at the clients, the noised sum at the server, which DP-FedAvg and DP-DCCO both call). A second copy
would drift from the first; these checks fail when one is added back."""

import ast
import pathlib
import re

import tff_ssl

ROOT = pathlib.Path(tff_ssl.__file__).parent
SOURCES = {p.relative_to(ROOT).as_posix(): p.read_text() for p in ROOT.rglob("*.py")}


def where(pattern: str) -> list[str]:
  return sorted(path for path, text in SOURCES.items() if re.search(pattern, text, re.M))


def test_one_local_training():
  assert where(r"^\s*def local_training\(") == ["federated/client_work.py"]


def test_dp_records_are_clipped_and_released_only_in_privacy():
  # The per-client clip and sum, and TFF's DP factory that noises the sum.
  assert where(r"\bclip_and_sum\(") == ["privacy/queries.py", "privacy/release.py"]
  assert where(r"DifferentiallyPrivateFactory\(") == ["privacy/release.py"]


def test_dp_fedavg_and_dp_dcco_fold_and_release_through_the_same_calls():
  for path in ("aggregators/private.py", "methods/dcco_private.py"):
    assert re.search(r"\.fold\(|\.presummed\(", SOURCES[path]), path
  # DP-FedAvg's aggregator releases its sum; DP-DCCO's phases are the composer's releases.
  assert ".release_of(" in SOURCES["aggregators/private.py"]
  assert "composer.Release(" in SOURCES["methods/dcco_private.py"]
  assert ".release_of(" in SOURCES["federated/composer.py"]


def test_clip_factors_are_computed_only_in_privacy():
  # The scale of a clipped record (`privacy.clip.factors`, tensorflow_privacy's rule): its pattern,
  # a clip over a norm, appears only in the privacy package; the vectorized sites import it.
  rule = r"reciprocal(_no_nan)?\(norms?\)|clip_by_global_norm\(|clip\w* / \w*norm"
  assert [p for p in where(rule) if not p.startswith("privacy/")] == []
  for path in ("losses/statistics.py", "methods/dcco_private.py"):
    assert "clip_lib.factors(" in SOURCES[path], path


def test_one_round_builder():
  # Every process's round is a `composer.Round`; the other federated computations are aggregation
  # processes (tff.aggregators factories) and benchmarks' probes.
  builders = [p for p in where(r"tff\.federated_computation\b")
              if not p.startswith(("aggregators/", "benchmarks/"))]
  assert builders == ["federated/composer.py"]


def test_the_checks_see_a_second_copy():
  SOURCES["methods/extra.py"] = "def local_training(model):\n  queries.clip_and_sum(q, p, v, a)\n"
  try:
    assert where(r"^\s*def local_training\(") == ["federated/client_work.py", "methods/extra.py"]
    assert "methods/extra.py" in where(r"\bclip_and_sum\(")
  finally:
    del SOURCES["methods/extra.py"]


def long_classes(sources, limit=250) -> list[str]:
  """`path:Class (lines)` for every class of more than `limit` lines."""
  out = []
  for path, text in sorted(sources.items()):
    for node in ast.walk(ast.parse(text)):
      if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > limit:
        out.append(f"{path}:{node.name} ({node.end_lineno - node.lineno + 1})")
  return out


def test_no_class_over_250_lines_and_dcco_under_400():
  # A class that long does several things; its parts belong in functions or modules of their own.
  assert long_classes(SOURCES) == []
  assert len(SOURCES["methods/dcco.py"].splitlines()) < 400
  assert long_classes({"x.py": "class A:\n" + "  x = 1\n" * 250}) == ["x.py:A (251)"]
