"""Command-line plumbing shared by the binaries in bin/ (the library itself never reads flags)."""

from __future__ import annotations

import sys

from absl import flags


def parse_flags(argv):
  """absl's flag parser, except that a bad flag is one line on stderr and exit status 2."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
