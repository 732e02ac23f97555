"""appshell.inputs: regular files only, size limits, bounded JSON nesting; never a hang."""

import json
import os

import pytest

from appshell.inputs import (
    InputFileError,
    check_regular_file,
    json_depth,
    load_json,
    loads_json,
    read_bytes,
)


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(InputFileError, match="FIFO"):
        read_bytes(fifo)  # a plain open() would block here forever
    with pytest.raises(InputFileError, match="FIFO"):
        load_json(fifo)
    with pytest.raises(InputFileError, match="FIFO"):
        check_regular_file(fifo)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_devices_and_symlinks_to_them_are_refused(tmp_path, device):
    link = tmp_path / "asset.ply"
    link.symlink_to(device)
    for p in (device, link):
        with pytest.raises(InputFileError, match="character device"):
            read_bytes(p)


def test_directory_missing_and_size_limit(tmp_path):
    with pytest.raises(InputFileError, match="directory"):
        read_bytes(tmp_path)
    with pytest.raises(InputFileError, match=r"cannot read .*No such file"):
        read_bytes(tmp_path / "nope")
    f = tmp_path / "f.bin"
    f.write_bytes(b"x" * 100)
    assert read_bytes(f, max_bytes=100) == b"x" * 100
    with pytest.raises(InputFileError, match="100 bytes is over the 99-byte limit"):
        read_bytes(f, max_bytes=99)


def test_json_depth_ignores_brackets_in_strings():
    assert json_depth('{"a": "[[[[{{{", "b": [1, [2]]}') == 3
    assert json_depth(r'["\"[[[", []]') == 2
    assert json_depth("3") == 0


def test_deep_json_is_one_line_error_not_recursion(tmp_path):
    deep = "[" * 200_000 + "]" * 200_000
    with pytest.raises(InputFileError, match="nested 200000 levels deep; the limit is 64"):
        loads_json(deep, source="x.json")
    p = tmp_path / "deep.json"
    p.write_text('{"ranks": ' + deep + "}")
    with pytest.raises(InputFileError, match=r"deep\.json: JSON nested"):
        load_json(p)
    ok = "[" * 64 + "]" * 64
    assert loads_json(ok) is not None


def test_json_size_limit_and_bad_json(tmp_path):
    with pytest.raises(InputFileError, match="over the 10 limit"):
        loads_json('{"a": 123456789}', max_bytes=10)
    with pytest.raises(InputFileError, match="not valid JSON"):
        loads_json("{", source="s")
    p = tmp_path / "x.json"
    p.write_bytes(b"\xff\xfe{")
    with pytest.raises(InputFileError):
        load_json(p)
    p.write_text(json.dumps({"ranks": [[1, 2], [3]]}))
    assert load_json(p) == {"ranks": [[1, 2], [3]]}
