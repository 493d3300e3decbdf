"""Checks of a report written by ``smdebug report``, shared by the framework tests: every
section present, no external URL, the size bound, and (where chromium is installed) a
headless render with no console message and a screenshot that is not blank.

Test modules import it after ``sys.path.insert(0, <tests/support>)`` (see s3_endpoint.py).
"""
import base64
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

SECTIONS = ("summary", "curves", "heatmaps", "distributions", "findings", "flight-recorder")
MAX_BYTES = 5 * 1000 * 1000
# Anything that would make a browser reach out: a scheme with //, a protocol-relative
# reference in an attribute or CSS, @import.
_EXTERNAL = re.compile(r"(?i)\b(?:https?|ftp|wss?):|(?:src|href|action|srcset)\s*=\s*['\"]?//|url\(|@import")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=0")


def check_report(path):
    """The report's text, after checking what every report must be; returns it."""
    size = os.path.getsize(path)
    assert 0 < size <= MAX_BYTES, f"report is {size} bytes"
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    for section in SECTIONS:
        assert f"<section id='{section}'>" in text, f"section {section} missing"
    found = _EXTERNAL.findall(text)
    assert not found, f"external references in the report: {found[:5]}"
    assert "<script" not in text and "<link" not in text
    for data in re.findall(r'src="data:image/png;base64,([^"]+)"', text):
        assert base64.b64decode(data, validate=True)[:8] == b"\x89PNG\r\n\x1a\n"
    return text


def section(text, name):
    """The HTML of one section."""
    start = text.index(f"<section id='{name}'>")
    return text[start:text.index("</section>", start)]


def chromium():
    """The chromium binary, or skip saying why there is none."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("chromium is not installed (Debian: apt-get install -y chromium; .ci/run installs it)")


def render(html_path, tmp_path, width=1200, height=3000):
    """Render ``html_path`` in headless chromium: (console messages, screenshot as an RGB array)."""
    binary = chromium()
    shot = str(tmp_path / "screenshot.png")
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    proc = subprocess.run([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                           f"--screenshot={shot}", "file://" + os.path.abspath(html_path)],
                          capture_output=True, text=True, timeout=120)
    assert os.path.exists(shot), f"chromium wrote no screenshot (status {proc.returncode}): {proc.stderr[-2000:]}"
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    from PIL import Image

    with Image.open(shot) as image:
        pixels = np.asarray(image.convert("RGB"))
    return console, pixels


def assert_not_blank(pixels):
    """A screenshot with content: many non-white pixels and several colours."""
    nonwhite = (pixels < 240).any(axis=2).mean()
    colours = len(np.unique(pixels.reshape(-1, 3)[::97], axis=0))
    assert nonwhite > 0.05 and colours > 50, f"blank screenshot? {nonwhite:.3f} non-white, {colours} colours"


def image_count(text):
    return len(re.findall(r'src="data:image/png;base64,', text))


__all__ = ["SECTIONS", "MAX_BYTES", "check_report", "section", "chromium", "render", "assert_not_blank",
           "image_count"]
