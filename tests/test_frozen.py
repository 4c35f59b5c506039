"""easycore.shm.freeze: read-only lists and dicts stored once in shared memory."""

from __future__ import annotations

import gc
import os
import pickle
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from easycore import shm
from easycore.errors import SerializationError, SharedMemoryError, WorkerDiedError
from easycore.parallel import Pool
from frozen_defs import DieWhileReading, ReadIndex, describe, init_with, read_context, read_task

SHM = "/dev/shm"
PY = sys.executable
METHODS = ["fork", "spawn", "forkserver"]

ITEMS = [
    None,
    True,
    False,
    0,
    -7,
    2**100,
    1.5,
    float("inf"),
    "",
    "héllo \U0001f600",
    b"",
    b"\x00bytes\xff",
    (),
    (1, "a", (2.5, None)),
    [],
    [1, [2, [3]], {"k": "v"}],
    {"path": "/data/img/000001.jpg", "label": 417, "box": (0.1, 0.2, 0.3, 0.4)},
    {1: "int key", (1, 2): "tuple key", b"b": "bytes key"},
    {1, 2, 3},
    frozenset({"a"}),
    np.arange(10, dtype=np.int64),
    np.zeros((3, 4), dtype=np.float32),
    {"image": np.full((8, 8, 3), 7, dtype=np.uint8), "label": 3},
    [np.arange(3), "mixed", 4],
    np.float64(2.5),
]


def _exists(name: str) -> bool:
    return os.path.exists(os.path.join(SHM, name))


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool((a == b).all())
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        if type(a) is not type(b) or len(a) != len(b):
            return False
        return all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def test_every_supported_type_round_trips_in_a_list():
    with shm.freeze(ITEMS) as f:
        assert isinstance(f, shm.SharedList)
        assert len(f) == len(ITEMS)
        for i, want in enumerate(ITEMS):
            assert _same(f[i], want), (i, f[i], want)
        assert all(_same(a, b) for a, b in zip(f, ITEMS, strict=True))


def test_arrays_come_back_as_read_only_views_of_the_arena():
    big = np.arange(100_000, dtype=np.float64)
    with shm.freeze([{"a": big}, big]) as f:
        a = f[1]
        assert not a.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            a[0] = 1.0
        assert f.nbytes > big.nbytes  # the data is in the arena...
        assert len(pickle.dumps(f)) < 200  # ...and not in what travels
        # a zero-copy view: its memory lies inside this process's mapping of the arena
        base = np.frombuffer(f._arena.mm, dtype=np.uint8)
        assert np.shares_memory(a, base)
        assert _same(f[0]["a"], big)
        del base, a


def test_every_supported_key_type_round_trips_in_a_dict():
    src = {
        "path": 1,
        "": 2,
        "é\U0001f600": 3,
        0: "zero",
        -5: "minus five",
        2**80: "big",
        2.5: "float",
        b"raw": "bytes",
        None: "none",
        (1, "a", (b"x", None)): "tuple",
        (): "empty tuple",
        "arr": np.arange(4),
    }
    with shm.freeze(src) as d:
        assert isinstance(d, shm.SharedDict)
        assert len(d) == len(src)
        assert list(d) == list(src)  # insertion order
        for k, v in src.items():
            assert k in d
            assert _same(d[k], v), k
        assert list(d.keys()) == list(src.keys())
        assert all(_same(a, b) for a, b in zip(d.values(), src.values(), strict=True))
        assert [k for k, _ in d.items()] == list(src)
        # Python's equality: 0 == 0.0 == False, -5 == -5.0
        assert d[0.0] == "zero" and d[False] == "zero" and d[-5.0] == "minus five"
        assert "missing" not in d and 3.25 not in d and (1, "b") not in d
        assert d.get("missing", "dflt") == "dflt"
        with pytest.raises(KeyError):
            d["missing"]
        with pytest.raises(TypeError, match="unhashable"):
            d[[1, 2]]
        assert object() not in d
        plain = {k: v for k, v in src.items() if k != "arr"}
        with shm.freeze(plain) as d2:
            assert d2 == plain  # the Mapping protocol's ==


