"""Headless Chromium driven by Playwright, for the inspect page's browser test and
its screenshot in the docs.

`make test` installs Debian's `chromium` (apt) and Playwright (pip) on a fresh
machine; `chromium_path()` finds the browser (`$CHROMIUM`, then `chromium` or
`chromium-browser` on the PATH) and `browser_missing()` says why none can run.
"""

from __future__ import annotations

import contextlib
import os
import shutil

# Chromium's flags on a machine without a screen, a sandbox or a network: without
# the background-networking ones it keeps dialling Google's hosts, refused here.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")


def chromium_path() -> str | None:
    """The Chromium executable: `$CHROMIUM`, or `chromium` / `chromium-browser` on the PATH."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    return shutil.which("chromium") or shutil.which("chromium-browser")


def browser_missing() -> str | None:
    """Why no browser test can run here (None: one can)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (pip install -r requirements.txt; make test does)"
    if not chromium_path():
        return ("no Chromium: install Debian's chromium (apt-get install chromium; make test does where it runs as "
                "root) or set CHROMIUM to a Chromium executable")
    return None


@contextlib.contextmanager
def chromium_page(width: int = 1400, height: int = 1000):
    """A Playwright page in a fresh headless Chromium (closed on exit)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=list(FLAGS))
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()
