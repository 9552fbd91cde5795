#!/usr/bin/env python3
"""The largest gap measured for each cross-path comparison of the test suite (tests/spread.py).

  TFF_SSL_SPREAD_LOG=/tmp/spread.jsonl .venv/bin/python -m pytest tests/federated
  ONEDNN_MAX_CPU_ISA=AVX2 TFF_SSL_SPREAD_LOG=/tmp/spread.jsonl .venv/bin/python -m pytest ...
  .venv/bin/python tools/spread_report.py /tmp/spread.jsonl

Prints, per comparison: its bound, the largest gap seen under each oneDNN set-up, and the bound's
margin over the largest gap of all.
"""

import collections
import json
import sys


def main(argv) -> int:
  if len(argv) < 2:
    print(__doc__, file=sys.stderr)
    return 2
  largest = collections.defaultdict(dict)
  bounds = {}
  for path in argv[1:]:
    with open(path) as f:
      for line in f:
        r = json.loads(line)
        key = f"{r.get('test', '')}: {r['name']}"
        seen = largest[key]
        seen[r["isa"]] = max(seen.get(r["isa"], 0.0), r["gap"])
        bounds[key] = r["bound"]
  isas = sorted({i for seen in largest.values() for i in seen})
  print("| comparison | bound | " + " | ".join(isas) + " | margin |")
  print("|---" * (len(isas) + 3) + "|")
  for name in sorted(largest):
    seen = largest[name]
    worst = max(seen.values())
    margin = f"{bounds[name] / worst:.0f}x" if worst > 0 else "exact"
    print(f"| {name} | {bounds[name]:.2g} | "
          + " | ".join(f"{seen[i]:.2g}" if i in seen else "" for i in isas) + f" | {margin} |")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
