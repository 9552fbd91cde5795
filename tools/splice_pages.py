"""Puts each run folder's rendered page.md at the head of the docs page that shows it, keeping the
page's analysis (what follows the rendered part, which ends at its "Run time:" line).

After `bin/reproduce` (or `--render_only`) rewrote docs/table_runs/<name>/, run

  .venv/bin/python tools/splice_pages.py            # every docs/*.md that begins with a run's title
  .venv/bin/python tools/splice_pages.py --check    # exit 1 if a page's head is not its page.md

A page belongs to the run folder whose table.md or page.md shares the most leading lines with it
(several folders can share a title: variants of one table).
"""

import argparse
import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
END = "Run time: "


def _lines(path: str) -> list[str]:
  with open(path, encoding="utf-8") as f:
    return f.read().splitlines(keepends=True)


def _shared(a: list[str], b: list[str]) -> int:
  n = 0
  for x, y in zip(a, b):
    if x != y:
      break
    n += 1
  return n


def folder_of(page: list[str], folders: dict[str, dict[str, list[str]]]) -> str | None:
  """The run folder `page` shows: the one whose table.md or page.md shares most leading lines."""
  best, most = None, 2  # More than the title and the blank line under it.
  for folder, files in folders.items():
    n = max(_shared(page, text) for text in files.values())
    if n > most:
      best, most = folder, n
  return best


def splice(page: list[str], rendered: list[str]) -> list[str]:
  """`rendered` followed by what `page` has after its own rendered part (its first "Run time:"
  line); a page without one is all analysis below the first line's table: refused."""
  ends = [i for i, line in enumerate(page) if line.startswith(END)]
  if not ends:
    raise ValueError("no 'Run time:' line ends its rendered part")
  return rendered + page[ends[0] + 1:]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
  args = parser.parse_args(argv)
  folders = {}
  for d in sorted(glob.glob(os.path.join(ROOT, "docs", "table_runs", "*", ""))):
    files = {n: _lines(os.path.join(d, n)) for n in ("table.md", "page.md")
             if os.path.exists(os.path.join(d, n))}
    if "page.md" in files:
      folders[d] = files
  stale = []
  for path in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
    page = _lines(path)
    folder = folder_of(page, folders) if page else None
    if folder is None:
      continue
    new = splice(page, folders[folder]["page.md"])
    if new != page:
      stale.append(os.path.relpath(path, ROOT))
      if not args.check:
        with open(path, "w", encoding="utf-8") as f:
          f.writelines(new)
    head = os.path.join(os.path.relpath(folder, ROOT), "page.md")
    print(f"{os.path.relpath(path, ROOT)} <- {head}{' (stale)' if new != page and args.check else ''}")
  return 1 if (args.check and stale) else 0


if __name__ == "__main__":
  sys.exit(main())
