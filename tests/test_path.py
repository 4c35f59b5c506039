"""PathManager and its handlers: the manual's examples, native files, HTTP cache, redirects,
custom handlers, the fsspec handler. HTTP goes to a local server on 127.0.0.1 only."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator

import pytest
from _http_server import LocalHTTPServer, children, serve, unused_port
from easycore.common.path import (
    DownloadError,
    FsspecPathHandler,
    HTTPURLHandler,
    NativePathHandler,
    PathHandler,
    PathManager,
    PrefixTakenError,
    RedirectPathHandler,
    UnsupportedPathOperation,
)
from easycore.errors import EasycoreError, InvalidArgument

TEXT = "héllo, easycore\nsecond line\n"
BLOB = os.urandom(300_000)


@pytest.fixture(autouse=True)
def registry() -> Iterator[None]:
    """Put PathManager's registry back as it was after each test."""
    before = {p: PathManager.get_handler(p) for p in PathManager.registered_prefixes()}
    yield
    for prefix in PathManager.registered_prefixes():
        if prefix not in before:
            PathManager.unregister(prefix)
    for handler in before.values():
        PathManager.register(handler, override=True)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> str:
    path = tmp_path / "cache"
    monkeypatch.setenv("EASYCORE_CACHE", str(path))
    return str(path)


@pytest.fixture
def server() -> Iterator[LocalHTTPServer]:
    with serve({"yyy.txt": TEXT.encode(), "blob.bin": BLOB, "odd name?.txt": b"odd"}) as s:
        yield s


def cached_files(root: str) -> list[str]:
    """Every file under ``root`` except lock files."""
    return sorted(
        os.path.relpath(os.path.join(d, f), root)
        for d, _, files in os.walk(root)
        for f in files
        if not f.endswith(".lock")
    )


# --- 1.5.1 Manage local path -------------------------------------------------------------


def test_manual_local_path_example(tmp_path):
    file = str(tmp_path / "file")
    file2 = str(tmp_path / "file2")
    with open(file, "w", encoding="utf-8") as f:
        f.write(TEXT)
    with open(file2, "w", encoding="utf-8") as f:
        f.write("two")

    with PathManager.open(file, "r", encoding="utf-8") as f:
        assert f.read() == TEXT

    assert PathManager.exists(file) is True
    assert PathManager.exists(str(tmp_path / "nope")) is False
    assert PathManager.isfile(file) is True
    assert PathManager.isdir(file) is False
    assert PathManager.isdir(str(tmp_path)) is True

    dir_ = str(tmp_path / "path" / "to" / "dir")
    PathManager.makedirs(dir_)
    PathManager.makedirs(dir_)  # exist_ok
    assert os.path.isdir(dir_)

    assert sorted(PathManager.listdir(str(tmp_path))) == ["file", "file2", "path"]

    destination = str(tmp_path / "destination")
    assert PathManager.copy(file2, destination) is True
    with open(destination) as f:
        assert f.read() == "two"

    PathManager.remove(file)
    assert not os.path.exists(file)

    PathManager.removedirs(dir_)  # removes the empty leaf and its empty parents
    assert not os.path.exists(str(tmp_path / "path"))
    assert os.path.isdir(str(tmp_path))  # not empty: kept


def test_native_write_and_binary_modes(tmp_path):
    path = str(tmp_path / "a.bin")
    with PathManager.open(path, "wb") as f:
        f.write(b"\x00\x01")
    with PathManager.open(path, "rb") as f:
        assert f.read() == b"\x00\x01"
    assert PathManager.get_local_path(path) == path
    assert PathManager.isfile(tmp_path / "a.bin")  # os.PathLike works too


def test_native_errors_are_the_os_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        PathManager.open(str(tmp_path / "missing"))
    with pytest.raises(IsADirectoryError):
        PathManager.remove(str(tmp_path))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(OSError):
        PathManager.removedirs(str(tmp_path / "full"))
    assert (tmp_path / "full" / "x").exists()


def test_copy_overwrite_and_into_directory(tmp_path):
    src, dst = tmp_path / "src.txt", tmp_path / "dst.txt"
    src.write_text("new")
    dst.write_text("old")
    assert PathManager.copy(str(src), str(dst)) is False
    assert dst.read_text() == "old"
    assert PathManager.copy(str(src), str(dst), overwrite=True) is True
    assert dst.read_text() == "new"

    folder = tmp_path / "folder"
    folder.mkdir()
    assert PathManager.copy(str(src), str(folder)) is True
    assert (folder / "src.txt").read_text() == "new"
    assert [p for p in os.listdir(folder) if p.endswith(".part")] == []

    assert PathManager.copy_from_local(str(src), str(tmp_path / "c.txt")) is True
    assert (tmp_path / "c.txt").read_text() == "new"


