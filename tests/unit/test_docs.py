"""The user docs stay true to the tree: links resolve, every docs page is reachable from the README, and every test
the README's model-family table names exists."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def test_relative_links_resolve():
    broken = []
    for page in PAGES:
        for target, _ in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, f"links to files that do not exist: {broken}"


def test_every_docs_page_is_linked():
    linked = set()
    for page in (ROOT / "README.md", ROOT / "docs" / "deployment.md"):
        linked |= {(page.parent / t).resolve() for t, _ in LINK.findall(page.read_text())}
    unlinked = [p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in linked]
    assert not unlinked, f"docs pages no reader can find: {unlinked}; link them from README.md or docs/deployment.md"


def test_readme_opens_with_the_title_and_the_two_setup_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert lines[0] == "# hearth"
    block = lines[lines.index("```bash") + 1:lines.index("```")]
    assert [line.split()[:2] for line in block] == [["make", "serve"], ["make", "test"]]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^serve:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def test_model_table_names_tests_that_exist():
    text = (ROOT / "README.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| ") and "test_" in line]
    assert len(table) >= 13
    missing = []
    for line in table:
        for ref in re.findall(r"`([a-z0-9_/]*test_[a-z0-9_]+\.py)(?:::\w+)?(?:\[([^\]]+)\])?`", line):
            path, cases = ref
            file = ROOT / "tests" / (path if "/" in path else f"models/{path}")
            if not file.exists():
                missing.append(path)
                continue
            source = file.read_text()
            for case in filter(None, (c.strip() for c in cases.split(","))):
                if f'"{case.rstrip("*")}' not in source:
                    missing.append(f"{path}[{case}]")
    assert not missing, f"README's model table names tests that do not exist: {missing}"