def test_a_big_dict_finds_every_key_and_no_other():
    src = {f"key{i}": i for i in range(20_000)}
    src.update({i: -i for i in range(20_000)})
    with shm.freeze(src) as d:
        assert all(d[k] == v for k, v in src.items())
        assert not any(f"nokey{i}" in d for i in range(2_000))
        assert not any((i + 20_000) in d for i in range(2_000))


def test_slicing_indexing_and_iteration():
    src = [{"i": i, "s": str(i)} for i in range(50)]
    with shm.freeze(src) as f:
        assert f[-1] == src[-1] and f[-50] == src[0]
        with pytest.raises(IndexError):
            f[50]
        with pytest.raises(IndexError):
            f[-51]
        assert f[np.int64(3)] == src[3]
        with pytest.raises(TypeError, match="indices"):
            f["3"]
        cuts = [slice(None), slice(3, 9), slice(-5, None), slice(None, None, -3), slice(40, 2, -7)]
        for s in cuts:
            got = f[s]
            assert type(got) is list and got == src[s]
        assert list(f) == src and list(reversed(f)) == src[::-1]
        assert src[7] in f and {"i": 99} not in f
        assert f.index(src[5]) == 5 and f.count(src[5]) == 1
        assert f == src and f != src[:-1]
        x = f[2]
        x["i"] = "changed"  # an ordinary copy: the frozen data does not change
        assert f[2] == src[2]


def test_writes_are_refused():
    with shm.freeze([1, 2, 3]) as f, shm.freeze({"a": 1}) as d:
        for call in [
            lambda: f.__setitem__(0, 5),
            lambda: f.__delitem__(0),
            lambda: f.append(4),
            lambda: f.extend([4]),
            lambda: f.insert(0, 4),
            lambda: f.pop(),
            lambda: f.remove(1),
            lambda: f.clear(),
            lambda: f.sort(),
            lambda: f.reverse(),
            lambda: d.__setitem__("b", 2),
            lambda: d.__delitem__("a"),
            lambda: d.pop("a"),
            lambda: d.popitem(),
            lambda: d.setdefault("b", 2),
            lambda: d.update(b=2),
            lambda: d.clear(),
        ]:
            with pytest.raises(TypeError, match="read-only"):
                call()
        with pytest.raises(TypeError, match="read-only"):
            f += [4]
        with pytest.raises(TypeError, match="read-only"):
            d |= {"b": 2}
        assert list(f) == [1, 2, 3] and dict(d) == {"a": 1}
        # even the raw mapping cannot be written
        with pytest.raises(TypeError):
            f._arena.mv[0] = 0
        with pytest.raises(TypeError):
            f._arena.mm[0] = 0


def test_bad_input_is_a_clear_error_and_leaves_nothing():
    before = set(os.listdir(SHM))
    with pytest.raises(SerializationError, match=r"item \[2\].*lambda|item \[2\] \(function\)"):
        shm.freeze([1, 2, lambda: 3])
    with pytest.raises(TypeError, match="dict key"):
        shm.freeze({object(): 1})
    with pytest.raises(TypeError, match="NaN"):
        shm.freeze({float("nan"): 1})
    with pytest.raises(SerializationError, match="value of key 'b'"):
        shm.freeze({"a": 1, "b": lambda: 2})
    with pytest.raises(TypeError, match="sequence or a mapping"):
        shm.freeze("a string")
    with pytest.raises(TypeError, match="sequence or a mapping"):
        shm.freeze(5)  # type: ignore[call-overload]
    assert {n for n in os.listdir(SHM) if ".frozen-" in n} <= before


