"""Streaming a corpus (`data.iter_documents`, `data.count_documents`) against the whole-file
reader `data.read_documents`, which is the reference: the same documents, sources and errors.

Line ends, bad bytes, a byte-order mark and compressed frames are put at every place a read can
end by shrinking the reads to a few bytes (`files.CHUNK`, `files.ZSTD_PIECE`).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap

import pytest
import zstandard
from etils.epath import backend as epath_backend
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.registry import _registry as fsspec_registry

from ppl_jax.data import documents as data
from ppl_jax.data import files
from ppl_jax.errors import DataError

import helpers

BOM = b"\xef\xbb\xbf"
PACK = {"": lambda b: b, ".gz": gzip.compress, ".zst": zstandard.ZstdCompressor().compress}

# Line ends of every kind, a final line without one, blank and whitespace-only lines (also
# Unicode whitespace, which str.strip removes), non-ASCII text, a form feed and a U+2028 inside
# a line (not line ends here), a byte-order mark at the start of a file and (kept) of a line.
LINES = [
    BOM + b"alpha\r\nbeta\rgamma\n\n   \n\tdelta \x0c x\r\n\r\n",
    "Grüße, 日本語 ✓\r\r\n\u2003\n\u2028 inside\n\ufeffBOM\nlast without an end".encode(),
    b"",
    b"\n\r\n\r",
    "one\n€\r".encode(),
]
JSONL_RECORDS = [
    [{"text": "first"}, {"text": ""}, {"text": "Grüße\r\nCRLF\n"}, {"text": "x\u2028y", "n": 1}],
    [{"text": "  "}, {"text": "日本語 ✓"}],
    [{"text": "last"}],
]
WIKITEXT = [
    "\n = Alpha = \n\n Some text , here .\n\n = = Section = = \n more \n\n = Beta = \n\n end .\n",
    " = Gamma = \r\n text \r\n",
]


def jsonl_bytes(records: list[dict], i: int) -> bytes:
    """One jsonl file, with blank lines, CRLF and (for file 0) a BOM and no final line end."""
    ends = ["\n", "\r\n", "\n  \n", "\r"]
    body = "".join(
        json.dumps(r, ensure_ascii=bool(j % 2)) + ends[(i + j) % 4] for j, r in enumerate(records)
    )
    if i == 0:
        return BOM + body.rstrip().encode()
    return body.encode()


def write_corpus(folder, fmt: str) -> list[str]:
    """The files of format `fmt`, plain, gzip and zstd by turns; returns their paths in order."""
    folder.mkdir(parents=True, exist_ok=True)
    if fmt in ("lines", "text"):
        contents = LINES
    elif fmt == "jsonl":
        contents = [jsonl_bytes(r, i) for i, r in enumerate(JSONL_RECORDS)]
    else:
        contents = [t.encode() for t in WIKITEXT]
    out = []
    for i, content in enumerate(contents):
        suffix = list(PACK)[i % 3]
        path = folder / f"{fmt}{i}.{fmt}{suffix}"
        path.write_bytes(PACK[suffix](content))
        out.append(str(path))
    return out


@pytest.fixture(params=[1, 2, 3, 7, 1 << 20], ids=lambda n: f"chunk{n}")
def chunk(request, monkeypatch):
    """Reads of `n` bytes, and Zstandard fed `n` bytes at a time."""
    monkeypatch.setattr(files, "CHUNK", request.param)
    monkeypatch.setattr(files, "ZSTD_PIECE", min(request.param, files.ZSTD_PIECE))
    return request.param


@pytest.mark.parametrize("fmt", data.FORMATS)
def test_equals_read_documents(tmp_path, chunk, fmt):
    files = write_corpus(tmp_path, fmt)
    for spec in (str(tmp_path / f"{fmt}*"), ",".join(reversed(files))):
        want = data.read_documents(spec, fmt)
        assert len(want) > len(files) or fmt == "text"  # several documents in a file
        assert list(data.iter_documents(spec, fmt)) == want
        assert data.count_documents(spec, fmt) == len(want)
    if fmt == "lines":  # the CR, CRLF and U+2028 lines are where they should be
        got = [(d.text, d.source.rsplit(":", 1)[1]) for d in data.iter_documents(files[1], fmt)]
        assert got == [
            ("Grüße, 日本語 ✓", "1"),
            ("\u2028 inside", "4"),
            ("\ufeffBOM", "5"),
            ("last without an end", "6"),
        ]


@pytest.mark.parametrize("fmt", data.FORMATS)
def test_every_slice(tmp_path, fmt, monkeypatch):
    monkeypatch.setattr(files, "CHUNK", 5)  # several blocks per file
    write_corpus(tmp_path, fmt)
    spec = str(tmp_path / "*")
    docs = data.read_documents(spec, fmt)
    n = len(docs)
    for start in range(n + 2):
        for stop in [None, *range(n + 2)]:
            assert list(data.iter_documents(spec, fmt, start=start, stop=stop)) == docs[start:stop]


def test_negative_bounds_and_unknown_format(tmp_path):
    (tmp_path / "a.txt").write_text("a\n")
    with pytest.raises(ValueError, match="must not be negative"):
        data.iter_documents(str(tmp_path / "a.txt"), "lines", start=-1)
    for call in (data.iter_documents, data.count_documents, data.read_documents):
        with pytest.raises(DataError, match=r"data.format='csv' is not one of text, lines, js"):
            call(str(tmp_path / "a.txt"), "csv")  # at the call, before any iteration


# Invalid UTF-8 next to line ends: a lone continuation byte, sequences cut by a line end, a
# surrogate, an overlong form, and a 4-byte character cut by the end of the file.
BAD = b"a\xff\nb\xe2\x82\r\n\xc3\rc\x80\n\xed\xa0\x80\r\r\xc0\xaf\n\xf0\x9f\x98\x80ok\n\xf0\x9f\x98"


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_replace_gives_the_whole_file_texts(tmp_path, chunk, suffix):
    path = tmp_path / f"bad.lines{suffix}"
    path.write_bytes(PACK[suffix](BAD))
    want = data.read_documents(str(path), "lines", errors="replace")
    assert "\ufffd" in want[1].text and "\U0001f600ok" in [d.text for d in want]
    assert list(data.iter_documents(str(path), "lines", errors="replace")) == want


@pytest.mark.parametrize("suffix", ["", ".gz", ".zst"])
@pytest.mark.parametrize("bom", [b"", BOM])
def test_strict_names_the_byte_offset_in_the_file(tmp_path, chunk, suffix, bom):
    raw = bom + "line one\r\nzwei: ü\n".encode() + b"drei \xe9t\xc3\xa9\nfour\n"  # Latin-1 é
    path = tmp_path / f"bad.lines{suffix}"
    path.write_bytes(PACK[suffix](raw))
    with pytest.raises(DataError) as want:
        data.read_documents(str(path), "lines")
    offset = raw.index(b"\xe9t")  # the offset in the (decompressed) file, BOM included
    assert f"at byte offset {offset}" in str(want.value) and "(byte 0xe9)" in str(want.value)
    for call in (data.count_documents, lambda *a: list(data.iter_documents(*a))):
        with pytest.raises(DataError) as got:
            call(str(path), "lines")
        assert str(got.value) == str(want.value)


@pytest.mark.parametrize(
    "line, message",
    [('{"text": "a",}', "not valid JSON"), ('{"body": "a"}', "no string field 'text'")],
)
def test_bad_json_is_the_same_error(tmp_path, chunk, line, message):
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "b.jsonl").write_text(f'{{"text": "y"}}\r\n\n{line}\n{{"text": "z"}}\n')
    spec = str(tmp_path / "*.jsonl")
    with pytest.raises(DataError, match=message) as want:
        data.read_documents(spec, "jsonl")
    assert str(want.value).startswith(f"{tmp_path / 'b.jsonl'}:3: ")
    with pytest.raises(DataError) as got:
        list(data.iter_documents(spec, "jsonl"))
    assert str(got.value) == str(want.value)
    # Skipped documents are counted, not parsed, and reading stops at `stop`.
    assert [d.text for d in data.iter_documents(spec, "jsonl", start=3)] == ["z"]
    assert [d.text for d in data.iter_documents(spec, "jsonl", stop=2)] == ["x", "y"]
    assert data.count_documents(spec, "jsonl") == 4


def gzip_with_bad_crc(raw: bytes) -> bytes:
    packed = bytearray(gzip.compress(raw))
    packed[-8] ^= 0xFF  # the CRC-32 of the trailer
    return bytes(packed)


@pytest.mark.parametrize(
    "name, content",
    [
        ("bad.lines.gz", b"plain text, not gzip"),
        ("cut.lines.gz", gzip.compress(b"x\n" * 1000)[:-9]),
        ("cut-trailer.lines.gz", gzip.compress(b"x\n" * 1000)[:-3]),
        ("crc.lines.gz", gzip_with_bad_crc(b"x\n" * 1000)),
        ("tail.lines.gz", gzip.compress(b"a\n") + b"\x00\x00junk"),
        ("bad.lines.zst", b"plain text"),
        ("cut.lines.zstd", zstandard.ZstdCompressor().compress(b"y\n" * 1000)[:-4]),
        ("cut2.lines.zst", PACK[".zst"](b"a\n") + PACK[".zst"](b"b\n" * 1000)[:9]),
        ("tail.lines.zst", PACK[".zst"](b"a\n") + b"junk"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_damaged_compressed_files_are_the_same_error(tmp_path, chunk, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError, match=r"not a readable (gzip|Zstandard) file") as want:
        data.read_documents(str(path), "lines")
    for call in (data.count_documents, lambda *a: list(data.iter_documents(*a))):
        with pytest.raises(DataError) as got:
            call(str(path), "lines")
        assert str(got.value) == str(want.value)


def test_concatenated_members_and_frames(tmp_path, chunk):
    texts = [b"one\ntw", b"o\r", b"\nthree\n", b"", b"four"]
    (tmp_path / "a.lines.gz").write_bytes(b"".join(gzip.compress(t) for t in texts))
    (tmp_path / "a.lines.zst").write_bytes(b"".join(PACK[".zst"](t) for t in texts))
    for name in ("a.lines.gz", "a.lines.zst"):
        got = list(data.iter_documents(str(tmp_path / name), "lines"))
        assert [(d.text, d.source[-1]) for d in got] == [
            ("one", "1"),
            ("two", "2"),
            ("three", "3"),
            ("four", "4"),
        ]


def test_no_text_error_is_the_read_documents_one(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": ""}\n')
    (tmp_path / "b.jsonl").write_text('{"text": " \\n"}\n')
    for spec, nonempty in ((str(tmp_path / "a.jsonl"), False), (str(tmp_path / "*"), True)):
        with pytest.raises(DataError) as want:
            data.read_documents(spec, "jsonl")
        assert str(want.value) == str(data.no_text_error(spec, "jsonl", any_nonempty=nonempty))
        docs = list(data.iter_documents(spec, "jsonl"))  # yields them; raises nothing
        assert any(d.text for d in docs) is nonempty


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    """A fake `gs://` over `tmp_path/'gcs'`, as in tests/unit/runtime/test_paths.py: fsspec's DirFileSystem
    registered as fsspec's `gs` implementation, reached through etils.epath's real backend."""
    root = tmp_path / "gcs"
    root.mkdir()

    class FakeGCS(DirFileSystem):
        protocol = ("gs", "gcs")
        cachable = False

        def __init__(self, *args, **kwargs):
            super().__init__(path=str(root), fs=LocalFileSystem())

    for name in ("gs", "gcs"):
        monkeypatch.setitem(fsspec_registry, name, FakeGCS)
    epath_backend.fsspec_backend._get_filesystem.cache_clear()
    yield root
    epath_backend.fsspec_backend._get_filesystem.cache_clear()


def test_remote_jsonl(bucket, monkeypatch):
    monkeypatch.setattr(files, "CHUNK", 3)
    write_corpus(bucket / "b" / "c", "jsonl")
    spec = "gs://b/c/*.jsonl*"
    want = data.read_documents(spec, "jsonl")
    assert len(want) == 7 and want[0].source == "gs://b/c/jsonl0.jsonl:1"
    assert list(data.iter_documents(spec, "jsonl")) == want
    assert list(data.iter_documents(spec, "jsonl", start=2, stop=5)) == want[2:5]
    assert data.count_documents(spec, "jsonl") == len(want)


MEMORY_PROBE = textwrap.dedent(
    """
    import json, re, sys
    from ppl_jax.data import documents as data

    def peak_kib():
        # The process's own peak RSS: not ru_maxrss, which starts at the parent's peak (Linux
        # keeps it across fork and exec), so that it would hide any growth below pytest's size.
        with open("/proc/self/status") as f:
            return int(re.search(r"VmHWM:\\s*(\\d+) kB", f.read()).group(1))

    before = peak_kib()
    chars = n = 0
    for doc in data.iter_documents(sys.argv[1], "jsonl"):
        chars += len(doc.text)
        n += 1
    after = peak_kib()
    print(json.dumps({"growth_mib": (after - before) / 1024, "chars": chars, "docs": n}))
    """
)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM (Linux)")
@pytest.mark.parametrize("suffix, mib", [("", 150), (".gz", 100), (".zst", 100)])
def test_memory_stays_bounded(tmp_path, suffix, mib):
    """Peak memory grows by less than 60 MiB while 100s of MiB of text are read (read_documents
    holds a file several times over)."""
    path = tmp_path / f"big.jsonl{suffix}"
    text = "Grüße, a line of text. " * 150
    line = (json.dumps({"text": text, "id": 0}) + "\n").encode()
    n = (mib << 20) // len(line) + 1
    if suffix == ".gz":
        f = gzip.open(path, "wb", compresslevel=1)
    elif suffix == ".zst":  # a ratio in the 1000s: a few compressed bytes stand for 100s of KiB
        f = zstandard.ZstdCompressor().stream_writer(open(path, "wb"))
    else:
        f = open(path, "wb")
    with f:
        for _ in range(n):
            f.write(line)
    repo = helpers.REPO  # this checkout's ppl_jax
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, str(path)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=120,
    )
    got = json.loads(out.stdout)
    assert got["docs"] == n and got["chars"] == n * len(text)
    assert got["growth_mib"] < 60, got
