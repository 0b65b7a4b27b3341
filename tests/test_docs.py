"""The documentation site builds strictly: a broken reference in a docstring page
or a broken link between guides fails it (`make docs` runs the same build)."""

import html
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO


def _mkdocs():
    path = os.path.join(os.path.dirname(sys.executable), "mkdocs")
    if not os.path.exists(path):
        pytest.skip("mkdocs is not installed (requirements.txt pins it)")
    return path


def test_the_site_builds_strictly_with_the_api_reference(tmp_path):
    # (Not -q: quiet mkdocs drops the warnings that --strict counts.)
    done = subprocess.run([_mkdocs(), "build", "--strict", "-d", str(tmp_path / "site")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    page = (tmp_path / "site" / "api" / "search" / "index.html").read_text()
    for cls in ("SoftTopKSearch", "HashSamplingSearch", "FullHistorySearch"):  # rendered from the docstrings
        assert cls in page
    assert "Keeps the K slots with the highest attention scores" in page
    # Python-Markdown needs a blank line before a list: without one the items run on
    # inside the paragraph above them (guides and docstrings alike).
    collapsed = []
    for html_page in (tmp_path / "site").rglob("*.html"):
        for paragraph in re.findall(r"<p>(.*?)</p>", html_page.read_text(), re.S):
            first, *rest = html.unescape(re.sub(r"<[^>]+>", "", paragraph)).splitlines() or [""]
            items = [line.strip() for line in rest if re.match(r"\s*(- |\* |\d+\. )\S", line)]
            if items:
                collapsed.append(f"{html_page.relative_to(tmp_path / 'site')}: {first[:50]!r} runs on into "
                                 f"{items[0][:40]!r}")
    assert not collapsed, collapsed
    bullets = (tmp_path / "site" / "api" / "layers" / "index.html").read_text()
    assert re.search(r"<li><code>shared</code> \(TWIN, DIN\)", bullets)  # BehaviorEmbedding's coupling list


def test_a_broken_reference_fails_the_strict_build(tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(os.path.join(REPO, "docs"), copy / "docs")
    shutil.copy(os.path.join(REPO, "mkdocs.yml"), copy)
    os.symlink(os.path.join(REPO, "dare_tf"), copy / "dare_tf")
    with open(copy / "docs" / "api" / "search.md", "a") as f:
        f.write("\n::: dare_tf.search.NoSuchSearch\n")
    done = subprocess.run([_mkdocs(), "build", "--strict", "-d", str(tmp_path / "site")], cwd=copy,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "NoSuchSearch" in done.stderr, done.stderr[-2000:]
    # A guide linking to a page that does not exist fails it too (a warning, counted by --strict).
    shutil.copy(os.path.join(REPO, "docs", "api", "search.md"), copy / "docs" / "api" / "search.md")
    with open(copy / "docs" / "index.md", "a") as f:
        f.write("\nSee [a missing guide](missing.md).\n")
    done = subprocess.run([_mkdocs(), "build", "--strict", "-d", str(tmp_path / "site")], cwd=copy,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "missing.md" in done.stderr, done.stderr[-2000:]


def test_what_the_guides_commands_write_is_ignored_by_git():
    """Every directory the guides' commands write (`--output_dir=`, `--output=`,
    `--export_base=`, `lmdb:`) is git-ignored, so that following a guide leaves
    `git status` clean."""
    if shutil.which("git") is None or not os.path.isdir(os.path.join(REPO, ".git")):
        pytest.skip("not a git checkout")
    written = set()
    for name in ["README.md"] + [os.path.join("docs", n) for n in os.listdir(os.path.join(REPO, "docs"))]:
        if name.endswith(".md"):
            with open(os.path.join(REPO, name)) as f:
                blocks = f.read().split("\n```")[1::2]  # (the fenced blocks: every other piece)
            for block in blocks:
                written |= set(re.findall(r"(?:--output_dir=|--output=|--export_base=|lmdb:)([A-Za-z_][\w./-]*)",
                                          block))
    written = sorted(path for path in written if path not in ("DIR", "PATH", "h"))
    assert "histories" in written and len(written) > 10, written
    done = subprocess.run(["git", "check-ignore", "--no-index", *(f"{path}/x" for path in written)], cwd=REPO,
                          capture_output=True, text=True)
    ignored = {line.rsplit("/", 1)[0] for line in done.stdout.split()}
    assert [path for path in written if path not in ignored] == []
