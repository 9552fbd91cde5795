"""The run folder's CSV release manager: TFF's rows and resume semantics, without rereading the file."""

import asyncio
import csv

import numpy as np
import pytest

from tff_ssl.runner import CSVReleaseManager


def _rows(path):
  with open(path, newline="") as f:
    return [(int(r["round"]), float(r["loss"])) for r in csv.DictReader(f)]


def _release(manager, rounds):
  for r in rounds:
    asyncio.run(manager.release({"loss": np.float32(r / 2)}, key=r))


def test_rounds_in_order_append_without_reading_the_file(tmp_path, monkeypatch):
  path = str(tmp_path / "metrics.csv")
  manager = CSVReleaseManager(path, key_fieldname="round")
  _release(manager, range(2))  # The header (the first release rewrites the file).

  def no_read(self):
    raise AssertionError("an in-order release read the whole file")

  monkeypatch.setattr(CSVReleaseManager, "_read_values", no_read)
  _release(manager, range(2, 6))
  assert _rows(path) == [(r, r / 2) for r in range(6)]


def test_a_resumed_run_releasing_an_earlier_round_drops_the_later_rows(tmp_path):
  path = str(tmp_path / "metrics.csv")
  _release(CSVReleaseManager(path, key_fieldname="round"), range(8))
  resumed = CSVReleaseManager(path, key_fieldname="round")  # A new process reads the file.
  _release(resumed, [5, 6])  # Resumed from the checkpoint of round 5.
  assert _rows(path) == [(r, r / 2) for r in range(7)]
  _release(resumed, [6])  # The same round again replaces its row.
  assert _rows(path) == [(r, r / 2) for r in range(7)]


@pytest.mark.parametrize("kill_after", [0, 3])
def test_same_file_as_tff_release_manager(tmp_path, kill_after):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  ours, theirs = str(tmp_path / "ours.csv"), str(tmp_path / "theirs.csv")
  for cls, path in ((CSVReleaseManager, ours), (tff.program.CSVFileReleaseManager, theirs)):
    _release(cls(path, key_fieldname="round"), range(6))
    _release(cls(path, key_fieldname="round"), range(kill_after, 9))
  with open(ours) as a, open(theirs) as b:
    assert a.read() == b.read()
