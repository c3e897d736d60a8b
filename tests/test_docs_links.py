"""The project stands on its own files (issue 33, item 12): every relative path, markdown
link, anchor and section a doc, manifest, comment or docstring cites exists in the
repository, and none points outside it (``../shared/…`` was a sibling checkout only the
authors had).

What counts as a pointer:

* a markdown link ``[x](path#anchor)`` (relative to the .md file; ``#anchor`` a heading's
  GitHub slug in the target);
* a repository path ``deploy/…``, ``coeffd/…``, ``bench/…``, ``tests/…``, ``helm/…``,
  ``docs/…``, ``.ci/…`` anywhere in a text file (relative to the repository root; a path
  with a placeholder such as ``<id>``, ``*`` or ``{…}`` is a pattern, not a pointer);
* a section cited by name: ``README "Settings"``, ``README's "Measured"``, ``(README,
  Settings)``, ``CONTRIBUTING.md, "Metric names"``, ``README § Kubernetes``: a heading of
  that README (the nearest one up from the citing file) or of CONTRIBUTING.md starts with it;
* ``../`` out of the repository, and "spec §N" in a doc or manifest (the specifications
  are not in this repository: docs/ARCHITECTURE.md says what the code's citations of them
  mean).
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TEXT_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".toml", ".tpl", ".txt", ".json", ".cfg"}
TEXT_NAMES = {"Makefile", "Dockerfile", "run", ".gitignore"}
#: Inputs and fixtures, not prose: never pointers.
SKIP = ("tests/receivers/corpus/", "tests/data/", "tests/deploy/schemas/")
ROOTS = ("deploy", "coeffd", "bench", "tests", "helm", "docs", ".ci")

MD_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
REPO_PATH = re.compile(
    r"(?<![\w./@:-])((?:\.\./)*(?:"
    + "|".join(map(re.escape, ROOTS))
    + r")/[\w.@+-]+(?:/[\w.@+-]*)*)"
)
PLACEHOLDER = re.compile(r"[<>*{}$…\[\]]")
#: Not paths: the chart's pod label key and Helm's chart-relative names of rendered files.
NOT_PATHS = re.compile(r"coeffd/sidecar$|coeffd/templates/")
OUTSIDE = re.compile(r"\.\./shared\b")
#: a README or CONTRIBUTING, with the path before it when one is given
DOC = r"((?:[\w.-]+/)*)(README|CONTRIBUTING)(?:\.md)?"
SECTION = [
    re.compile(DOC + r"(?:'s)?,? \"([^\"\n]+)\""),  # README "Settings", README's "Measured"
    re.compile(r"\(" + DOC + r", ([A-Z][\w ]+)\)"),  # (README, Settings)
    re.compile(DOC + r" § ?([A-Z][\w -]+)"),  # README § Kubernetes
]
#: This file's own examples are not pointers.
SELF = Path(__file__).resolve()
SPEC_SECTION = re.compile(r"\bspec\b[^\n]{0,40}§\s?\d")


@cache
def files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [
        REPO / f
        for f in sorted(set(out))
        if not f.startswith(SKIP)
        and (Path(f).suffix in TEXT_SUFFIXES or Path(f).name in TEXT_NAMES)
        and (REPO / f).is_file()
        and (REPO / f).resolve() != SELF
    ]


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower()) if "`" in heading else heading
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def headings(path: Path) -> list[str]:
    if not path.is_file():
        return []
    out, fence = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"#{1,6} (.+)", line)):
            out.append(m.group(1).strip())
    return out


def candidates(prefix: str, name: str, start: Path) -> list[Path]:
    """The files ``prefix + name`` cited from ``start`` may mean: the path when one is
    given; for a bare ``README`` the nearest README.md up the tree (the chart's for a chart
    file) and the repository's; CONTRIBUTING is the repository's."""
    if prefix:
        return [REPO / prefix / f"{name}.md"]
    if name == "CONTRIBUTING":
        return [REPO / "CONTRIBUTING.md"]
    for d in [start.parent, *start.parent.parents]:
        if (d / "README.md").is_file():
            return [d / "README.md", REPO / "README.md"]
    return [REPO / "README.md"]


def problems(path: Path) -> list[str]:
    rel = path.relative_to(REPO).as_posix()
    text = path.read_text(errors="replace")
    found: list[str] = []
    is_md = path.suffix == ".md"
    for lineno, line in enumerate(text.splitlines(), 1):
        where = f"{rel}:{lineno}"
        if is_md:
            for target in MD_LINK.findall(line):
                if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                    continue
                file_part, _, anchor = target.partition("#")
                dest = (path.parent / file_part).resolve() if file_part else path
                if REPO not in [dest, *dest.parents] or not dest.exists():
                    found.append(f"{where}: link to missing {target}")
                elif anchor and anchor not in {slug(h) for h in headings(dest)}:
                    found.append(f"{where}: no heading #{anchor} in {dest.relative_to(REPO)}")
        for cited in REPO_PATH.findall(line):
            cited = cited.rstrip(".")
            if PLACEHOLDER.search(cited) or NOT_PATHS.match(cited):
                continue
            if "__pycache__" in cited.split("/"):  # bytecode: made by running, never in git
                continue
            # ``../x`` is relative to the citing file, a bare repository path to the root
            dest = ((path.parent if cited.startswith("../") else REPO) / cited).resolve()
            if REPO not in [dest, *dest.parents]:
                found.append(f"{where}: points outside the repository: {cited}")
            elif not dest.exists():
                found.append(f"{where}: no such file: {cited}")
        if OUTSIDE.search(line):
            found.append(f"{where}: points outside the repository: {line.strip()[:80]}")
        if (is_md or rel.startswith(("deploy/", "helm/"))) and SPEC_SECTION.search(line):
            found.append(
                f"{where}: cites a specification outside the repository: {line.strip()[:80]}"
            )
    # sections are cited across line breaks too: comment and docstring lines joined
    joined = re.sub(r"[ \t]*\n[ \t]*(?:#+[ \t]*|//[ \t]*)?", " ", text)
    for pattern in SECTION:
        for prefix, doc, section in pattern.findall(joined):
            targets = candidates(prefix, doc, path)
            wanted = section.lower().strip()
            if not any(h.lower().startswith(wanted) for t in targets for h in headings(t)):
                found.append(f'{rel}: no section "{section}" in {targets[0].relative_to(REPO)}')
    return found


#: Broken pointers in helm/, which another change is editing (issue 33, item 10): named here
#: (path, what, without line numbers) until the chart's files are fixed; each must still be
#: found, so a fixed one fails the test until it is removed from this list.
HELM_PENDING: set[str] = set()


def test_every_pointer_resolves_inside_the_repository() -> None:
    found = {re.sub(r"^([^:]+):\d+:", r"\1:", p) for f in files() for p in problems(f)}
    assert not found - HELM_PENDING, "\n".join(sorted(found - HELM_PENDING))
    assert found >= HELM_PENDING, f"fixed, remove from HELM_PENDING: {HELM_PENDING - found}"


@pytest.mark.parametrize(
    ("line", "bad"),
    [
        ("Read first: `../shared/design/ARCHITECTURE.md`", True),
        ("see `deploy/kubernetes/otel-collector.yaml`", True),
        ("see `deploy/otel-collector/kubernetes.yaml`", False),
        ("never `coeffd/daemon/__pycache__/cli.cpython-311.pyc`", False),
        ("snapshots in `snapshot_dir/<id>/latest.json`", False),
        ("most of the series (README, Settings).", True),
        ('what bench says (README "Measured")', False),
        ('see helm/coeffd/README.md, "Image"', False),
        ('see helm/coeffd/README.md, "Imagery"', True),
        ("`coeffd/sidecar: <release>` label", False),
        ("[bench](bench/README.md#sampling--what-each-step-sampling-rate-buys)", False),
        ("[bench](bench/README.md#no-such-heading)", True),
        ("[x](docs/NOPE.md)", True),
        ("spec §5.1 says", True),
    ],
)
def test_the_checker_finds_what_it_should(tmp_path: Path, line: str, bad: bool) -> None:
    doc = REPO / "CHECKER_PROBE.md"
    try:
        doc.write_text(line + "\n")
        assert bool(problems(doc)) == bad, problems(doc)
    finally:
        doc.unlink()


def test_every_alert_links_a_runbook_section_in_the_repository() -> None:
    """``runbook_url`` on every alert (issue 33, item 13): a repository file and one of its
    headings (the chart prefixes ``prometheusRule.runbookBaseUrl``)."""
    import yaml

    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "coeffd-alerts.yaml").read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 20
    for rule in alerts:
        url = rule.get("annotations", {}).get("runbook_url", "")
        file_part, _, anchor = url.partition("#")
        assert file_part and anchor, f"{rule['alert']}: runbook_url {url!r}"
        assert (REPO / file_part).is_file(), f"{rule['alert']}: no file {file_part}"
        assert anchor in {slug(h) for h in headings(REPO / file_part)}, (rule["alert"], url)