# --- 1.5.2 Manage remote URL -------------------------------------------------------------


def test_manual_remote_url_example(server, cache, tmp_path):
    url = server.url("/files/yyy.txt")
    with PathManager.open(url, "r", encoding="utf-8") as f:
        assert f.read() == TEXT

    local_path = PathManager.get_local_path(url)
    assert os.path.commonpath([local_path, os.path.join(cache, "http")]) == os.path.join(
        cache, "http"
    )
    assert os.path.basename(local_path) == "yyy.txt"
    with open(local_path, encoding="utf-8") as f:
        assert f.read() == TEXT

    assert PathManager.copy(url, str(tmp_path / "a_local_path")) is True
    assert (tmp_path / "a_local_path").read_text(encoding="utf-8") == TEXT
    assert server.hits["/files/yyy.txt"] == 1  # downloaded once, then served from the cache


def test_cache_dir_follows_env_at_call_time(server, tmp_path, monkeypatch):
    url = server.url("/files/blob.bin")
    monkeypatch.setenv("EASYCORE_CACHE", str(tmp_path / "one"))
    first = PathManager.get_local_path(url)
    monkeypatch.setenv("EASYCORE_CACHE", str(tmp_path / "two"))
    second = PathManager.get_local_path(url)
    assert first.startswith(str(tmp_path / "one"))
    assert second.startswith(str(tmp_path / "two"))
    with open(second, "rb") as f:
        assert f.read() == BLOB
    assert server.hits["/files/blob.bin"] == 2


