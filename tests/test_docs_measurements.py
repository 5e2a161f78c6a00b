"""Measurements live on one page: docs/benchmarks.md, each with its date, machine, versions and command.

The guides (README.md, bench's and the examples' READMEs, docs/*.md but the benchmarks page) say what a thing is, how to use it and
why; they hold no dated figure and no run diary ("measured on this 2-core machine", "today"), and
every link between the pages, anchors included, lands on a file and a heading that exist."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
GUIDES = ([ROOT / "README.md", ROOT / "bench" / "README.md", ROOT / "bench" / "gpu" / "README.md"]
          + sorted(ROOT.glob("examples/*/README.md"))
          + sorted(p for p in (ROOT / "docs").glob("*.md") if p != BENCHMARKS))

DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
# What a lab notebook says and a guide does not: where and when a figure was taken, or a wall time
# to the second. Each pattern names the habit it catches.
DIARY = {
    "a 'measured on/here/(...)/:' heading or sentence": re.compile(
        r"\bmeasured\**\s*(on\b|\(|:)", re.IGNORECASE),
    "'today'": re.compile(r"\btoday\b", re.IGNORECASE),
    "this repository's / the shared machine": re.compile(
        r"\b(this|the) (repository's|project's|shared|dev) (shared )?(2[- ]v?(cpu|core)s? )?"
        r"(cpu )?(machine|cores|vm)\b", re.IGNORECASE),
    "a wall time to the second ('3 min 53 s')": re.compile(r"\b\d+ min \d+ s\b"),
    "the machine's load during a run ('load 13-23', 'the reference machine')": re.compile(
        r"\bload( average)? \d|\breference machine\b", re.IGNORECASE),
}
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```[^`]*$")     # an info string holds no backtick: "```python block.`" is text


def prose(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of the text outside fenced code blocks: log lines in an example keep
    their timestamps."""
    out, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append((number, line))
    return out


def dated_figures(path: Path) -> list[str]:
    return [f"{path.name}:{n}: {line.strip()[:100]}" for n, line in prose(path) if DATE.search(line)]


def diary_lines(path: Path) -> list[str]:
    return [f"{path.name}:{n}: {what}: {line.strip()[:100]}"
            for n, line in prose(path) for what, pattern in DIARY.items() if pattern.search(line)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, counts = set(), {}
    for _, line in prose(path):
        match = re.match(r"#{1,6}\s+(.*)", line)
        if match:
            base = slug(match.group(1))
            found.add(f"{base}-{counts[base]}" if base in counts else base)
            counts[base] = counts.get(base, 0) + 1
    return found


def broken_links(path: Path) -> list[str]:
    bad = []
    for n, line in prose(path):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):        # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                bad.append(f"{path.name}:{n}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{path.name}:{n}: {target}: no such heading in {dest.name}")
    return bad


def test_guides_hold_no_dated_figure():
    found = [hit for guide in GUIDES for hit in dated_figures(guide)]
    assert not found, "a dated figure belongs in docs/benchmarks.md:\n" + "\n".join(found)


def test_guides_hold_no_run_diary():
    found = [hit for guide in GUIDES for hit in diary_lines(guide)]
    assert not found, ("say what, how and why in a guide; move the measurement to docs/benchmarks.md "
                       "with its date, machine, versions and command:\n" + "\n".join(found))


def test_links_between_the_pages_land():
    found = [hit for page in GUIDES + [BENCHMARKS] for hit in broken_links(page)]
    assert not found, "\n".join(found)


def test_recipes_and_code_point_at_headings_that_exist():
    """Recipe headers and comments name figures as docs/PAGE.md#anchor: the anchor must exist."""
    ref = re.compile(r"docs/([\w-]+\.md)#([\w-]+)")
    files = [*ROOT.glob("recipes/*.toml"), *ROOT.glob("rlctl/**/*.py"), *ROOT.glob("bench/**/*.py")]
    bad = [f"{f.relative_to(ROOT)}: docs/{page}#{anchor}" for f in files
           for page, anchor in ref.findall(f.read_text())
           if not (ROOT / "docs" / page).exists() or anchor not in anchors(ROOT / "docs" / page)]
    assert not bad, "\n".join(bad)


def test_every_benchmarks_section_says_when_it_was_run():
    """Each `## ` section of the benchmarks page carries a date (its table's or its text's)."""
    sections = re.split(r"^## ", BENCHMARKS.read_text(), flags=re.MULTILINE)[1:]
    undated = [s.splitlines()[0] for s in sections if not DATE.search(s)]
    assert not undated, "sections of docs/benchmarks.md without a date: " + ", ".join(undated)


def test_the_checks_catch_a_notebook(tmp_path):
    page = tmp_path / "guide.md"
    page.write_text("# Guide\n\n**Measured** (2 shared cores): 300 steps in 3 min 53 s on 2026-11-25.\n"
                    "Today's run on this repository's 2-core machine (load 8), the reference machine.\n[x](#guide) [y](#nowhere)\n"
                    "```\n2026-01-31 12:00:05 INFO rlctl.serve: a log line keeps its timestamp\n```\n")
    assert len(dated_figures(page)) == 1
    assert {hit.split(": ")[1] for hit in diary_lines(page)} == set(DIARY)
    assert broken_links(page) == ["guide.md:5: #nowhere: no such heading in guide.md"]
