"""The docs are true: every example marked ``<!-- doc-test: ... -->`` in README.md and docs/ runs
as written (tests/doc_examples.py has the convention), the outputs shown are what a real run prints
now (up to figures and ids), the install text installs, and figures have one home."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from compat_env import fms_model  # noqa: F401  (setup=demo venv=fms: the model transformers 4.55 built)
from doc_examples import (
    DEMO_MODEL,
    DOCS,
    ROOT,
    SETUPS,
    Block,
    all_blocks,
    normalize,
    outputs,
    problems,
    run,
)
from trainer_fixtures import demo_model  # noqa: F401  (setup=demo's model: the run's, built once)

KINDS = {"python", "bash"}
OPTIONS = {"id", "output", "setup", "slow", "creates", "exit", "timeout", "relay", "run", "steps", "experiment",
           "output_dir", "relay_env", "records", "install", "varies", "venv", "skip", *KINDS}
EXAMPLES = [b for b in all_blocks() if not {"output", "install", "skip"} & b.opts.keys()]
#: Docs whose snippets are not held to the rule yet, and why (issue 44 §6).
def test_markers_are_well_formed() -> None:
    blocks = all_blocks()
    assert len(EXAMPLES) >= 5 and outputs(), "the docs lost their runnable examples"
    ids = [b.opts["id"] for b in blocks if "id" in b.opts]
    assert len(ids) == len(set(ids)), f"an example id is used twice: {ids}"
    for block in blocks:
        assert set(block.opts) <= OPTIONS, f"{block.where}: unknown option {set(block.opts) - OPTIONS}"
        assert block.opts.get("setup", "publish") in SETUPS, f"{block.where}: unknown setup"
        assert KINDS & set(block.opts) <= {block.lang}, f"{block.where}: the marker names another language"
        if "output" in block.opts:
            assert block.opts["output"] in ids, f"{block.where}: output of an example that is not there"
        elif "skip" in block.opts:
            assert len(block.opts["skip"]) >= 10, f"{block.where}: skip= must say why the block cannot run"
        elif "install" not in block.opts:
            assert block.lang in KINDS, f"{block.where}: cannot run a {block.lang!r} block"


def test_every_python_and_shell_snippet_is_run_or_says_why_not() -> None:
    """A fenced block of Python or shell (``python``, ``bash``, ``sh``, ``shell``, ``console``, or
    an untagged one that starts with a ``$ `` prompt) has a marker: it is run, it is an output or an
    install block checked against its example, or ``skip="why"`` says why it cannot be run."""
    unmarked = [where for where in snippets() if where not in {b.where for b in all_blocks()}]
    assert not unmarked, ("snippets neither run nor marked <!-- doc-test: skip=\"why\" --> "
                          f"(tests/doc_examples.py): {unmarked}")


SHELLS = {"python", "py", "bash", "sh", "shell", "console", "zsh"}


def snippets() -> list[str]:
    """Where each Python or shell snippet of README.md and docs/ opens (``path:line``)."""
    found = []
    for path in DOCS:
        where = str(path.relative_to(ROOT))
        lines = path.read_text(encoding="utf-8").split("\n")
        i = 0
        while i < len(lines):
            fence = re.match(r"^\s*```(\S*)", lines[i])
            if fence is None:
                i += 1
                continue
            end = next((j for j in range(i + 1, len(lines)) if lines[j].lstrip().startswith("```")), len(lines))
            first = next((line.strip() for line in lines[i + 1:end] if line.strip()), "")
            if fence.group(1) in SHELLS or (not fence.group(1) and first.startswith("$ ")):
                found.append(f"{where}:{i + 1}")
            i = end + 1
    return found


def test_the_snippet_rule_sees_every_kind_it_names() -> None:
    """The rule cannot pass by finding nothing: it finds the docs' runnable examples, the blocks that
    say why they are not run, and a transcript of each kind."""
    found = set(snippets())
    assert {b.where for b in EXAMPLES} <= found
    skipped = [b for b in all_blocks() if "skip" in b.opts]
    assert len(skipped) >= 40 and {b.where for b in skipped} <= found
    assert {b.lang for b in skipped} >= {"python", "bash", ""}


def _param(block: Block):
    return pytest.param(block, id=block.opts.get("id") or block.where.replace("/", "_"),
                        marks=[pytest.mark.slow] if "slow" in block.opts else [])


@pytest.mark.parametrize("block", [_param(b) for b in EXAMPLES])
def test_example_runs_as_written(block: Block, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if block.opts.get("setup") == "demo":  # a copy of the model the run builds once, not a build of its own
        built = "fms_model" if block.opts.get("venv") == "fms" else "demo_model"
        shutil.copytree(request.getfixturevalue(built), tmp_path / DEMO_MODEL)
    result = run(block, tmp_path)
    assert not problems(block, result), problems(block, result)
    shown = outputs().get(block.opts.get("id", ""))
    if shown is not None:
        varies = shown.opts.get("varies", "")
        assert normalize(result.stdout, varies) == normalize(shown.text, varies), (
            f"{shown.where} no longer shows what {block.where} prints; regenerate it with "
            f"python -m tests.doc_examples --write {block.opts['id']}\n--- now:\n{result.stdout}")


def _pip_lines(block: Block) -> list[list[str]]:
    return [shlex.split(line, comments=True) for line in block.text.splitlines() if line.startswith("pip ")]


@pytest.mark.parametrize("block", [_param(b) for b in all_blocks() if "install" in b.opts])
def test_install_text_names_what_the_checkout_has(block: Block) -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert _pip_lines(block), f"{block.where}: no pip command"
    for words in _pip_lines(block):
        for word in words[2:]:
            named = re.fullmatch(r"'?\./\[([a-z,]+)\]'?", word)
            if named:
                assert set(named.group(1).split(",")) <= extras, f"{block.where}: no such extra in {word}"


@pytest.mark.slow  # pip builds the package's metadata (and a wheel)
def test_readme_install_commands_work_in_a_checkout(tmp_path: Path) -> None:
    """Each pip command of README's "Installing without make", as written, in a copy of the
    checkout: ``pip install`` as a dry run against what is installed (nothing is downloaded),
    ``pip wheel`` for real; then the wheel named in its comment installs with [train]."""
    [block] = [b for b in all_blocks() if "install" in b.opts and b.path.name == "README.md"]
    checkout = tmp_path / "checkout"
    for name in subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.splitlines():
        if (ROOT / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, checkout / name)
    quiet = ["--no-build-isolation", "--no-index", "--quiet"]
    for words in _pip_lines(block):
        extra = ["--dry-run"] if words[1] == "install" else []
        done = subprocess.run([sys.executable, "-m", *words, *extra, *quiet], cwd=checkout, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, f"{' '.join(words)}: {done.stderr[-3000:]}"
    wheel = re.search(r"pip install '(dist/[^']+\.whl)\[train\]'", block.text).group(1)
    done = subprocess.run([sys.executable, "-m", "pip", "install", f"{wheel}[train]", "--dry-run", *quiet],
                          cwd=checkout, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_development_quotes_no_test_count_that_drifts() -> None:
    text = (ROOT / "docs" / "development.md").read_text()
    assert not re.search(r"\b\d+ tests\b", text), "say how to count them (pytest --collect-only -q) instead"


def test_benchmark_links_land_on_a_section() -> None:
    """Figures live in docs/benchmarks.md; the other docs link to its sections, which must exist."""
    def anchor(heading: str) -> str:
        return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")

    sections = {anchor(line.lstrip("#")) for line in (ROOT / "docs" / "benchmarks.md").read_text().splitlines()
                if line.startswith("#")}
    for doc in DOCS:
        for target in re.findall(r"benchmarks\.md#([\w\-]+)", doc.read_text()):
            assert target in sections, f"{doc.relative_to(ROOT)}: benchmarks.md#{target} is no section"


def test_every_module_is_on_the_architecture_map() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = [f"{path.parent.name}/{path.name}" for folder in ("relay", "sinks", "trainer")
               for path in sorted((ROOT / folder).glob("*.py"))
               if not path.name.startswith("__") and f"{folder}/{path.name}" not in text]
    assert not missing, f"docs/architecture.md does not name {missing}"
