"""Command-line plumbing shared by the binaries in bin/ (the library itself never reads flags).

Exit statuses of every binary: 0 done; 2 an error, one line on stderr (bad input, a diverged run,
a run folder that cannot be written or is in use, unreadable data); 130 interrupted (Ctrl-C), one
line on stderr. Federated runs resume from their last checkpoint when the same command is rerun.
"""

from __future__ import annotations

import contextlib
import re
import sys

from absl import flags

from tff_ssl import config_fields
from tff_ssl import runtime

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


def parse_flags(argv):
  """absl's flag parser, except that a bad flag is one line on stderr and exit status 2."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(EXIT_ERROR)


def _first_line(text: str) -> str:
  """The line that says what went wrong: the first, or for an error raised inside a `tf.function`
  ("in user code:", then the trace) the last, where TensorFlow puts the error itself."""
  lines = [line.strip() for line in str(text).splitlines() if line.strip()]
  if not lines or lines[0] != "in user code:":
    return lines[0] if lines else ""
  errors = [line for line in lines if re.match(r"\w+(Error|Exception): ", line)]
  return errors[-1] if errors else lines[-1]


@contextlib.contextmanager
def one_line_errors(rerun: str = "rerun the same command to resume from the last checkpoint"):
  """Ends the binary with one line on stderr and its exit status (module docstring) for the errors a
  user can cause or meet; anything else (a bug) keeps its traceback. `rerun`: what to do after an
  interruption or a failed write."""
  try:
    yield
    runtime.raise_if_interrupted()  # A Ctrl-C whose exception Python dropped on the way.
  except (ValueError, FloatingPointError) as e:  # Bad input; a diverged run (its message says why).
    print(f"error: {_first_line(e)}", file=sys.stderr)
    sys.exit(EXIT_ERROR)
  except KeyboardInterrupt:
    runtime.interruption_handled()
    print(f"interrupted; {rerun}", file=sys.stderr)
    sys.exit(EXIT_INTERRUPTED)
  except OSError as e:  # A full disk, a folder removed or made read-only under the run, ...
    where = f" {e.filename}" if e.filename else ""
    print(f"error:{where} {e.strerror or _first_line(e)}; fix that (free disk space, ...) and "
          f"{rerun}", file=sys.stderr)
    sys.exit(EXIT_ERROR)
  except Exception as e:  # pylint: disable=broad-except
    tf = sys.modules.get("tensorflow")
    if tf is None or not isinstance(e, tf.errors.OpError):
      raise
    # tf.io.gfile (TFF's release and program-state managers write through it) raises these.
    print(f"error: {type(e).__name__}: {_first_line(e.message)}; fix that (free disk space, ...) "
          f"and {rerun}", file=sys.stderr)
    sys.exit(EXIT_ERROR)


def _shown(value) -> str:
  if isinstance(value, tuple):
    return ",".join(str(v) for v in value) or "(empty)"
  return str(value)


def define_config_flags(config_class, flag_values=flags.FLAGS) -> None:
  """One flag per field of `config_class` (a dataclass of `config_fields.Field`s), its help, type
  and choices from the field's declaration. Every flag defaults to None: "the task's value"
  (`config_overrides`). Bounds are checked where the config is made, with the field's one check."""
  for spec in config_fields.specs(config_class):
    help_ = f"{spec.describe()} (config default: {_shown(spec.default)})"
    kind = spec.type
    choices = spec.choice_list()
    if kind is bool:
      flags.DEFINE_bool(spec.name, None, help_, flag_values=flag_values)
    elif kind is tuple:
      flags.DEFINE_list(spec.name, None, help_, flag_values=flag_values)
    elif kind is int:
      flags.DEFINE_integer(spec.name, None, help_ + (f" One of {choices}." if choices else ""),
                           flag_values=flag_values)
    elif kind is float:
      flags.DEFINE_float(spec.name, None, help_, flag_values=flag_values)
    elif choices is not None:
      flags.DEFINE_enum(spec.name, None, sorted(str(c) for c in choices), help_,
                        flag_values=flag_values)
    else:
      flags.DEFINE_string(spec.name, None, help_, flag_values=flag_values)


def config_overrides(config_class, flag_values=flags.FLAGS) -> dict:
  """{field: value} for every `define_config_flags` flag given on the command line, in the field's
  type (a list flag's items converted to its `item` type; ValueError, one line, where one is not)."""
  overrides = {}
  for spec in config_fields.specs(config_class):
    flag = flag_values[spec.name]
    if not flag.present:
      continue
    value = flag.value
    if spec.type is tuple:
      try:
        value = tuple(spec.item(v) for v in value)
      except ValueError:
        kind = {int: "integers", float: "numbers"}.get(spec.item, spec.item.__name__ + "s")
        raise ValueError(f"--{spec.name} must be comma-separated {kind}; got "
                         f"{','.join(value)}") from None
    overrides[spec.name] = value
  return overrides
