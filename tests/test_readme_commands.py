"""Every command in README.md and docs/*.md runs exactly as written from a fresh clone.

For each of those files, in a scratch directory of its own that holds only what a clone has
(src/, docs/, configs/, benchmarks/, scripts/), each line of each ```bash block and each
```python block runs in the file's order. Fast commands (`knapformer simulate` of 200 steps
included) are run and must exit 0. Long ones (`LONG` below, each with the reason it is not run:
training, calibration, the full evaluation, servers, benchmarks, setup and test scripts) are
checked without running them: the script exists, or the sub-command and every `--option` on the
line exist (asked of the CLI itself, or of the script's `--help`). No line may contain
`[--optional]` brackets or `a|b` alternatives.
Blocks fenced as ```python fragment (the knapformer sketches, which need a process group and a
data loader) are only compiled, and must say why on their first line (`# fragment: REASON`).
Other fences may only be data (```text, ```toml, ```json, or none), never commands under another
name (```sh, ```console ...), so no command block escapes this test.
"""

import functools
import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
CLONE = ("src", "docs", "configs", "benchmarks", "scripts", "pyproject.toml")
# Command prefixes that are checked, not run, and why.
LONG = {
    "bash scripts/": "sets up .venv, then runs the demo, the whole suite or the GPU check",
    "knapformer train": "trains the MMDiT (minutes)",
    "knapformer calibrate": "times the MMDiT's blocks (minutes)",
    "torchrun ": "launches training ranks",
    "python benchmarks/": "benchmarks take minutes to hours",
    "python -m pytest": "runs tests (the suite's own job)",
    "python -m splatpainter.demo": "the demo, which scripts/demo.sh runs",
    "splatpainter train": "trains the editor (minutes to an hour)",
    "splatpainter evaluate": "the full evaluation (minutes)",
    "splatpainter serve": "a server that runs until stopped",
}
DATA_FENCES = ("text", "toml", "json", "")
_FENCE = re.compile(r"^```([\w-]*)( fragment)?[ \t]*\n(.*?)^```", re.S | re.M)


def doc_items(path: Path = README) -> list[tuple[str, str]]:
    """(kind, text) in file order: ("bash", one command line), ("python", a block) or
    ("fragment", a block)."""
    items = []
    for lang, extra, body in _FENCE.findall(path.read_text()):
        if lang == "python":
            if extra:
                assert body.startswith("# fragment: "), (
                    f"{path.name}: a python fragment must say why it is not run on its first "
                    f"line (# fragment: REASON):\n{body[:200]}"
                )
            items.append(("fragment" if extra else "python", body))
        elif lang == "bash":
            assert not extra, f"{path.name}: only python blocks may be fragments"
            for line in body.replace("\\\n", " ").splitlines():
                if shlex.split(line, comments=True):
                    items.append(("bash", line))
        else:
            assert lang in DATA_FENCES and not extra, (
                f"{path.name}: a ```{lang} block is neither run nor data; fence commands as "
                f"```bash or ```python"
            )
    return items


def readme_items() -> list[tuple[str, str]]:
    return doc_items(README)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env["NO_COLOR"] = "1"
    return env


def _cli_options(program: str, words: list[str]) -> tuple[object, list[str]]:
    """The click command a knapformer/splatpainter line names, and the words after it."""
    import typer.main

    if program == "knapformer":
        from knapformer.cli import app
    else:
        from splatpainter.cli import app
    cmd = typer.main.get_command(app)
    rest = list(words)
    while rest and hasattr(cmd, "commands") and rest[0] in cmd.commands:
        cmd = cmd.commands[rest.pop(0)]
    assert not hasattr(cmd, "commands"), f"{program} {' '.join(words)}: no such sub-command"
    return cmd, rest


