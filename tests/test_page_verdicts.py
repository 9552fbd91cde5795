"""Pages say what the checker says (issue 72): where a rendered table page's analysis cites claims
("claims [2], [6]"), every verdict word it uses is one the checker gives those claims in the page's
own table, and no page calls a comparison a tie or inconclusive unless a checker says so (a table
with training seeds declares its tie margin, and its checker gives tie and inconclusive too)."""

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A verdict word in prose -> the checker's word.
WORDS = {"holds": "holds", "hold": "holds", "fails": "fails", "fail": "fails", "tie": "tie",
         "ties": "tie", "untested": "untested", "inconclusive": "inconclusive"}
WORD = re.compile(r"\b(holds?|fails?|ties?|untested|inconclusive)\b", re.IGNORECASE)
CHECK = re.compile(r"- \[(\d+)\] (.*) — (.*)$")


def checker_verdicts(table_md: str) -> dict[int, set[str]]:
  """Claim number -> the verdicts of its checked lines in a rendered table.md."""
  out: dict[int, set[str]] = {}
  with open(table_md, encoding="utf-8") as f:
    for line in f:
      m = CHECK.match(line.rstrip("\n"))
      if not m or ":" not in m.group(2):  # The claims' list ("- [n] A above B (...)") has no column.
        continue
      tail = m.group(3)
      verdict = ("untested" if tail.startswith("untested") else
                 "fails" if tail.startswith("**fails**") else
                 "tie" if tail.startswith("tie") else
                 "inconclusive" if tail.startswith("inconclusive") else "holds")
      out.setdefault(int(m.group(1)), set()).add(verdict)
  return out


def rendered_pages():
  """(page, its run folder's table.md, the page's analysis after the rendered part) for each page
  that begins with a run folder's page.md (the checker's verdicts; table.md has their numbers)."""
  heads = {}
  for t in glob.glob(os.path.join(ROOT, "docs", "table_runs", "*", "page.md")):
    with open(t, encoding="utf-8") as f:
      heads[os.path.join(os.path.dirname(t), "table.md")] = f.read()
  for page in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
    with open(page, encoding="utf-8") as f:
      text = f.read()
    for t, head in heads.items():
      if text.startswith(head):
        yield page, t, text[len(head):]


def test_the_analysis_uses_the_checkers_verdict_for_each_claim_it_cites():
  found, wrong = 0, []
  for page, table_md, analysis in rendered_pages():
    verdicts = checker_verdicts(table_md)
    for paragraph in re.split(r"\n(?=- )|\n\n", analysis):
      cited = {int(n) for n in re.findall(r"\[(\d+)\]", paragraph)}
      if not cited:
        continue
      found += 1
      allowed = set().union(*(verdicts.get(n, set()) for n in cited))
      said = {WORDS[w.lower()] for w in WORD.findall(paragraph)}
      if said - allowed:
        wrong.append(f"{os.path.basename(page)}, claims {sorted(cited)}: says "
                     f"{sorted(said - allowed)}, the checker {sorted(allowed)}: "
                     f"{paragraph[:120]!r}")
  assert found >= 5, "no analysis paragraph cites a claim: the pages' format changed"
  assert not wrong, "\n".join(wrong)


def test_no_page_calls_a_comparison_a_tie_the_checker_does_not():
  checkers = set()
  for t in glob.glob(os.path.join(ROOT, "docs", "table_runs", "*", "table.md")):
    for words in checker_verdicts(t).values():
      checkers |= words
  # The pages that report verdicts: README, results.md and the table pages (others describe code).
  pages = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "docs", "results.md")]
  pages += [page for page, _, _ in rendered_pages()]
  wrong = []
  for page in pages:
    with open(page, encoding="utf-8") as f:
      for i, line in enumerate(f, 1):
        for w in WORD.findall(line):
          if WORDS[w.lower()] in ("tie", "inconclusive") and WORDS[w.lower()] not in checkers:
            wrong.append(f"{os.path.relpath(page, ROOT)}:{i}: {line.strip()[:120]}")
  assert not wrong, "\n".join(wrong)


def test_check_lines_on_hand_written_pages_are_the_checkers():
  """A page that quotes a table's checked claims ("- [n] column: ... — verdict") quotes them as the
  checker wrote them in a table.md, number for number."""
  lines = set()
  for t in glob.glob(os.path.join(ROOT, "docs", "table_runs", "*", "table.md")):
    with open(t, encoding="utf-8") as f:
      lines |= {line.rstrip("\n") for line in f if CHECK.match(line.rstrip("\n"))}
  rendered = {page for page, _, _ in rendered_pages()}
  quoted, wrong = 0, []
  for page in glob.glob(os.path.join(ROOT, "docs", "*.md")):
    if page in rendered:
      continue
    with open(page, encoding="utf-8") as f:
      for i, line in enumerate(f, 1):
        m = CHECK.match(line.rstrip("\n"))
        if m and ":" in m.group(2):
          quoted += 1
          if line.rstrip("\n") not in lines:
            wrong.append(f"{os.path.relpath(page, ROOT)}:{i}: {line.strip()[:120]}")
  assert quoted >= 10, "docs/privacy_scaling_mini.md quotes its checks"
  assert not wrong, "\n".join(wrong)
