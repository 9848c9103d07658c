"""Every relative link in the README and the docs resolves to a file or folder of the repository:
a user's clone has nothing outside it (the design document included, docs/design.md)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target)


def relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(page.read_text()) if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_stay_inside_the_repository(page: Path) -> None:
    bad = []
    for target in relative_links(page):
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            bad.append(target)
    assert not bad, f"{page.relative_to(ROOT)}: links outside the repository or to nothing: {bad}"


def test_the_readme_links_the_design_document() -> None:
    assert "docs/design.md" in relative_links(ROOT / "README.md")