@functools.cache
def _help_text(target: tuple[str, ...]) -> str:
    """`python TARGET --help`, asked once per test process."""
    out = subprocess.run(
        [sys.executable, *target, "--help"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, f"{' '.join(target)} --help failed: {out.stderr[-500:]}"
    return out.stdout


def _check_options(line: str, words: list[str]) -> None:
    """The sub-command and every --option of a knapformer / splatpainter / python / torchrun
    line exist; other programs (bash, ...) are left to run."""
    program = words[0]
    if program in ("knapformer", "splatpainter"):
        cmd, rest = _cli_options(program, words[1:])
        known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}  # type: ignore[attr-defined]
        help_text = None
    elif program in ("python", "torchrun"):
        if program == "torchrun":
            target = ["-m", words[words.index("-m") + 1]]
            rest = words[words.index("-m") + 2 :]
        elif words[1] == "-m":
            target, rest = words[1:3], words[3:]
        else:
            target, rest = words[1:2], words[2:]
        help_text, known = _help_text(tuple(target)), set()
    else:
        return
    for w in rest:
        if w.startswith("--"):
            opt = w.split("=", 1)[0]
            ok = opt in known if help_text is None else opt in help_text
            assert ok, f"line {line!r}: unknown option {opt}"


def _run_doc(path: Path, clone: Path) -> list[str]:
    """Run (or check, or compile) every item of one file in `clone`; the lines that ran."""
    ran = []
    for kind, text in doc_items(path):
        if kind == "fragment":
            compile(text, f"{path.name} fragment", "exec")
            continue
        if kind == "python":
            out = subprocess.run(
                [sys.executable, "-c", text],
                cwd=clone, env=_env(), capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            assert out.returncode == 0, f"{path.name}: python block failed:\n{out.stderr[-2000:]}"
            ran.append("python block")
            continue
        line = text.split("#", 1)[0].strip() if " #" in text else text.strip()
        assert not re.search(r"\[-|\w\|\w", line), (
            f"{path.name}: line is not runnable as written: {line}"
        )
        words = shlex.split(line)
        if line.startswith(tuple(LONG)):
            if words[0] == "bash":
                assert (ROOT / words[1]).is_file(), line
            else:
                _check_options(line, words)
            continue
        _check_options(line, words)
        out = subprocess.run(
            words, cwd=clone, env=_env(), capture_output=True, text=True, timeout=600
        )
        assert out.returncode == 0, f"{path.name}: command failed: {line}\n{out.stderr[-2000:]}"
        ran.append(line)
    return ran


@pytest.mark.slow
@pytest.mark.timeout(1200)  # up to ~15 CLI processes per file, each importing torch
@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_doc_commands_run_as_written(doc, tmp_path):
    clone = tmp_path / "clone"
    clone.mkdir()
    for name in CLONE:
        (clone / name).symlink_to(ROOT / name)
    ran = _run_doc(doc, clone)
    if doc == README:  # the quick starts: a plan, and an edit from a render
        assert any(r.startswith("splatpainter edit") for r in ran), ran
        assert any(r.startswith("knapformer plan") for r in ran), ran
        assert (clone / "edited.ply").is_file() and (clone / "renders_edited").is_dir()


def test_docs_are_all_checked_and_linked():
    """Every docs/*.md page is in DOCS, its fences parse, its pictures are PNG files and its
    links to other pages resolve; README links every page."""
    assert {d.name for d in DOCS[1:]} >= {
        "knapformer.md", "splatpainter.md", "benchmarks.md", "design.md"
    }  # fmt: skip
    readme = README.read_text()
    for doc in DOCS:
        doc_items(doc)
        text = doc.read_text()
        for p in re.findall(r"!\[[^\]]+\]\(([^)]+)\)", text):
            f = doc.parent / p
            assert f.is_file() and f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", (doc.name, p)
        for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", text):
            assert (doc.parent / target).is_file(), (doc.name, target)
        if doc != README:
            assert f"docs/{doc.name}" in readme, f"README does not link docs/{doc.name}"


def test_readme_names_the_two_commands_ci_runs():
    """The README's two commands, as written; CI runs the second one exactly."""
    lines = [t for k, t in readme_items() if k == "bash"]
    assert any(t.startswith("bash scripts/demo.sh ") for t in lines), lines
    assert any(t.startswith("bash scripts/test.sh ") for t in lines), lines
    assert "\nbash scripts/test.sh\n" in (ROOT / ".ci/run").read_text()


def test_license_is_the_apache_2_text_pyproject_names():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text()


@pytest.mark.slow
@pytest.mark.timeout(600)  # asks each benchmark script for its --help
def test_readme_pictures_and_results_table():
    """A picture (a render and an edit, with the script that rebuilds it) and a results table
    whose every row names the machine it was measured on and a command that exists, with
    options it takes."""
    text = README.read_text()
    pictures = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", text)
    assert "docs/splatpainter_edit.png" in pictures
    for p in pictures:
        assert (ROOT / p).is_file() and (ROOT / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", p
    assert "bash docs/make_figure.sh" in text and (ROOT / "docs/make_figure.sh").is_file()
    table = text.split("## Results", 1)[1].split("\n## ", 1)[0]
    lines = [r for r in table.splitlines() if r.startswith("|")]
    headers = [a for a, b in itertools.pairwise(lines) if b.startswith("|---")]
    rows = [r for r in lines if r not in headers and not r.startswith("|---")]
    assert headers and len(rows) >= 5
    for header in headers:
        assert header.rstrip(" |").split("|")[-2:] == [" machine ", " command"], header
    commands = set()
    for row in rows:
        machine, command = (c.strip() for c in row.rstrip(" |").rsplit("|", 2)[1:])
        assert machine, row  # where the figure was measured (cores, GPU)
        assert re.fullmatch(
            r"`(python benchmarks/\S+|splatpainter \w+|knapformer \w+)[^`]*`", command
        )
        commands.add(command.strip("`"))
    for command in sorted(commands):
        words = shlex.split(command)
        if words[0] == "python":
            assert (ROOT / words[1]).is_file(), command
        _check_options(command, words)
