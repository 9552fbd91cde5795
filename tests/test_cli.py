"""The binaries' one-line errors (tff_ssl/cli.py)."""

import pytest
import tensorflow as tf

from tff_ssl import cli


def test_a_bad_value_is_one_line_and_exit_status_2(capsys):
  with pytest.raises(SystemExit) as ended, cli.one_line_errors():
    raise ValueError("rounds must be >= 1; got 0\nmore detail")
  assert ended.value.code == cli.EXIT_ERROR
  assert capsys.readouterr().err == "error: rounds must be >= 1; got 0\n"


def test_an_error_inside_a_tf_function_names_the_error_not_the_trace(capsys):
  @tf.function
  def check(x):
    if x.shape[0] != 3:
      raise ValueError(f"expected 3 values; got {x.shape[0]}\n(second line)")
    return x

  with pytest.raises(SystemExit) as ended, cli.one_line_errors():
    check(tf.zeros([2]))
  assert ended.value.code == cli.EXIT_ERROR
  assert capsys.readouterr().err == "error: ValueError: expected 3 values; got 2\n"


def test_a_bug_keeps_its_traceback():
  with pytest.raises(KeyError), cli.one_line_errors():
    raise KeyError("bug")
