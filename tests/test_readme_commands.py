"""Every command in README.md runs exactly as written from a fresh clone.

Each line of each ```bash block, and each ```python block, in README order, in a scratch
directory that holds only what a clone has (src/, docs/, configs/, benchmarks/, scripts/).
Fast commands (`knapformer simulate` of 200 steps included) are run and must exit 0. Long ones
(training, calibration, the full evaluation, servers, benchmarks, setup scripts; `LONG` below)
are checked without running them: the script exists,
or the sub-command and every `--option` on the line exist (asked of the CLI itself, or of the
script's `--help`). No line may contain `[--optional]` brackets or `a|b` alternatives.
Blocks fenced as ```python fragment (the knapformer sketches, which need a process group and a
data loader) are only compiled.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CLONE = ("src", "docs", "configs", "benchmarks", "scripts", "pyproject.toml")
LONG = (
    "bash scripts/",
    "knapformer train",
    "knapformer calibrate",
    "torchrun ",
    "python benchmarks/",
    "python -m splatpainter.demo",
    "splatpainter train",
    "splatpainter evaluate",
    "splatpainter serve",
)


def readme_items() -> list[tuple[str, str]]:
    """(kind, text) in README order: ("bash", one command line) or ("python", a block)."""
    items = []
    for lang, extra, body in re.findall(
        r"```(\w*)( fragment)?\n(.*?)```", README.read_text(), re.S
    ):
        if lang == "python":
            items.append(("fragment" if extra else "python", body))
        elif lang == "bash":
            for line in body.replace("\\\n", " ").splitlines():
                if shlex.split(line, comments=True):
                    items.append(("bash", line))
    return items


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


def _check_options(line: str, words: list[str]) -> None:
    program = words[0]
    if program in ("knapformer", "splatpainter"):
        cmd, rest = _cli_options(program, words[1:])
        known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}  # type: ignore[attr-defined]
        help_text = None
    else:
        if program == "torchrun":
            target = ["-m", words[words.index("-m") + 1]]
            rest = words[words.index("-m") + 2 :]
        elif words[1] == "-m":
            target, rest = words[1:3], words[3:]
        else:
            target, rest = words[1:2], words[2:]
        out = subprocess.run(
            [sys.executable, *target, "--help"],
            cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert out.returncode == 0, f"{line}: --help failed: {out.stderr[-500:]}"
        help_text, known = out.stdout, set()
    for w in rest:
        if w.startswith("--"):
            opt = w.split("=", 1)[0]
            ok = opt in known if help_text is None else opt in help_text
            assert ok, f"README line {line!r}: unknown option {opt}"


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~15 CLI processes, each importing torch
def test_readme_commands_run_as_written(tmp_path):
    clone = tmp_path / "clone"
    clone.mkdir()
    for name in CLONE:
        (clone / name).symlink_to(ROOT / name)
    items = readme_items()
    assert len(items) > 20
    ran = []
    for kind, text in items:
        if kind == "fragment":
            compile(text, "README fragment", "exec")
            continue
        if kind == "python":
            out = subprocess.run(
                [sys.executable, "-c", text],
                cwd=clone, env=_env(), capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            assert out.returncode == 0, f"README python block failed:\n{out.stderr[-2000:]}"
            ran.append("python block")
            continue
        line = text.split("#", 1)[0].strip() if " #" in text else text.strip()
        assert not re.search(r"\[-|\w\|\w", line), f"README line is not runnable as written: {line}"
        words = shlex.split(line)
        if line.startswith(LONG):
            if words[0] == "bash":
                assert (ROOT / words[1]).is_file(), line
            else:
                _check_options(line, words)
            continue
        _check_options(line, words)
        out = subprocess.run(
            words, cwd=clone, env=_env(), capture_output=True, text=True, timeout=600
        )
        assert out.returncode == 0, f"README command failed: {line}\n{out.stderr[-2000:]}"
        ran.append(line)
    assert any(r.startswith("splatpainter edit") for r in ran), ran
    assert any(r.startswith("knapformer plan") for r in ran), ran
    assert (clone / "edited.ply").is_file() and (clone / "renders_edited").is_dir()


def test_license_is_the_apache_2_text_pyproject_names():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text()


@pytest.mark.slow
@pytest.mark.timeout(600)  # asks each benchmark script for its --help
def test_readme_pictures_and_results_table():
    """A picture (a render and an edit, with the script that rebuilds it) and a results table
    whose every row names a command that exists, with options it takes."""
    text = README.read_text()
    pictures = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", text)
    assert "docs/splatpainter_edit.png" in pictures
    for p in pictures:
        assert (ROOT / p).is_file() and (ROOT / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", p
    assert "bash docs/make_figure.sh" in text and (ROOT / "docs/make_figure.sh").is_file()
    table = text.split("## Results", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in table.splitlines() if r.startswith("| ") and "---" not in r][1:]
    assert len(rows) >= 5
    commands = set()
    for row in rows:
        command = row.rstrip(" |").rsplit("|", 1)[1].strip()
        assert re.fullmatch(
            r"`(python benchmarks/\S+|splatpainter \w+|knapformer \w+)[^`]*`", command
        )
        commands.add(command.strip("`"))
    for command in sorted(commands):
        words = shlex.split(command)
        if words[0] == "python":
            assert (ROOT / words[1]).is_file(), command
        _check_options(command, words)
