"""The method list lives in one place, docs/running.md's "Methods" table: it names every method the
package registers, and nothing else."""

import os
import re

from tff_ssl import methods

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def documented() -> list[str]:
  text = open(os.path.join(ROOT, "docs", "running.md")).read()
  section = text.split("\n## Methods\n", 1)[1].split("\n## ", 1)[0]
  table = section.split("| `--method` |", 1)[1].split("\n\n", 1)[0]  # The first table's rows.
  return re.findall(r"^\| `([a-z_0-9]+)` \|", table, re.M)


def package_methods() -> set[str]:
  # Methods a test registers at run time (docs/adding_a_method.md's examples) are built outside
  # the package.
  return {m.name for m in methods.METHODS.values()
          if m.build is None or m.build.__module__.startswith("tff_ssl.")}


def test_running_md_lists_every_registered_method_once():
  names = documented()
  assert len(names) == len(set(names)), f"listed twice: {sorted(n for n in names if names.count(n) > 1)}"
  assert set(names) == package_methods(), (
      f"docs/running.md, Methods, lacks {sorted(package_methods() - set(names))} and lists "
      f"unregistered {sorted(set(names) - package_methods())}")


def test_the_check_reads_the_table():
  # A table the parser could not read would make the first test vacuous.
  assert {"dcco", "fedavg", "centralized", "supervised"} <= set(documented())