def test_pickled_it_is_a_reference_and_close_removes_the_name():
    f = shm.freeze([{"x": i} for i in range(100_000)])
    name = f.name
    blob = pickle.dumps(f)
    assert len(blob) < 200 and name.encode() in blob
    g = pickle.loads(blob)
    assert g._arena is f._arena  # same process: the same mapping
    assert shm.freeze(f) is f
    assert _exists(name)
    assert name.startswith(f"ec.{__import__('easycore._core')._core.identity()}.frozen-")
    assert len(name.rsplit("-", 1)[1]) == 32  # 128 random bits
    st = os.stat(os.path.join(SHM, name))
    assert st.st_mode & 0o777 == 0o600
    f.close()
    f.close()  # twice is fine
    assert not _exists(name)
    with pytest.raises(ValueError, match="closed"):
        f[0]
    with pytest.raises(ValueError, match="closed"):
        pickle.dumps(f)
    with pytest.raises(SharedMemoryError, match="gone"):
        pickle.loads(blob)


def test_garbage_collecting_the_owners_object_removes_the_name():
    f = shm.freeze({"a": [1, 2]})
    name = f.name
    assert _exists(name)
    del f
    gc.collect()
    assert not _exists(name)


def test_arrays_read_before_close_stay_valid():
    f = shm.freeze([np.arange(1000)])
    a = f[0]
    f.close()
    assert int(a.sum()) == 499500  # the mapping lives as long as the view


def test_a_forked_child_reads_the_inherited_mapping_and_never_removes_the_name():
    with shm.freeze([{"i": i} for i in range(1000)]) as f:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                g = pickle.loads(pickle.dumps(f))
                ok = g._arena is f._arena and g[999] == {"i": 999}
                f.close()  # a child's close (or exit) leaves the owner's name alone
                os.write(w, b"1" if ok else b"0")
            finally:
                os._exit(0)
        os.close(w)
        got = os.read(r, 1)
        os.close(r)
        os.waitpid(pid, 0)
        assert got == b"1"
        assert _exists(f.name) and f[5] == {"i": 5}


def test_copies_and_configs_share_the_frozen_object():
    import copy

    from easycore.common.config import CfgNode

    with shm.freeze([1, 2]) as f, shm.freeze({"a": 1}) as d:
        assert copy.copy(f) is f and copy.deepcopy(f) is f and copy.deepcopy(d) is d
        cfg = CfgNode({"index": f, "table": d})  # a CfgNode deep-copies its values
        assert cfg.index is f and cfg.table is d
        assert copy.deepcopy(cfg).index is f


def test_empty_and_iterator_inputs():
    with shm.freeze([]) as a, shm.freeze({}) as b, shm.freeze(x * 2 for x in range(3)) as c:
        assert len(a) == 0 and list(a) == [] and a == []
        assert len(b) == 0 and dict(b) == {} and "k" not in b
        assert list(c) == [0, 2, 4]
    with shm.freeze((1, "a")) as t, shm.freeze(range(4)) as r:
        assert list(t) == [1, "a"] and list(r) == [0, 1, 2, 3]


def _mapping_of(name: str) -> str:
    with open("/proc/self/maps") as f:
        lines = [line for line in f if line.rstrip().endswith(name)]
    assert len(lines) == 1, lines
    return lines[0]


def test_readers_map_the_arena_read_only_and_shared_and_reading_dirties_nothing():
    with shm.freeze([{"i": i, "s": "x" * 50} for i in range(20_000)]) as f:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                assert sum(x["i"] for x in f) == sum(range(20_000))
                perms = _mapping_of(f.name).split()[1]
                with open("/proc/self/smaps") as sm:
                    text = sm.read()
                block = text[text.index(f.name) :].split("VmFlags", 1)[0]
                # a page copied on write would show as Anonymous in the arena's mapping
                # (tmpfs pages always count as dirty, and as private where one process
                # maps them: neither is a copy)
                anon = [ln.split()[1] for ln in block.splitlines() if ln.startswith("Anonymous:")]
                rss = [ln.split()[1] for ln in block.splitlines() if ln.startswith("Rss:")]
                ok = perms == "r--s" and anon == ["0"] and int(rss[0]) > 0  # read, not copied
                os.write(w, b"1" if ok else f"{perms} {anon}".encode())
            finally:
                os._exit(0)
        os.close(w)
        got = os.read(r, 200)
        os.close(r)
        os.waitpid(pid, 0)
        assert got == b"1", got
        assert _mapping_of(f.name).split()[1] == "r--s"  # the owner's too


