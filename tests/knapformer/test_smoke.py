import subprocess
import sys

import knapformer


def test_import_and_cli_help():
    assert knapformer.__version__
    out = subprocess.run(
        [sys.executable, "-m", "knapformer.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "version" in out.stdout
