"""The README is a product page that works: its Python runs as written, it stays short, and the docs cite papers by
author and year rather than by internal file or ticket."""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FIRST_COMMANDS = (
    'bash scripts/setup.sh && .venv/bin/otzoo demo                                                    # set up, run the demo',
    'bash scripts/setup.sh && .venv/bin/python -m pytest -q -n 2 --dist loadfile -m "not slow" tests  # set up, run the tests',
)
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
FORBIDDEN = (re.compile(r"paper 0[0-9]", re.IGNORECASE), re.compile(r"thesis 0[0-9]", re.IGNORECASE),
             re.compile(r"SPEC S"), re.compile(r"issues? [0-9]", re.IGNORECASE))


def code_blocks(text, language):
    """The bodies of the fenced blocks of ``language``, in order."""
    return [body for lang, body in FENCE.findall(text) if lang == language]


def test_readme_is_short_and_starts_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    first_fence = FENCE.search(text)
    assert first_fence is not None and first_fence.group(1) == "bash"
    before = text[:first_fence.start()].strip().splitlines()
    assert before == ["# otzoo"], "the two commands must be the first lines after the title"
    lines = [line.rstrip() for line in first_fence.group(2).splitlines() if line.strip()]
    assert lines[:2] == list(FIRST_COMMANDS)


DOCS = [README] + sorted((ROOT / "docs").rglob("*.md"))
# Where a user reads prose: the docs, and the docstrings and comments of the packages, scripts and experiments.
SOURCES = sorted(path for folder in ("ot_layers", "zoo", "training", "export", "explain", "otzoo", "benchmarks",
                                     "experiments", "scripts") for path in (ROOT / folder).rglob("*.py"))
DOC_PATH = re.compile(r"docs/[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md")


def test_docs_cite_papers_not_internal_files_or_tickets():
    files = DOCS + SOURCES
    found = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for pattern in FORBIDDEN:
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {pattern.pattern!r}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


def test_every_docs_page_named_exists():
    """A page named as ``docs/....md`` anywhere in the docs or the code is there (pages have moved before)."""
    missing = sorted({f"{path.relative_to(ROOT)}: {name}" for path in DOCS + SOURCES
                      for name in DOC_PATH.findall(path.read_text(encoding="utf-8")) if not (ROOT / name).exists()})
    assert not missing, missing


RESULT_PATH = re.compile(r"(?:benchmarks|experiments)/results/[A-Za-z0-9_./-]+\.(?:json|log|csv|md|png|txt)\b")


def test_every_result_file_named_in_the_docs_is_in_the_repository():
    """The evidence a page cites (a benchmark's JSON, an experiment's log) is committed where the page says."""
    named = {(path.relative_to(ROOT).as_posix(), name) for path in DOCS
             for name in RESULT_PATH.findall(path.read_text(encoding="utf-8"))}
    assert len(named) > 20  # the pattern finds what the pages cite
    missing = sorted(f"{page}: {name}" for page, name in named if not (ROOT / name).is_file())
    assert not missing, missing


def test_docs_code_fences_are_closed():
    """An unclosed fence turns the rest of a page into one code block."""
    unclosed = [str(path.relative_to(ROOT)) for path in DOCS
                if sum(line.lstrip().startswith("```") for line in path.read_text(encoding="utf-8").splitlines()) % 2]
    assert not unclosed, unclosed


def test_readme_links_point_to_existing_files():
    text = README.read_text(encoding="utf-8")
    missing = [target for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
               if "://" not in target and not (ROOT / target).exists()]
    assert not missing, missing


def run_blocks(blocks, source, tmp_path):
    """Runs ``blocks`` (python code of the page ``source``), in order and in one namespace, in a fresh interpreter
    from the empty folder ``tmp_path/work``, which it returns; fails with the script's output unless it exits 0."""
    script = tmp_path / "doc_blocks.py"  # not named after a package the blocks import (explain, export)
    script.write_text("\n\n".join(f"# --- {source} python block {i + 1}\n{body}" for i, body in enumerate(blocks)),
                      encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    result = subprocess.run([sys.executable, str(script)], cwd=work, env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-6000:]}"
    return work


@pytest.mark.slow  # a fresh interpreter runs every block: a minute or more on two cores
@pytest.mark.fashion_mnist
def test_readme_python_runs_as_written(tmp_path):
    """Every ```python block of README.md, in order, in one namespace, in a fresh interpreter (the blocks that need
    the ``export`` extra included), from an empty working directory."""
    blocks = code_blocks(README.read_text(encoding="utf-8"), "python")
    assert blocks, "README.md has no python block"
    work = run_blocks(blocks, "README.md", tmp_path)
    assert (work / "served" / "1" / "saved_model.pb").is_file()
    assert (work / "model.onnx").is_file()


def _pages_with_python():
    """The docs pages with a ```python block, each marked ``fashion_mnist`` when its code reads the data set."""
    pages = [path for path in sorted((ROOT / "docs").rglob("*.md"))
             if code_blocks(path.read_text(encoding="utf-8"), "python")]
    return [pytest.param(path, id=path.stem,
                         marks=[pytest.mark.fashion_mnist] if "load_fashion_mnist" in path.read_text("utf-8") else [])
            for path in pages]


@pytest.mark.slow  # a fresh interpreter per page: 10-45 s each on two cores
@pytest.mark.parametrize("page", _pages_with_python())
def test_docs_python_runs_as_written(page, tmp_path):
    """Every ```python block of a docs page, in order, in one namespace, in a fresh interpreter, from an empty working
    directory: the code a user copies runs (a log path relative to the repository failed from anywhere else). A
    fragment of a larger script that cannot run alone (a worker's first lines, which need the cluster's TF_CONFIG)
    is fenced as ```py instead, which renders the same."""
    run_blocks(code_blocks(page.read_text(encoding="utf-8"), "python"), page.name, tmp_path)


def _headline_in_readme(card):
    """How the README's preset table states a card's headline test metric."""
    metrics = card["metrics"]
    if card["task"] == "classification":
        return f"accuracy {metrics['accuracy']:.4f}"
    if card["task"] == "retrieval":
        return f"MAP@R {metrics['map_at_r']:.4f}"
    one_shot = metrics["5way_1shot"]
    return f"5-way 1-shot {100 * one_shot['mean']:.2f} ± {100 * one_shot['ci95']:.2f} %"


def test_readme_preset_table_states_each_packaged_cards_headline_metric():
    """Every packaged preset has a row in the README's table, and the row gives the headline metric its card states:
    a preset retrained, or shipped from the GPU runs, must bring the table along."""
    rows = dict(re.findall(r"^\| `(\w+)` \| [^|]+\| ([^|]+?) \|", README.read_text(encoding="utf-8"), re.MULTILINE))
    for card_path in sorted((ROOT / "zoo" / "presets").glob("*/metadata.json")):
        card = json.loads(card_path.read_text(encoding="utf-8"))
        name = card_path.parent.name
        assert name in rows, f"README.md's preset table has no row for {name}"
        assert rows[name] == _headline_in_readme(card), (name, rows[name], card["metrics"])
