"""Comparisons of numbers that two execution paths computed, with the spread each was measured at.

Bit-for-bit equality holds only within one execution path: the same process kind running the same
graph on the same batch. Across paths (a tool's replay against bin/train, the reference simulation
against the grouped one, a TFF worker against in-process TensorFlow, one computation against two)
float32 sums run in other orders, and oneDNN picks its kernels by the CPU's instruction set, so the
two paths agree to a different last digit on an AVX-512 CPU and on an AVX2-only one (BUILD-notes,
"Numbers across CPUs"). Such a test calls `within(name, gap, bound)`, with a comment beside the bound
that gives the largest gap measured and where.

Measuring: with TFF_SSL_SPREAD_LOG=FILE set, every call appends one JSON line (name, gap, bound, the
oneDNN instruction-set cap in force) to FILE, with the test that made it; `tools/spread_report.py FILE...` prints the
largest gap of each. Run the comparing tests under several caps (ONEDNN_MAX_CPU_ISA=AVX2, =SSE41, or
TF_ENABLE_ONEDNN_OPTS=0) to see what another CPU would give.
"""

import json
import os

LOG_ENV = "TFF_SSL_SPREAD_LOG"


def isa() -> str:
  """The oneDNN set-up this process runs under, as the environment states it."""
  parts = [f"{k}={os.environ[k]}" for k in ("ONEDNN_MAX_CPU_ISA", "TF_ENABLE_ONEDNN_OPTS")
           if k in os.environ]
  return ",".join(parts) or "default"


def within(name: str, gap: float, bound: float) -> None:
  """Asserts `gap <= bound` (gap: a non-negative distance between two paths' numbers, in the units
  the caller's comment states), recording it when TFF_SSL_SPREAD_LOG is set."""
  gap, bound = float(gap), float(bound)
  path = os.environ.get(LOG_ENV)
  if path:
    with open(path, "a") as f:
      test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
      f.write(json.dumps({"test": test, "name": name, "gap": gap, "bound": bound,
                          "isa": isa()}) + "\n")
  assert gap == gap, f"{name}: the gap is NaN"
  assert gap <= bound, f"{name}: the two paths are {gap:.3g} apart, over the bound {bound:.3g}"


def relative_gap(got, want, scale=None) -> float:
  """max |got - want| over every tensor, over `scale` (default: max |want|)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  got = [np.asarray(x, np.float64) for x in (got if isinstance(got, (list, tuple)) else [got])]
  want = [np.asarray(x, np.float64) for x in (want if isinstance(want, (list, tuple)) else [want])]
  if scale is None:
    scale = max(float(np.abs(w).max()) if w.size else 0.0 for w in want) or 1.0
  return max(float(np.abs(g - w).max()) if g.size else 0.0 for g, w in zip(got, want)) / scale
