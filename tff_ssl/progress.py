"""A tqdm progress bar with ETA when enabled (a terminal), else a silent stand-in."""

from __future__ import annotations


class _Silent:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False

  def update(self, n=1):
    pass

  def set_postfix(self, **kw):
    pass

  def set_description(self, desc=None):
    pass

  def close(self):
    pass


def bar(total: int, *, desc: str, unit: str, initial: int = 0, enabled: bool = True,
        leave: bool = True):
  """`leave=False` for inner bars (a run inside a table): they vanish when done."""
  if not enabled:
    return _Silent()
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, leave=leave)
