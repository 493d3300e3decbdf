"""Packaging checks that need no network: the mixed install with the original smdebug, the
metadata files. (Installing into a numpy 1.x environment: tests/packaging.)"""
import os
import shutil
import subprocess
import sys

# the folder of the project's brief beside the repository (spelled in parts: this file checks for it)
OUTSIDE_DOCS = "/".join(("..", "shared", ""))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_import_beside_the_original_smdebug_fails_saying_what_to_uninstall(tmp_path):
    site = tmp_path / "site"
    ours = site / "smdebug"
    shutil.copytree(os.path.join(REPO, "smdebug_core"), ours,
                    ignore=shutil.ignore_patterns("__pycache__"))
    # What `pip install smdebug==1.0.34` adds to the same folder (a few of its files; our own
    # core/ and profiler/ hold 1.0.34's import paths, so only its other files tell).
    (ours / "core" / "tfevent").mkdir()
    (ours / "core" / "tfevent" / "__init__.py").write_text("")
    (ours / "profiler" / "python_profiler.py").write_text("")
    (site / "smdebug-1.0.34.dist-info").mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("SMDEBUG_CONFIG_FILE_PATH", None)
    done = subprocess.run([sys.executable, "-c", "import smdebug; print(smdebug.__file__)"], env=env,
                          capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert done.returncode != 0, done.stdout
    assert "ImportError: the original SageMaker Debugger package 'smdebug' is installed" in done.stderr
    assert "smdebug-1.0.34.dist-info" in done.stderr and os.path.join(str(ours), "core", "tfevent") in done.stderr
    assert "pip uninstall -y smdebug smdebug-core, then install smdebug-core again" in done.stderr
    assert "(pip install . in its checkout)" in done.stderr
    # Without the original's files the same copy imports.
    shutil.rmtree(ours / "core" / "tfevent")
    os.remove(ours / "profiler" / "python_profiler.py")
    done = subprocess.run([sys.executable, "-c", "import smdebug; print(smdebug.__file__)"], env=env,
                          capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(ours / "__init__.py")


def test_license_and_type_marker_are_shipped():
    text = open(os.path.join(REPO, "LICENSE")).read()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert os.path.isfile(os.path.join(REPO, "smdebug_core", "py.typed"))
    cfg = open(os.path.join(REPO, "setup.cfg")).read()
    assert "smdebug = py.typed" in cfg and "license_files = LICENSE" in cfg and "examples = scikit-learn" in cfg


def test_version_sorts_after_the_original_it_succeeds():
    """Code that checks ``smdebug.__version__`` (``>= 1.0``) must see a successor of 1.0.34."""
    import smdebug

    ours = tuple(int(p) for p in smdebug.__version__.split(".")[:3])
    assert ours > (1, 0, 34) and smdebug.__version__ > "1.0.34"


def test_every_format_citation_names_a_section_of_docs_format():
    """Comments cite docs/format.md by section: each cited section must exist (and nothing
    may cite a file outside the repository instead)."""
    import re

    doc = open(os.path.join(REPO, "docs", "format.md")).read()
    sections = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", doc, flags=re.M))
    cited, outside = set(), []
    for folder in ("smdebug_core", "adapters", "tests", "benchmarks", "docs", "README.md", "tox.ini"):
        path = os.path.join(REPO, folder)
        files = [path] if os.path.isfile(path) else [
            os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith((".py", ".md", ".ini"))]
        for name in files:
            if os.path.basename(name) == "test_packaging.py":
                continue  # this test names what it looks for
            text = open(name, encoding="utf-8").read()
            for match in re.finditer(r"docs/format\.md (?:section )?(\d+(?:\.\d+)?)(?:[-–](\d+(?:\.\d+)?))?", text):
                cited.update(g for g in match.groups() if g)
            if OUTSIDE_DOCS in text or re.search(r"\bFORMAT(\.md)? \d", text):
                outside.append(name)
    assert cited and not (cited - sections), sorted(cited - sections)
    assert outside == [], outside
