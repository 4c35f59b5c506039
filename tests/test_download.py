"""download_file against a local HTTP server on 127.0.0.1 (never the internet)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest
from _http_server import LocalHTTPServer, serve, unused_port
from easycore.common.network import DownloadError, download_file
from easycore.errors import InvalidArgument

BLOB = os.urandom(200_000)


@pytest.fixture
def server() -> Iterator[LocalHTTPServer]:
    with serve({"model.bin": BLOB, "a b.txt": b"spaced"}) as s:
        yield s


def leftovers(folder) -> list[str]:
    """Files in ``folder`` other than lock files."""
    return sorted(n for n in os.listdir(folder) if not n.endswith(".lock"))


def test_saves_under_url_basename(server, tmp_path):
    path = download_file(server.url("/files/model.bin"), str(tmp_path / "d"), progress=False)
    assert path == os.path.join(str(tmp_path / "d"), "model.bin")
    with open(path, "rb") as f:
        assert f.read() == BLOB
    assert leftovers(tmp_path / "d") == ["model.bin"]


def test_filename_and_quoted_basename(server, tmp_path):
    path = download_file(server.url("/files/model.bin"), tmp_path, filename="m.pt", progress=False)
    assert path == str(tmp_path / "m.pt")
    assert (tmp_path / "m.pt").read_bytes() == BLOB
    path = download_file(server.url("/files/a%20b.txt"), str(tmp_path), progress=False)
    assert path == os.path.join(str(tmp_path), "a b.txt")
    assert (tmp_path / "a b.txt").read_bytes() == b"spaced"


def test_never_overwrites(server, tmp_path):
    (tmp_path / "model.bin").write_bytes(b"old")
    path = download_file(server.url("/files/model.bin"), str(tmp_path), progress=False)
    assert path == str(tmp_path / "model.bin")
    assert (tmp_path / "model.bin").read_bytes() == b"old"
    assert server.hits == {}


def test_progress_bar_shows_total(server, tmp_path, capsys):
    download_file(server.url("/files/model.bin"), str(tmp_path), progress=True)
    err = capsys.readouterr().err
    assert "100%" in err and "195k" in err  # 200_000 bytes, in KiB


def test_progress_without_length(server, tmp_path, capsys):
    path = download_file(server.url("/nolength/model.bin"), str(tmp_path), progress=True)
    assert open(path, "rb").read() == BLOB
    err = capsys.readouterr().err
    assert "195k" in err and "%" not in err  # a count, no percentage without a total


def test_no_progress_is_silent(server, tmp_path, capsys):
    download_file(server.url("/files/model.bin"), str(tmp_path), progress=False)
    assert capsys.readouterr().err == ""


def test_truncated_download_leaves_nothing(server, tmp_path):
    url = server.url("/truncated/model.bin")
    with pytest.raises(DownloadError, match="truncated") as info:
        download_file(url, str(tmp_path), progress=False)
    assert url in str(info.value)
    assert f"{len(BLOB) // 2} of {len(BLOB)} bytes" in str(info.value)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("status", [403, 404, 503])
def test_http_error(server, tmp_path, status):
    url = server.url(f"/status/{status}")
    with pytest.raises(DownloadError) as info:
        download_file(url, str(tmp_path), filename="x", progress=False)
    assert info.value.status == status and info.value.url == url
    assert f"HTTP {status}" in str(info.value) and url in str(info.value)
    assert isinstance(info.value, OSError)
    assert leftovers(tmp_path) == []


def test_unreachable_host(tmp_path):
    url = f"http://127.0.0.1:{unused_port()}/model.bin"
    with pytest.raises(DownloadError, match="could not reach") as info:
        download_file(url, str(tmp_path), progress=False, timeout=5)
    assert url in str(info.value) and info.value.status is None
    assert leftovers(tmp_path) == []


def test_url_without_basename_needs_filename(server, tmp_path):
    with pytest.raises(InvalidArgument, match="filename"):
        download_file(server.url("/files/"), str(tmp_path), progress=False)


def test_threads_download_once(server, tmp_path):
    url = server.url("/slow/model.bin")
    paths: list[str] = []
    errors: list[BaseException] = []

    def fetch() -> None:
        try:
            paths.append(download_file(url, str(tmp_path), progress=False))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=fetch) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert paths == [str(tmp_path / "model.bin")] * 4
    assert (tmp_path / "model.bin").read_bytes() == BLOB
    assert server.hits["/slow/model.bin"] == 1