@pytest.fixture
def frozen_pair():
    index = shm.freeze(ITEMS)
    table = shm.freeze({f"k{i}": i * 10 for i in range(len(ITEMS))})
    yield index, table
    index.close()
    table.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", METHODS)
def test_a_runner_reads_frozen_cfg_values(method, frozen_pair):
    index, table = frozen_pair
    with ReadIndex(devices=2, cfg={"index": index, "table": table}, start_method=method) as r:
        out = r(range(len(ITEMS)))
    assert sorted(out) == list(range(len(ITEMS)))
    for i, want in enumerate(ITEMS):
        item, by_key, how = out[i]
        assert _same(index[i], want)
        assert item == describe(index[i]), i  # what the producer read is what we read
        assert by_key == i * 10
        # under fork the producers reuse the inherited mapping; others attach by name
        assert how == ("inherited" if method == "fork" else "attached"), (method, how)
    for i, want in enumerate(ITEMS):  # arrays read in producers were read-only views
        if isinstance(want, np.ndarray):
            assert out[i][0][3] is False


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", METHODS)
def test_a_pool_takes_frozen_initializer_arguments_task_arguments_and_closures(method, frozen_pair):
    index, _ = frozen_pair
    expected_how = "inherited" if method == "fork" else "attached"
    want = [describe(x) for x in index]  # read here (arrays read-only, as in the workers)
    n = len(ITEMS)
    with Pool(2, initializer=init_with, initargs=(index,), start_method=method) as p:
        by_arg = p.starmap(read_task, [(index, i) for i in range(n)])
        by_ctx = p.map(read_context, range(n))
        by_closure = p.map(lambda i: describe(index[i]), range(n))
    assert [d for d, _ in by_arg] == want
    assert [d for d, _ in by_ctx] == want
    assert by_closure == want
    hows = {h for _, h in by_arg} | {h for _, h in by_ctx}
    # a task argument pickled to a forked worker finds the inherited arena by name
    assert hows == {expected_how}, hows


@pytest.mark.timeout(180)
def test_a_producer_killed_while_reading_leaks_nothing_and_the_caller_keeps_reading():
    src = [{"label": i % 7, "path": f"/p/{i}"} for i in range(20_000)]
    index = shm.freeze(src)
    name = index.name
    try:
        with DieWhileReading(devices=2, cfg={"index": index, "bad": 3}) as r:
            with pytest.raises(WorkerDiedError):
                r(range(6))
            # a death closes the runner; restarted, its new producers read the same arena
            r.activate()
            out = r(range(4, 8))
        assert out == [sum(x["label"] for x in src)] * 4
        assert index[12_345] == src[12_345] and len(index) == len(src)
        assert _exists(name)
    finally:
        index.close()
    assert not _exists(name)


def _private_shm_ok() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    r = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /dev/shm"],
        capture_output=True,
        timeout=30,
    )
    return r.returncode == 0


needs_private_shm = pytest.mark.skipif(
    not _private_shm_ok(), reason="needs root, unshare and tmpfs (a private /dev/shm)"
)


