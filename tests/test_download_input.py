"""Downloads under bad input: nothing left behind, no escape from the target folder,
no password in any message, clear errors for malformed URLs and stalls.

Every server is the local one on 127.0.0.1 (never the internet).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from _http_server import STALL_BYTES, LocalHTTPServer, serve, unused_port
from easycore.common.network import DownloadError, download_file
from easycore.common.path import HTTPURLHandler, PathManager
from easycore.common.path.errors import InvalidURLError
from easycore.common.path.url import redact_url
from easycore.errors import InvalidArgument

BLOB = os.urandom(100_000)
PASSWORD = "p@ss:word"  # the server's; '@' and ':' must be quoted in a URL


@pytest.fixture
def server() -> Iterator[LocalHTTPServer]:
    with serve({"model.pth": BLOB}) as s:
        yield s


@pytest.fixture
def cache(tmp_path, monkeypatch) -> str:
    path = tmp_path / "cache"
    monkeypatch.setenv("EASYCORE_CACHE", str(path))
    return str(path)


def everything_under(root) -> list[str]:
    """Every file and folder under ``root`` (lock files and empty folders included)."""
    found = []
    for folder, dirs, files in os.walk(root):
        found += [os.path.relpath(os.path.join(folder, n), root) for n in dirs + files]
    return sorted(found)


def with_credentials(server: LocalHTTPServer, path: str, password: str = PASSWORD) -> str:
    host, port = server.server_address[:2]
    return f"http://user:{quote(password, safe='')}@{host}:{port}{path}"


def failing_urls(server: LocalHTTPServer) -> dict[str, str]:
    return {
        "404": server.url("/status/404"),
        "redirect loop": server.url("/loop/model.pth"),
        "truncated": server.url("/truncated/model.pth"),
        "unreachable": f"http://127.0.0.1:{unused_port()}/model.pth",
    }


FAILURES = ["404", "redirect loop", "truncated", "unreachable"]


# ---------------------------------------------------------------- 8: nothing left behind


@pytest.mark.parametrize("failure", FAILURES)
def test_failed_cache_download_leaves_nothing_in_the_cache(server, cache, failure):
    url = failing_urls(server)[failure]
    with pytest.raises(DownloadError):
        PathManager.get_local_path(url)
    assert everything_under(cache) == []  # no file, no .lock, no empty folder


@pytest.mark.parametrize("failure", FAILURES)
def test_failed_cache_download_leaves_an_existing_cache_as_it_was(server, cache, failure):
    PathManager.get_local_path(server.url("/files/model.pth"))
    before = everything_under(cache)
    assert not any(n.endswith(".lock") for n in before)
    with pytest.raises(DownloadError):
        PathManager.get_local_path(failing_urls(server)[failure])
    assert everything_under(cache) == before


@pytest.mark.parametrize("failure", FAILURES)
def test_failed_download_file_leaves_the_folder_as_it_was(server, cache, tmp_path, failure):
    folder = tmp_path / "weights"
    folder.mkdir()
    with pytest.raises(DownloadError):
        download_file(failing_urls(server)[failure], str(folder), "model.pth", progress=False)
    assert everything_under(folder) == []  # no model.pth.lock
    assert everything_under(cache) == []  # nor in the lock area


def test_failed_download_file_removes_the_folder_it_made(server, cache, tmp_path):
    folder = tmp_path / "new" / "weights"
    with pytest.raises(DownloadError):
        download_file(server.url("/status/404"), str(folder), "model.pth", progress=False)
    assert not (tmp_path / "new").exists()


def test_download_file_leaves_no_lock_file(server, cache, tmp_path):
    path = download_file(server.url("/files/model.pth"), str(tmp_path / "d"), progress=False)
    assert everything_under(tmp_path / "d") == ["model.pth"]
    with open(path, "rb") as f:
        assert f.read() == BLOB
    assert everything_under(cache) == []  # the lock area is emptied and removed


# ---------------------------------------------------------------- 9: filename stays in dir


@pytest.mark.parametrize("filename", ["../../x", "../x", "a/b", "/tmp/x", "..", ".", "", "a\0b"])
def test_filename_cannot_leave_dir(server, cache, tmp_path, filename):
    folder = tmp_path / "a" / "b"
    folder.mkdir(parents=True)
    with pytest.raises(InvalidArgument, match="filename"):
        download_file(server.url("/files/model.pth"), str(folder), filename, progress=False)
    assert everything_under(tmp_path) == ["a", os.path.join("a", "b")]
    assert server.hits == {}


# ---------------------------------------------------------------- 10: credentials


def test_basic_auth_from_url_credentials(server, cache, tmp_path, capsys):
    url = with_credentials(server, "/auth/model.pth")
    path = download_file(url, str(tmp_path), progress=True)
    with open(path, "rb") as f:
        assert f.read() == BLOB
    assert "p%40ss" not in capsys.readouterr().err
    local = PathManager.get_local_path(url)
    with open(local, "rb") as f:
        assert f.read() == BLOB
    assert all("ss" not in part for part in local.split(os.sep)[-3:-1])
    assert PathManager.exists(url)


def test_wrong_password_error_hides_it(server, cache, tmp_path, caplog):
    url = with_credentials(server, "/auth/model.pth", password="s3cret-pw")
    caplog.set_level(logging.DEBUG)
    with pytest.raises(DownloadError) as info:
        download_file(url, str(tmp_path), progress=False)
    assert info.value.status == 401
    for text in (str(info.value), info.value.url, repr(info.value.args), caplog.text):
        assert "s3cret" not in text
    assert "user:***@" in str(info.value)
    with pytest.raises(DownloadError) as info:
        PathManager.get_local_path(url)
    assert "s3cret" not in str(info.value)
    assert everything_under(tmp_path) == [] and everything_under(cache) == []


def test_unreachable_host_error_hides_the_password(tmp_path, cache):
    url = f"http://user:s3cret-pw@127.0.0.1:{unused_port()}/model.pth"
    with pytest.raises(DownloadError, match="could not reach") as info:
        download_file(url, str(tmp_path), progress=False, timeout=5)
    assert "s3cret" not in str(info.value) and "s3cret" not in info.value.url
    chained = info.value.__cause__ or info.value.__context__
    assert chained is None or "s3cret" not in str(chained)


def test_malformed_url_error_hides_the_password(tmp_path, cache):
    with pytest.raises(InvalidURLError) as info:
        download_file("http://user:s3cret-pw@host:99999/x", str(tmp_path), progress=False)
    assert "s3cret" not in str(info.value) and "user:***@host:99999" in str(info.value)


def test_credentials_are_not_sent_to_a_redirect_target(server, cache, tmp_path):
    with serve({"model.pth": BLOB}) as other:
        target = other.url("/files/model.pth")
        url = with_credentials(server, f"/away/x?to={quote(target, safe='')}")
        path = download_file(url, str(tmp_path), "model.pth", progress=False)
        with open(path, "rb") as f:
            assert f.read() == BLOB
        assert server.authorizations["/away/x"] is not None
        assert other.authorizations["/files/model.pth"] is None


def test_redact_url():
    assert redact_url("http://u:pw@h/x") == "http://u:***@h/x"
    assert redact_url("http://u:p@w@h/x?q=a@b") == "http://u:***@h/x?q=a@b"
    assert redact_url("https://token@h/x") == "https://***@h/x"
    assert redact_url("http://h/x@y") == "http://h/x@y"


# ---------------------------------------------------------------- 11: malformed URL, stall


@pytest.mark.parametrize(
    "url", ["http://[::1/model.pth", "http://[zz]/model.pth", "http://h:port/x", "http:///x"]
)
def test_malformed_url_is_refused_clearly(cache, tmp_path, url):
    with pytest.raises(InvalidURLError, match="malformed URL") as info:
        download_file(url, str(tmp_path / "d"), "model.pth", progress=False)
    assert isinstance(info.value, ValueError) and isinstance(info.value, InvalidArgument)
    for call in (PathManager.get_local_path, PathManager.exists, HTTPURLHandler().cache_path):
        with pytest.raises(InvalidURLError):
            call(url)
    assert everything_under(tmp_path) == ["cache"] or everything_under(tmp_path) == []
    assert everything_under(cache) == []


def test_stalled_download_reports_the_bytes_received(server, cache, tmp_path):
    url = server.url("/stall/model.pth")
    with pytest.raises(DownloadError) as info:
        download_file(url, str(tmp_path), progress=False, timeout=0.5)
    message = str(info.value)
    assert f"after {STALL_BYTES} of {len(BLOB)} bytes" in message
    assert "stalled" in message and info.value.status == 200
    assert everything_under(tmp_path) == ["cache"] or everything_under(tmp_path) == []
