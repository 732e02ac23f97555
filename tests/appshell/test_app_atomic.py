"""appshell.atomic: the one atomic-write helper (symlinks, modes, cleanup, named errors)."""

import errno
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from appshell.atomic import (
    atomic_open,
    atomic_write_bytes,
    atomic_write_with,
    check_output_dir,
    check_outputs,
)
from appshell.errors import UserError


def _temps(d):
    return [p for p in os.listdir(d) if p.endswith(".tmp")]


def test_writes_through_a_symlink_to_its_target(tmp_path):
    target = tmp_path / "real.bin"
    target.write_bytes(b"old")
    os.chmod(target, 0o640)
    link = tmp_path / "link.bin"
    link.symlink_to(target)
    atomic_write_bytes(link, b"new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # the target's mode is kept


def test_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.bin"
    link.symlink_to(tmp_path / "missing.bin")
    atomic_write_bytes(link, b"x")
    assert link.is_symlink() and (tmp_path / "missing.bin").read_bytes() == b"x"


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_new_files_get_umask_defaults(tmp_path, mask):
    old = os.umask(mask)
    try:
        atomic_write_bytes(tmp_path / "f", b"x")
        with atomic_open(tmp_path / "t", "w") as f:
            f.write("text")
    finally:
        os.umask(old)
    for name in ("f", "t"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~mask
    assert (tmp_path / "t").read_text() == "text"


def test_exception_leaves_old_file_and_no_temp(tmp_path):
    target = tmp_path / "a.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="boom"), atomic_open(target) as f:
        f.write(b"partial")
        raise RuntimeError("boom")
    assert target.read_bytes() == b"old"
    assert _temps(tmp_path) == []


def test_write_error_names_the_path(tmp_path):
    def no_space(f):
        f.write(b"abc")
        raise OSError(errno.ENOSPC, "No space left on device")

    target = tmp_path / "out.ply"
    with pytest.raises(OSError) as e:
        atomic_write_with(target, no_space)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(target)
    assert not target.exists() and _temps(tmp_path) == []


def test_real_file_size_limit_error_names_the_path(tmp_path):
    """A real write failure (RLIMIT_FSIZE -> EFBIG) comes back naming the file."""
    target = tmp_path / "big.bin"
    code = textwrap.dedent(
        f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        from appshell.atomic import atomic_write_bytes
        try:
            atomic_write_bytes({str(target)!r}, b"x" * 100000)
        except OSError as e:
            print(e.errno, e.filename)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == [str(errno.EFBIG), str(target)], out.stderr
    assert not target.exists() and _temps(tmp_path) == []


def test_sigterm_mid_write_removes_the_temp_file(tmp_path):
    target = tmp_path / "out.bin"
    ready = tmp_path / "ready"
    code = textwrap.dedent(
        f"""
        import pathlib, time
        from appshell.atomic import atomic_open
        with atomic_open({str(target)!r}) as f:
            f.write(b"x" * 1_000_000)
            f.flush()
            pathlib.Path({str(ready)!r}).write_text("1")
            time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        assert len(_temps(tmp_path)) == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM  # still dies by SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _temps(tmp_path) == [] and not target.exists()


def test_check_outputs_refuses_before_writing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    ok = tmp_path / "ok.ply"
    with pytest.raises(UserError, match="is not a directory"):
        check_outputs(ok, blocker / "sub.session")  # the parent is a file
    with pytest.raises(UserError, match="is not a directory"):
        check_outputs(blocker / "a" / "b" / "c.json")
    with pytest.raises(UserError, match="same output file"):
        check_outputs(ok, tmp_path / "." / "ok.ply")
    with pytest.raises(UserError, match="is a directory"):
        check_outputs(tmp_path)
    check_outputs(ok, None, tmp_path / "b.session", tmp_path / "new" / "dir" / "c.json")
    assert sorted(os.listdir(tmp_path)) == ["file"]  # the probes left nothing behind
    atomic_write_bytes(tmp_path / "new" / "dir" / "c.json", b"{}")  # parents are created
    assert (tmp_path / "new" / "dir" / "c.json").read_bytes() == b"{}"
    with pytest.raises(UserError, match="not a directory"):
        check_output_dir(blocker)
    assert check_output_dir(tmp_path / "x" / "y").is_dir()


def test_writing_a_directory_path_is_one_clear_error(tmp_path):
    with pytest.raises(IsADirectoryError) as e:
        atomic_write_bytes(tmp_path, b"x")
    assert e.value.filename == str(tmp_path)


def test_one_helper_for_the_whole_repository():
    import importlib.util

    import splatpainter.io as sp_io
    from appshell import atomic

    assert sp_io.atomic_open is atomic.atomic_open
    assert importlib.util.find_spec("knapformer.fileio") is None  # the second copy is gone
    assert importlib.util.find_spec("splatpainter.io.atomic") is None  # and the re-export