def _in_private_shm(script: str, size: str = "") -> str:
    """Runs ``script`` in a private mount namespace with a fresh, empty /dev/shm."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            f'mount -t tmpfs -o mode=1777{size} tmpfs /dev/shm && exec "$0" -c "$1"',
            PY,
            textwrap.dedent(script),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@needs_private_shm
@pytest.mark.timeout(180)
def test_the_sweep_removes_a_killed_owners_arena_and_never_a_live_ones():
    out = _in_private_shm(
        """
        import os, signal, subprocess, sys, time
        from easycore import _core

        SCRIPT = (
            "import sys\\n"
            "from easycore import shm\\n"
            "f = shm.freeze({'a': list(range(1000))})\\n"
            "g = shm.freeze([1, 2, 3])\\n"
            "print(f.name, g.name, flush=True)\\n"
            "sys.stdin.readline()\\n"
        )

        def owner():
            p = subprocess.Popen([sys.executable, "-c", SCRIPT], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
            return p, p.stdout.readline().split()

        dead, dead_names = owner()
        live, live_names = owner()
        dead.kill(); dead.wait()
        assert all(os.path.exists("/dev/shm/" + n) for n in dead_names), "gone before sweep"
        _core.sweep_stale_segments()
        assert not any(os.path.exists("/dev/shm/" + n) for n in dead_names), "not swept"
        assert all(os.path.exists("/dev/shm/" + n) for n in live_names), "a live one swept"
        live.stdin.write("\\n"); live.stdin.flush(); live.wait(30)
        assert live.returncode == 0
        # a normal exit removed its names: nothing left but this process's own token
        left = [n for n in os.listdir("/dev/shm") if not n.endswith(".live")]
        assert left == [], left
        print("ok")
        """
    )
    assert out.strip().endswith("ok")


@needs_private_shm
@pytest.mark.timeout(180)
def test_a_hostile_file_under_the_name_is_refused_clearly_and_never_blocks():
    out = _in_private_shm(
        """
        import os, pickle, stat
        from easycore import shm
        from easycore.errors import SharedMemoryError

        f = shm.freeze(list(range(100)))
        path = "/dev/shm/" + f.name
        good = open(path, "rb").read()
        blob = pickle.dumps(f)
        f.close()
        assert not os.path.exists(path)

        def refused(why):
            try:
                pickle.loads(blob)
            except SharedMemoryError as e:
                assert why in str(e), (why, str(e))
                return
            raise AssertionError("attached to a hostile file: " + why)

        def put(data, mode=0o600):
            with open(path, "wb") as out:
                out.write(data)
            os.chmod(path, mode)

        # a symbolic link to a perfect copy of the arena
        put(good); os.rename(path, "/dev/shm/target"); os.symlink("/dev/shm/target", path)
        refused("symbolic link"); os.unlink(path)
        # a copy others may read (mode 0644)
        put(good, 0o644); refused("mode 0644"); os.unlink(path)
        # a FIFO: opening it must not block
        os.mkfifo(path, 0o600); refused("not a regular file"); os.unlink(path)
        # a copy owned by another user
        put(good); os.chown(path, 65534, 65534); refused("owned by uid 65534"); os.unlink(path)
        # the right size, the wrong header
        put(bytes(len(good))); refused("no frozen-data header"); os.unlink(path)
        # another size
        put(good + b"x"); refused("bytes, not the"); os.unlink(path)
        # the name is ours and well-formed, yet nothing else is accepted as a name
        try:
            pickle.loads(blob.replace(b"ec.", b"../", 1))
        except SharedMemoryError as e:
            assert "not a frozen-data name" in str(e)
        else:
            raise AssertionError("a bad name was accepted")
        # a perfect copy, private to this user, is accepted
        put(good)
        g = pickle.loads(blob)
        assert list(g) == list(range(100))
        print("ok")
        """
    )
    assert out.strip().endswith("ok")


@needs_private_shm
@pytest.mark.timeout(180)
def test_a_full_dev_shm_is_a_clear_error_and_leaves_nothing():
    out = _in_private_shm(
        """
        import os
        from easycore import shm
        from easycore.errors import SharedMemoryError

        try:
            shm.freeze([b"x" * 100_000 for _ in range(100)])  # 10 MB into 2 MB
        except SharedMemoryError as e:
            assert "/dev/shm may be too small" in str(e), str(e)
        else:
            raise AssertionError("no error")
        left = [n for n in os.listdir("/dev/shm") if ".frozen-" in n]
        assert left == [], left
        with shm.freeze(list(range(10))) as f:  # what fits still works
            assert f[9] == 9
        print("ok")
        """,
        size=",size=2m",
    )
    assert out.strip().endswith("ok")
