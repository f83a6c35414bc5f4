"""The docs a user follows: the site builds with --strict, the CLI reference matches `--help`, README's links
point at files that exist."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from .conftest import REPO


def test_the_site_builds_strict(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stdout + out.stderr  # a broken link, a page left out of the nav, ...
    assert (tmp_path / "site" / "cli" / "index.html").is_file()


def test_the_cli_reference_is_what_help_says():
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import cli_reference
    finally:
        sys.path.remove(str(REPO / "tools"))
    stale = (REPO / "docs" / "cli.md").read_text() != cli_reference.render()
    assert not stale, "docs/cli.md is stale: run `python tools/cli_reference.py`"


def test_readme_links_point_at_files_that_exist():
    text = (REPO / "README.md").read_text()
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t]
    assert targets, "README links into the docs"
    missing = [t for t in targets if not (REPO / t).exists()]
    assert not missing, missing
