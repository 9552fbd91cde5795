"""bin/reproduce on bad input: one line, exit status 2, nothing written."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*args, env=None):
  return subprocess.run([sys.executable, os.path.join(ROOT, "bin", "reproduce"), *args],
                        capture_output=True, text=True, timeout=900, env=env)


@pytest.mark.parametrize("args,needle", [
    (["--table=nope"], "--table"),
    (["--table=dcco_table1", "--scale=huge"], "--scale"),
    (["--table=dcco_table1", "--max_rounds=-1"], "--max_rounds"),
    (["--table=ldawa_table2", "--set=fedavg_warmup_rounds=2"],
     "row 'fedavg': fedavg_warmup_rounds is not used by aggregator 'fedavg'"),
    (["--table=dcco_table1", "--render_only"], "is not a table folder"),
])
def test_bad_flags(tmp_path, args, needle):
  out = tmp_path / "t"
  proc = _run(*args, f"--output_dir={out}")
  assert proc.returncode == 2, proc.stderr
  assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr
  assert not out.exists()


def test_missing_dataset_is_one_line_and_writes_nothing(tmp_path):
  out = tmp_path / "t"
  env = dict(os.environ, TFDS_DATA_DIR=str(tmp_path / "no_tfds"))
  proc = _run("--table=dcco_table1", "--scale=paper", f"--data_dir={tmp_path / 'no_tfds'}",
              f"--output_dir={out}", env=env)
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and "cifar100" in lines[0] and "tfds build" in lines[0]
  assert not out.exists()
