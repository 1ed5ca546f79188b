"""Documents' sources in compact arrays (`ppl_jax.data.sources.Sources`; issue 19, many short
documents): the same strings as `path:line`, 5 bytes a document for up to 256 files."""

from __future__ import annotations

import numpy as np
import pytest

from ppl_jax.data import documents as data
from ppl_jax.data.sources import Sources


def test_sources_read_as_the_documents_strings(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("one\n\ntwo\n")
    b.write_text("three\n")
    found = data.resolve_paths(f"{a},{b}")
    rows = list(data.iter_sourced(found, "lines"))
    sources = Sources(found, [f for _, f, _ in rows], [n for _, _, n in rows])
    want = [d.source for d in data.read_documents(f"{a},{b}", "lines")]
    assert list(sources) == want == [f"{a}:1", f"{a}:3", f"{b}:1"]
    assert sources == tuple(want) and sources[1:] == want[1:]
    assert sources.nbytes == 5 * 3  # a uint8 file index and a uint32 line
    whole = Sources(found, [0, 1], [0, 0])
    assert list(whole) == [d.source for d in data.read_documents(f"{a},{b}", "text")]


def test_the_file_index_is_the_smallest_unsigned_integer_for_the_files():
    for num_files, dtype in ((1, np.uint8), (256, np.uint8), (257, np.uint16), (65537, np.uint32)):
        files = [f"/f{i}" for i in range(num_files)]
        s = Sources(files, [0, num_files - 1], [1, 2])
        assert s.file.dtype == dtype and s.line.dtype == np.uint32
        assert list(s) == ["/f0:1", f"/f{num_files - 1}:2"]
    for bad in ([1], [-1]):
        with pytest.raises(ValueError, match="a file index outside the 1 files"):
            Sources(["/a"], bad, [1])