def test_default_cache_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("EASYCORE_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    base = os.path.join(str(tmp_path), ".easycore", "cache")
    handler = HTTPURLHandler()
    assert handler.get_cache_dir() == base
    assert handler.get_cache_dir("https") == os.path.join(base, "https")
    monkeypatch.setenv("EASYCORE_CACHE", str(tmp_path / "elsewhere"))
    assert NativePathHandler().get_cache_dir("ftp") == str(tmp_path / "elsewhere" / "ftp")


def test_http_prefixes():
    assert HTTPURLHandler().get_supported_prefixes() == ["http://", "https://", "ftp://"]
    for prefix in ("http://", "https://", "ftp://"):
        assert isinstance(PathManager.get_handler(prefix + "host/x"), HTTPURLHandler)


def test_force_downloads_again(server, cache):
    url = server.url("/files/yyy.txt")
    PathManager.get_local_path(url)
    PathManager.get_local_path(url, force=True)
    assert server.hits["/files/yyy.txt"] == 2


def test_no_length_is_accepted(server, cache):
    with PathManager.open(server.url("/nolength/blob.bin"), "rb") as f:
        assert f.read() == BLOB


@pytest.mark.parametrize("status", [404, 500])
def test_http_error_names_url_and_status(server, cache, status):
    url = server.url(f"/status/{status}")
    with pytest.raises(DownloadError) as info:
        PathManager.get_local_path(url)
    assert info.value.status == status
    assert info.value.url == url
    assert url in str(info.value) and str(status) in str(info.value)
    assert isinstance(info.value, OSError) and isinstance(info.value, EasycoreError)
    assert cached_files(cache) == []


def test_truncated_download_leaves_no_cache_entry(server, cache):
    url = server.url("/truncated/blob.bin")
    with pytest.raises(DownloadError, match="truncated") as info:
        PathManager.get_local_path(url)
    assert url in str(info.value) and "200" in str(info.value)
    assert info.value.status == 200
    assert cached_files(cache) == []  # neither the file nor a temporary .part
    assert not PathManager.get_handler(url).is_cached(url)


def test_unreachable_host(cache):
    url = f"http://127.0.0.1:{unused_port()}/x.txt"
    with pytest.raises(DownloadError) as info:
        PathManager.open(url)
    assert info.value.status is None
    assert url in str(info.value)
    assert cached_files(cache) == []


def test_exists_isfile_isdir_over_http(server, cache):
    assert PathManager.exists(server.url("/files/yyy.txt")) is True
    assert PathManager.exists(server.url("/files/missing.txt")) is False
    assert PathManager.isfile(server.url("/files/yyy.txt")) is True
    assert PathManager.isdir(server.url("/files/yyy.txt")) is False
    assert cached_files(cache) == []  # checking does not download
    with pytest.raises(DownloadError):
        PathManager.exists(server.url("/status/500"))


def test_http_is_read_only(server, cache, tmp_path):
    url = server.url("/files/yyy.txt")
    local = tmp_path / "f.txt"
    local.write_text("x")
    for call in (
        lambda: PathManager.open(url, "w"),
        lambda: PathManager.open(url, "rb+"),
        lambda: PathManager.remove(url),
        lambda: PathManager.makedirs(url),
        lambda: PathManager.removedirs(url),
        lambda: PathManager.listdir(url),
        lambda: PathManager.copy(str(local), url),
    ):
        with pytest.raises(UnsupportedPathOperation, match="HTTPURLHandler"):
            call()
    assert server.hits == {}  # refused before any request
    assert issubclass(UnsupportedPathOperation, OSError)


@pytest.mark.parametrize(
    "tail",
    [
        "/../../../../etc/passwd",
        "/%2e%2e/%2e%2e/%2e%2e/x",
        "/a/..%2F..%2F..%2Fb",
        "/..",
        "/",
        "",
        "/a?q=../../x#../y",
        "/\x00weird\\name:*|<>.txt",
        "/" + "x" * 1000,
        "/日本語.txt",
    ],
)
def test_cache_path_stays_in_cache_dir(cache, tail):
    handler = HTTPURLHandler()
    root = os.path.join(cache, "http")
    path = handler.cache_path("http://user:pw@evil..host:80" + tail)
    assert os.path.commonpath([root, path]) == root
    assert ".." not in path[len(root) :].split(os.sep)
    assert len(os.path.basename(path)) <= 120


def test_distinct_urls_get_distinct_cache_files(cache):
    handler = HTTPURLHandler()
    paths = {
        handler.cache_path(u)
        for u in ("http://h/a b", "http://h/a_b", "http://h/a?x=1", "http://h/a?x=2", "http://h/a")
    }
    assert len(paths) == 5


def test_odd_url_downloads_into_cache(server, cache):
    url = server.url("/files/odd%20name%3F.txt?x=../../y")
    path = PathManager.get_local_path(url)
    assert path.startswith(os.path.join(cache, "http") + os.sep)
    with open(path, "rb") as f:
        assert f.read() == b"odd"


RACE_SCRIPT = """
import hashlib, sys
from easycore.common.path import PathManager
sys.stdin.readline()  # all start together
with open(PathManager.get_local_path(sys.argv[1]), "rb") as f:
    print(hashlib.sha256(f.read()).hexdigest(), flush=True)
"""


@pytest.mark.timeout(120)
def test_processes_racing_download_once(server, cache):
    url = server.url("/slow/blob.bin")
    n = 4
    with children(RACE_SCRIPT, n, url) as procs:
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        got = [p.stdout.read().strip() for p in procs]
        codes = [p.wait(timeout=60) for p in procs]
    assert codes == [0] * n
    assert got == [hashlib.sha256(BLOB).hexdigest()] * n
    assert server.hits["/slow/blob.bin"] == 1
    assert len(cached_files(cache)) == 1


# --- 1.5.3 Redirect path -----------------------------------------------------------------


def test_manual_redirect_examples_register():
    PathManager.register(RedirectPathHandler("easycore://", "http://xxx.com/download/"))
    PathManager.register(RedirectPathHandler("file://", "/path/to/dir/"))
    PathManager.register(RedirectPathHandler("dataset://MNIST/", "e:\\Dataset\\MNIST\\"))
    PathManager.register(RedirectPathHandler("dataset://CIFAR100/", "e:\\Dataset\\CIFAR100\\"))
    PathManager.register(RedirectPathHandler("dataset://ImageNet/", "f:\\ImageNet\\"))
    handler = PathManager.get_handler("easycore://yyy/zzz.txt")
    assert isinstance(handler, RedirectPathHandler)
    assert handler.redirect("easycore://yyy/zzz.txt") == "http://xxx.com/download/yyy/zzz.txt"
    imagenet = PathManager.get_handler("dataset://ImageNet/train/0.jpg")
    assert imagenet.redirect("dataset://ImageNet/train/0.jpg") == "f:\\ImageNet\\train/0.jpg"
    assert imagenet.get_supported_prefixes() == ["dataset://ImageNet/"]


def test_redirect_to_local_folder(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    PathManager.register(RedirectPathHandler("file://", str(root) + os.sep))
    PathManager.makedirs("file://MNIST/train")
    assert (root / "MNIST" / "train").is_dir()
    with PathManager.open("file://MNIST/train/0.txt", "w") as f:
        f.write("zero")
    assert PathManager.exists("file://MNIST/train/0.txt")
    assert PathManager.isfile("file://MNIST/train/0.txt")
    assert PathManager.isdir("file://MNIST")
    assert PathManager.listdir("file://MNIST/train") == ["0.txt"]
    assert PathManager.get_local_path("file://MNIST/train/0.txt") == str(
        root / "MNIST" / "train" / "0.txt"
    )
    assert PathManager.copy("file://MNIST/train/0.txt", "file://MNIST/1.txt") is True
    assert (root / "MNIST" / "1.txt").read_text() == "zero"
    PathManager.remove("file://MNIST/train/0.txt")
    PathManager.removedirs("file://MNIST/train")
    assert sorted(os.listdir(root / "MNIST")) == ["1.txt"]


def test_redirect_to_http(server, cache):
    PathManager.register(RedirectPathHandler("easycore://", server.url("/files/")))
    with PathManager.open("easycore://yyy.txt", encoding="utf-8") as f:
        assert f.read() == TEXT
    assert PathManager.exists("easycore://yyy.txt")


def test_longest_prefix_wins(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x").write_text("from a")
    (tmp_path / "b" / "x").write_text("from b")
    PathManager.register(RedirectPathHandler("dataset://MNIST/", str(tmp_path / "b") + "/"))
    PathManager.register(RedirectPathHandler("dataset://", str(tmp_path / "a") + "/"))
    with PathManager.open("dataset://x") as f:
        assert f.read() == "from a"
    with PathManager.open("dataset://MNIST/x") as f:
        assert f.read() == "from b"


def test_redirect_rejects_foreign_path():
    with pytest.raises(InvalidArgument):
        RedirectPathHandler("a://", "/tmp/").redirect("b://x")


def test_taken_prefix_needs_override(tmp_path):
    PathManager.register(RedirectPathHandler("data://", "/one/"))
    with pytest.raises(PrefixTakenError, match="override=True") as info:
        PathManager.register(RedirectPathHandler("data://", "/two/"))
    assert "'data://'" in str(info.value) and isinstance(info.value, ValueError)
    assert PathManager.get_handler("data://x").redirect("data://x") == "/one/x"

    # all or nothing: a handler with one free and one taken prefix registers neither
    class Two(PathHandler):
        def get_supported_prefixes(self) -> list[str]:
            return ["free://", "data://"]

    with pytest.raises(PrefixTakenError):
        PathManager.register(Two())
    assert "free://" not in PathManager.registered_prefixes()

    PathManager.register(RedirectPathHandler("data://", "/two/"), override=True)
    assert PathManager.get_handler("data://x").redirect("data://x") == "/two/x"


def test_register_checks_its_argument():
    with pytest.raises(InvalidArgument):
        PathManager.register(object())  # type: ignore[arg-type]

    class Empty(PathHandler):
        def get_supported_prefixes(self) -> list[str]:
            return []

    with pytest.raises(InvalidArgument):
        PathManager.register(Empty())
    with pytest.raises(InvalidArgument, match="registered"):
        PathManager.unregister("never://")


def test_unknown_scheme_goes_native():
    assert isinstance(PathManager.get_handler("/tmp/x"), NativePathHandler)
    assert isinstance(PathManager.get_handler("relative/x"), NativePathHandler)
    assert isinstance(PathManager.get_handler("nosuchproto://x"), NativePathHandler)


# --- 1.5.4 Custom PathHandler ------------------------------------------------------------


def test_manual_custom_handler_example(server, tmp_path, monkeypatch):
    monkeypatch.setenv("EASYCORE_CACHE", str(tmp_path / "not-used"))
    monkeypatch.setenv("NEW_CACHE", str(tmp_path / "new"))

    # custom PathHandler (verbatim from the manual)
    class NewHTTPURLHandler(HTTPURLHandler):
        def get_cache_dir(self, protocol):
            cache_dir = os.path.expanduser(os.getenv("NEW_CACHE", "~/.easycore/cache"))
            if protocol is not None:
                cache_dir = os.path.join(cache_dir, protocol)
            return cache_dir

        def get_support_prefixes(self):
            return ["http://", "https://"]

    # register custom path handler
    PathManager.register(NewHTTPURLHandler(), override=True)

    assert isinstance(PathManager.get_handler("http://x/y"), NewHTTPURLHandler)
    assert isinstance(PathManager.get_handler("https://x/y"), NewHTTPURLHandler)
    assert type(PathManager.get_handler("ftp://x/y")) is HTTPURLHandler  # not overridden
    assert NewHTTPURLHandler().get_supported_prefixes() == ["http://", "https://"]

    path = PathManager.get_local_path(server.url("/files/yyy.txt"))
    assert path.startswith(str(tmp_path / "new" / "http") + os.sep)
    assert not (tmp_path / "not-used").exists()


def test_base_handler_operations_are_unsupported():
    class Bare(PathHandler):
        def get_supported_prefixes(self) -> list[str]:
            return ["bare://"]

    PathManager.register(Bare())
    for name in ("open", "get_local_path", "exists", "isfile", "isdir", "listdir", "makedirs"):
        with pytest.raises(UnsupportedPathOperation, match=f"Bare does not support {name}"):
            getattr(PathManager, name)("bare://x")
    with pytest.raises(NotImplementedError):
        PathHandler().get_supported_prefixes()


# --- fsspec ------------------------------------------------------------------------------


@pytest.fixture
def memory_root() -> Iterator[str]:
    fsspec = pytest.importorskip("fsspec")
    name = f"easycore-test-{uuid.uuid4().hex}"
    yield f"memory://{name}"
    fs = fsspec.filesystem("memory")
    if fs.exists(f"/{name}"):
        fs.rm(f"/{name}", recursive=True)


def test_fsspec_memory_filesystem(memory_root, cache, tmp_path):
    assert isinstance(PathManager.get_handler(memory_root + "/a.txt"), FsspecPathHandler)
    PathManager.makedirs(memory_root + "/sub/deeper")
    assert PathManager.isdir(memory_root + "/sub")

    with PathManager.open(memory_root + "/sub/a.txt", "w", encoding="utf-8") as f:
        f.write(TEXT)
    with PathManager.open(memory_root + "/sub/a.txt", encoding="utf-8") as f:
        assert f.read() == TEXT
    assert PathManager.exists(memory_root + "/sub/a.txt")
    assert PathManager.isfile(memory_root + "/sub/a.txt")
    assert not PathManager.isdir(memory_root + "/sub/a.txt")
    assert not PathManager.exists(memory_root + "/sub/none.txt")
    assert PathManager.listdir(memory_root + "/sub") == ["a.txt", "deeper"]

    local = PathManager.get_local_path(memory_root + "/sub/a.txt")
    assert local.startswith(os.path.join(cache, "memory") + os.sep)
    with open(local, encoding="utf-8") as f:
        assert f.read() == TEXT

    src = tmp_path / "up.bin"
    src.write_bytes(b"payload")
    assert PathManager.copy(str(src), memory_root + "/up.bin") is True
    assert PathManager.copy(str(src), memory_root + "/up.bin") is False
    assert PathManager.copy(memory_root + "/up.bin", str(tmp_path / "down.bin")) is True
    assert (tmp_path / "down.bin").read_bytes() == b"payload"

    with pytest.raises(IsADirectoryError):
        PathManager.remove(memory_root + "/sub")
    PathManager.remove(memory_root + "/sub/a.txt")
    assert not PathManager.exists(memory_root + "/sub/a.txt")
    with pytest.raises(FileNotFoundError):
        PathManager.remove(memory_root + "/sub/a.txt")
    PathManager.removedirs(memory_root + "/sub/deeper")
    assert not PathManager.exists(memory_root + "/sub")


def test_fsspec_handler_registered_explicitly(memory_root):
    handler = FsspecPathHandler("memory")
    PathManager.register(handler)
    assert PathManager.get_handler(memory_root + "/x") is handler
    with PathManager.open(memory_root + "/x", "wb") as f:
        f.write(b"1")
    assert PathManager.isfile(memory_root + "/x")
    with pytest.raises(PrefixTakenError):
        PathManager.register(FsspecPathHandler(["memory"]))


WITHOUT_FSSPEC_SCRIPT = """
import sys
sys.modules["fsspec"] = None  # as if it were not installed
import easycore.common.network  # imported first: no import cycle with easycore.common.path
from easycore.common.path import FsspecPathHandler, NativePathHandler, PathManager
assert isinstance(PathManager.get_handler("memory://x"), NativePathHandler)
try:
    FsspecPathHandler("memory")
except ImportError as e:
    assert "fsspec" in str(e), e
    print("ok", flush=True)
"""


def test_imports_without_fsspec():
    with children(WITHOUT_FSSPEC_SCRIPT, 1) as (proc,):
        out = proc.stdout.read()
        assert proc.wait(timeout=60) == 0
    assert out.strip() == "ok"
