"""The documentation: the site (mkdocs.yml, docs/) builds in strict mode, so a broken link or
anchor, a page left out of the nav or a missing snippet fails here; the README stays a short front
page whose links all resolve; and the API reference renders every construct constructs_lib exports."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import constructs_lib

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = Path(sys.executable).parent / "mkdocs"  # installed with the dev extras, beside this Python
README_MAX_WORDS = 2000
# [text](target) and ![alt](target), the target up to a space (a title) or the closing parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    assert MKDOCS.exists(), f"{MKDOCS} is missing: install the dev extras (pip install -e '.[dev]')"
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's banner, not a warning of ours
    run = subprocess.run([str(MKDOCS), "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                          "--site-dir", str(out)], check=False, cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout}\n{run.stderr}"
    return out


def test_the_site_builds_strictly_with_every_page(site):
    nav_pages = {p.relative_to(ROOT / "docs").with_suffix("").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    for page in nav_pages:  # index.md -> index.html, x.md -> x/index.html (use_directory_urls)
        built = site / ("index.html" if page == "index" else f"{page.removesuffix('/index')}/index.html")
        assert built.is_file(), page


def test_the_readme_is_a_short_front_page():
    words = len((ROOT / "README.md").read_text().split())  # what `wc -w README.md` counts
    assert words < README_MAX_WORDS, f"README.md has {words} words: move detail into a docs/ page"


def relative_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)  # links inside code blocks are code
    targets = [m.group(1) for m in LINK.finditer(text)]
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


@pytest.mark.parametrize("name", ["README.md", "CONTRIBUTING.md"])
def test_every_relative_link_in_the_front_pages_resolves(name):
    source = ROOT / name
    links = relative_links(source)
    if name == "README.md":
        assert any(t.startswith("docs/") for t in links), "the README links into the docs"
    missing = [t for t in links if not (source.parent / t.split("#", 1)[0]).exists()]
    assert not missing, f"{name}: links to files that do not exist: {missing}"


def test_the_link_finder_finds_links(tmp_path):
    sample = tmp_path / "sample.md"
    sample.write_text('[a](docs/x.md) ![b](docs/y.png "t") [c](https://e.org) [d](#top)\n```\n[e](f.md)\n```\n')
    assert relative_links(sample) == ["docs/x.md", "docs/y.png"]


def documented(html: str, qualified_suffix: str) -> bool:
    """An object mkdocstrings rendered: its heading's id is the object's full path."""
    return re.search(r'id="[\w.]*\b' + re.escape(qualified_suffix) + '"', html) is not None


def test_the_api_reference_renders_every_exported_construct(site):
    html = (site / "api" / "constructs" / "index.html").read_text()
    # documented where each is defined (constructs_lib loads them lazily from their modules)
    missing = [n for n in constructs_lib.__all__ if not re.search(r'id="constructs_lib\.[\w.]+\.' + re.escape(n) + '"', html)]
    assert not missing, f"exported but not in docs/api/constructs.md: {missing} (add '::: constructs_lib.<module>.<name>')"


def test_the_api_reference_renders_the_selector_and_the_checkpointer(site):
    selector_html = (site / "api" / "selector" / "index.html").read_text()
    for name in ("dl_selector.recommend.recommend", "dl_selector.catalog.load_catalog", "dl_selector.profiles.load_profiles"):
        assert documented(selector_html, name), name
    runtime_html = (site / "api" / "runtime" / "index.html").read_text()
    for name in ("Checkpointer", "Checkpointer.should_checkpoint", "Checkpointer.save", "Checkpointer.resume_path"):
        assert documented(runtime_html, f"constructs_lib.runtime.checkpointer.{name}"), name


def test_the_home_page_includes_the_readmes_set_up_as_written(site):
    """docs/index.md takes the set-up section from the README (one copy of the two commands)."""
    text = re.sub(r"<[^>]+>", "", (site / "index.html").read_text())  # highlighting splits code into spans
    assert "bash scripts/demo.sh" in text and "bash scripts/test.sh" in text
    assert "--8&lt;--" not in text


def test_every_mermaid_block_reaches_the_page_as_a_diagram(site):
    """mkdocs-material draws `<pre class="mermaid">` (the superfences custom fence in mkdocs.yml);
    without that fence a ```mermaid block would be shown as highlighted source."""
    for page in sorted((ROOT / "docs").rglob("*.md")):
        blocks = len(re.findall(r"^```mermaid$", page.read_text(), flags=re.M))
        if blocks:
            rel = page.relative_to(ROOT / "docs").with_suffix("").as_posix()
            html = (site / f"{rel}/index.html").read_text()
            assert html.count('<pre class="mermaid">') == blocks, page.name


def test_one_way_to_read_a_jobs_logs():
    """`dl-launcher logs JOB` is the way the pages show; no page shows another command for it (the
    README, your-job.md and the stack's output once showed three)."""
    others = re.compile(r"python -m constructs_lib\.fleet logs|aws logs tail")
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in pages
             for i, line in enumerate(p.read_text().splitlines(), 1) if others.search(line)]
    assert not found, "\n".join(found)
    assert all("dl-launcher logs" in (ROOT / p).read_text() for p in ("README.md", "docs/your-job.md", "docs/cli.md"))
