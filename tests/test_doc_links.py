"""The pages hold together: every relative link in README.md, BUILD-notes.md and docs/*.md reaches a
file, every anchor into a Markdown page names one of its headings (GitHub's slugs), and every page is
within its length budget (issue 76: README <= 150 lines, BUILD-notes <= 400, a docs page <= 250)."""

import glob
import importlib.util
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

README_LINES, BUILD_NOTES_LINES, DOC_LINES = 150, 400, 250

def pages() -> list[str]:
  found = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "BUILD-notes.md")]
  found += sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
  found += sorted(glob.glob(os.path.join(ROOT, "docs", "table_runs", "README.md")))
  return found


def name(path: str) -> str:
  return os.path.relpath(path, ROOT)


def prose(text: str) -> str:
  """The text outside fenced code blocks, inline code spans kept as plain words."""
  text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
  return re.sub(r"`([^`\n]*)`", r"\1", text)


def slug(heading: str) -> str:
  """GitHub's anchor for a heading: its text lowercased, punctuation but '-' and '_' dropped, each
  space a '-'."""
  text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # A link's text stays.
  text = text.strip().lower()
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
  seen: dict[str, int] = {}
  found = set()
  for line in prose(open(path, encoding="utf-8").read()).splitlines():
    match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
    if not match:
      continue
    base = slug(match.group(1))
    n = seen.get(base, 0)
    seen[base] = n + 1
    found.add(base if n == 0 else f"{base}-{n}")
  return found


def links(path: str) -> list[str]:
  """Every [text](target) and ![alt](target) target of a page, outside code."""
  text = prose(open(path, encoding="utf-8").read())
  return [m.group(1) for m in re.finditer(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)]


def relative(target: str) -> bool:
  return not re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) and not target.startswith("//")


def test_every_relative_link_resolves():
  broken = []
  for page in pages():
    for target in links(page):
      if not relative(target):
        continue
      path, _, anchor = target.partition("#")
      dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
      if not os.path.exists(dest):
        broken.append(f"{name(page)}: {target} (no file {name(dest)})")
      elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
        broken.append(f"{name(page)}: {target} (no heading #{anchor} in {name(dest)})")
  assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_link_check_reads_the_pages():
  # A parser that found nothing would make the check above vacuous.
  readme = os.path.join(ROOT, "README.md")
  assert any(t.startswith("docs/") for t in links(readme))
  assert any("#" in t for page in pages() for t in links(page) if relative(t))


@pytest.mark.parametrize("heading,expected", [
    ("Across TFF's worker services: what a round costs", "across-tffs-worker-services-what-a-round-costs"),
    ("Reproducing paper tables", "reproducing-paper-tables"),
    ("2. The centralized gate", "2-the-centralized-gate"),
    ("`--dcco_statistics=previous` (one computation)", "--dcco_statisticsprevious-one-computation"),
    ("DP scaling, mini scale: ε = 8", "dp-scaling-mini-scale-ε--8"),
])
def test_slug_follows_github(heading, expected):
  assert slug(prose(heading)) == expected


def budget(page: str) -> int | None:
  rel = name(page)
  if rel == "README.md":
    return README_LINES
  if rel == "BUILD-notes.md":
    return BUILD_NOTES_LINES
  if os.path.dirname(rel) == "docs":
    return DOC_LINES
  return None


def test_every_page_within_its_length_budget():
  over = []
  for page in pages():
    limit = budget(page)
    lines = len(open(page, encoding="utf-8").read().splitlines())
    if limit is not None and lines > limit:
      over.append(f"{name(page)}: {lines} lines (at most {limit})")
  assert not over, "pages over budget:\n" + "\n".join(over)


def test_each_table_page_begins_with_its_run_folders_page_md():
  """A page that shows a table (docs/dcco_table1_mini.md, ...) begins with its run folder's page.md
  as `bin/reproduce` last rendered it (`tools/splice_pages.py` puts it there), then the analysis."""
  spec = importlib.util.spec_from_file_location("splice_pages",
                                                os.path.join(ROOT, "tools", "splice_pages.py"))
  splice_pages = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(splice_pages)
  shown = []
  for page in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
    with open(page, encoding="utf-8") as f:
      text = f.read()
    for folder in glob.glob(os.path.join(ROOT, "docs", "table_runs", "*", "page.md")):
      with open(folder, encoding="utf-8") as f:
        if text.startswith(f.read()):
          shown.append(page)
  assert len(shown) >= 10, "the table pages no longer begin with their run folders' page.md"
  assert splice_pages.main(["--check"]) == 0, "run tools/splice_pages.py: a page's head is stale"
