"""A run folder's small files: hparams.json (the config, written first) and atomic writes."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile


def hparams_json(config) -> str:
  """The text of a run folder's hparams.json for `config` (a dataclass)."""
  return json.dumps(dataclasses.asdict(config), indent=2, sort_keys=True) + "\n"


def write_hparams(config, output_dir: str) -> None:
  """Creates the run folder `output_dir` with its hparams.json."""
  os.makedirs(output_dir, exist_ok=True)
  write_atomic(os.path.join(output_dir, "hparams.json"), hparams_json(config))


def write_atomic(path: str, text: str) -> None:
  """Writes `text` to `path` whole or not at all (a temporary file renamed into place)."""
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
