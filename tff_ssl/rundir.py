"""A run folder: creating it (with a clear error where it cannot be), its lock, hparams.json and
atomic writes.

A run folder is used by one process at a time: `create` takes an advisory lock (`flock` on
`<folder>/.lock`, released by the kernel when the process ends however it ends, so a crash leaves
no stale lock), and a second run on the same folder is refused with `RunLockedError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import tempfile

from tff_ssl import config_fields

LOCK_FILE = ".lock"
_LOCKS: dict[str, int] = {}  # realpath of a run folder -> the open, locked .lock file.


class RunLockedError(ValueError):
  """Another process is running in the run folder."""


def hparams_json(config) -> str:
  """The text of a run folder's hparams.json for `config` (a dataclass), with the config layout's
  version (`config_fields.VERSION`)."""
  fields = dataclasses.asdict(config)
  fields[config_fields.VERSION_KEY] = config_fields.VERSION
  return json.dumps(fields, indent=2, sort_keys=True) + "\n"


class CorruptRunFolderError(ValueError):
  """A run folder's hparams.json cannot be read, or holds no config."""


def read_hparams(path: str, config_class=None) -> dict:
  """The fields of the hparams.json at `path`, in today's layout (`config_fields.upgrade`).

  CorruptRunFolderError, one line naming the file, what is wrong and the fix, where the file cannot
  be read, is not a JSON object, or (given `config_class`) holds a value that class refuses. Fields
  of another version (missing or unknown ones) are left to the caller, which names them."""
  folder = os.path.dirname(os.path.abspath(path))
  fix = (f"the run in {folder} cannot be resumed or read without it: delete the folder, or choose "
         f"another --output_dir")
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except OSError as e:
    raise CorruptRunFolderError(f"{path} cannot be read ({e.strerror}); make it readable, or "
                                f"{fix}") from None
  except UnicodeDecodeError:
    raise CorruptRunFolderError(f"{path} is not text (not UTF-8); it is corrupt: {fix}") from None
  try:
    stored = json.loads(text)
  except ValueError as e:
    where = f"{e.msg} at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else str(e)
    raise CorruptRunFolderError(f"{path} is not valid JSON ({where}); it is corrupt: {fix}"
                                ) from None
  if not isinstance(stored, dict):
    raise CorruptRunFolderError(f"{path} holds a JSON {type(stored).__name__}, not a config's "
                                f"fields; it is corrupt: {fix}")
  try:
    fields = config_fields.upgrade(stored, path)
  except ValueError as e:
    raise CorruptRunFolderError(str(e)) from None
  if config_class is not None:
    known = {f.name for f in dataclasses.fields(config_class)}
    try:
      config_class(**{k: v for k, v in fields.items() if k in known})
    except (TypeError, ValueError) as e:
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise CorruptRunFolderError(f"{path} holds a value no run can have ({first}); it is "
                                  f"corrupt: {fix}") from None
  return fields


def compare_settings(stored: dict, config) -> tuple[list[str], list[str], bool]:
  """(fields of `config` the stored hparams.json fields (`read_hparams`) lack, fields they have that
  `config` lacks, whether every field both have is equal). A field added to tff-ssl after the run was
  written is read as its default: a run written before `head_norm` existed is the same run as one at
  `head_norm="group"`, and is listed as lacking the field only where `config` sets another value."""
  ours = json.loads(hparams_json(config))
  del ours[config_fields.VERSION_KEY]
  defaults = json.loads(json.dumps({f.name: f.default for f in dataclasses.fields(config)
                                    if f.default is not dataclasses.MISSING}, default=str))
  missing = sorted(k for k in ours if k not in stored and ours[k] != defaults.get(k, object()))
  extra = sorted(k for k in stored if k not in ours)
  equal = all(stored[k] == ours[k] for k in ours if k in stored)
  return missing, extra, equal


def same_settings(path: str, config) -> bool:
  """Whether the hparams.json at `path` describes the run of `config` (`compare_settings`);
  CorruptRunFolderError where it holds no readable config (`read_hparams`)."""
  missing, extra, equal = compare_settings(read_hparams(path, type(config)), config)
  return not missing and not extra and equal


def check_creatable(output_dir: str) -> None:
  """Raises ValueError (one line, naming the path and the fix) if `output_dir` is not a folder this
  process could create or write in. Creates nothing: called before the run's other checks."""
  path = os.path.abspath(output_dir)
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"--output_dir {output_dir} is an existing file, not a folder; choose a folder "
                     f"path")
  parent = path
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise ValueError(f"--output_dir {output_dir}: {parent} is a file, not a folder; choose a folder "
                     f"path")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise ValueError(f"--output_dir {output_dir}: {parent} is not writable; choose a folder you can "
                     f"write to")


def create(output_dir: str) -> None:
  """Creates the run folder `output_dir` (if needed) and locks it for this process (`lock`)."""
  check_creatable(output_dir)
  try:
    os.makedirs(output_dir, exist_ok=True)
  except OSError as e:
    raise ValueError(f"cannot create --output_dir {output_dir}: {e.strerror}; choose a folder you "
                     f"can write to") from None
  lock(output_dir)


def lock(output_dir: str) -> None:
  """Locks the existing run folder `output_dir` for this process (idempotent within the process);
  raises RunLockedError if another process holds it. Released by `session` or at process exit."""
  key = os.path.realpath(output_dir)
  if key in _LOCKS:
    return
  path = os.path.join(output_dir, LOCK_FILE)
  try:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  except OSError as e:
    raise ValueError(f"cannot write in --output_dir {output_dir}: {e.strerror}; choose a folder "
                     f"you can write to") from None
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
    os.close(fd)
    if e.errno not in (errno.EAGAIN, errno.EACCES):
      raise
    raise RunLockedError(f"--output_dir {output_dir} is in use by another run (process {holder}); "
                         f"wait for it to end, or choose another --output_dir") from None
  os.ftruncate(fd, 0)
  os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
  _LOCKS[key] = fd


@contextlib.contextmanager
def session():
  """Releases, on leaving, the run-folder locks taken inside (a run's folder is free again when
  `experiment.run` returns or raises, also within one Python process)."""
  before = set(_LOCKS)
  try:
    yield
  finally:
    for key in set(_LOCKS) - before:
      os.close(_LOCKS.pop(key))


def write_hparams(config, output_dir: str) -> None:
  """Creates (and locks) the run folder `output_dir` with its hparams.json."""
  create(output_dir)
  write_atomic(os.path.join(output_dir, "hparams.json"), hparams_json(config))


def write_atomic(path: str, text: str | bytes) -> None:
  """Writes `text` (or bytes) to `path` whole or not at all (a temporary file renamed into place)."""
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
  try:
    with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
