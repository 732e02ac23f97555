"""The one CLI layer as both programs use it: every command that produces results has --json,
no Python type leaks into --help, fixed choices are enums, and progress shows on a terminal
(the renderer's kernel compilation saying that it happens once)."""

import json
import os
import pty
import select
import subprocess
import sys

import pytest
import typer.main
from typer.testing import CliRunner

from knapformer.cli import app as kf_app
from splatpainter.cli import app as sp_app

APPS = {"knapformer": kf_app, "splatpainter": sp_app}
NO_RESULT = {"splatpainter serve"}  # a server: it runs until stopped and prints its URL


def commands():
    """(path, click command) for every leaf command of both programs."""
    out = []

    def walk(path, cmd):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(f"{path} {name}", sub)
        else:
            out.append((path, cmd))

    for name, app in APPS.items():
        walk(name, typer.main.get_command(app))
    return out


def test_every_command_that_produces_results_has_json():
    found = {path for path, _ in commands()}
    assert {"splatpainter session undo", "knapformer plan", "splatpainter render"} <= found
    for path, cmd in commands():
        opts = {o for p in cmd.params for o in p.opts}
        assert ("--json" in opts) != (path in NO_RESULT), path


def test_help_has_no_python_types_and_lists_choices():
    runner = CliRunner()
    for path, _ in commands():
        program, *words = path.split()
        r = runner.invoke(APPS[program], [*words, "--help"])
        assert r.exit_code == 0, path
        for leak in ("list[", "<Path>", "<List", "Optional[", "Mixture."):
            assert leak not in r.stdout, (path, leak)
    helps = {p: runner.invoke(APPS[p.split()[0]], [*p.split()[1:], "--help"]).stdout
             for p in ("knapformer simulate", "knapformer plan", "splatpainter edit")}  # fmt: skip
    assert "--mixture <lowres|mixres|joint>" in helps["knapformer simulate"]
    assert "<local-search|exact|reference|ours>" in helps["knapformer plan"]
    assert "<auto|paint|recolor|relight|detail>" in helps["splatpainter edit"]
    r = runner.invoke(kf_app, ["simulate", "--mixture", "bogus", "--gpus", "8", "--spec", "g1n8"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "bogus" in r.stderr


def test_version_json():
    for name, app in APPS.items():
        r = CliRunner().invoke(app, ["version", "--json"])
        assert r.exit_code == 0 and set(json.loads(r.stdout)) == {"version"}, name


def _terminal_shows(code: str, wanted: list[str], timeout: float = 240) -> str:
    """Run python code with stderr on a pseudo-terminal until every string of wanted has
    appeared there (then stop it); what the terminal showed."""
    master, slave = pty.openpty()
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="120", OMP_WAIT_POLICY="PASSIVE")
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=slave, env=env,
    )  # fmt: skip
    os.close(slave)
    shown = ""
    try:
        while not all(w in shown for w in wanted):
            ready, _, _ = select.select([master], [], [], timeout)
            assert ready, f"nothing on the terminal for {timeout} s: {shown[-2000:]!r}"
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                data = b""
            assert data, f"ended without showing {wanted}: {shown[-2000:]!r}"
            shown += data.decode(errors="replace")
    finally:
        proc.kill()
        proc.wait()
        os.close(master)
    return shown


@pytest.mark.timeout(300)
def test_progress_shows_on_a_terminal_and_kernel_compilation_says_once():
    """A counted bar, then the renderer's warm-up, which says while it runs (compiling, on a
    fresh machine, for about a minute) that this happens once."""
    _terminal_shows(
        "import time\n"
        "from appshell.cli import progress\n"
        "with progress('planning steps', counted=True) as bar:\n"
        "    for i in range(3):\n"
        "        bar(i + 1, 3); time.sleep(0.3)\n"
        "from splatpainter.cli.options import kernel_warmup\n"
        "kernel_warmup()\n"
        "time.sleep(60)\n",
        ["planning steps", "3/3", "renderer kernels: compiled once on first use"],
    )
