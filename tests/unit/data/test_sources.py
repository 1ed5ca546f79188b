"""Documents' sources in compact arrays (`ppl_jax.data.sources.Sources`; issue 19, many short
documents): the same strings as `path:line`, 8 bytes a document."""

from __future__ import annotations

import numpy as np

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
    assert sources.nbytes == 8 * 3
    whole = Sources(found, [0, 1], [0, 0])
    assert list(whole) == [d.source for d in data.read_documents(f"{a},{b}", "text")]


def test_concat_merges_the_file_lists():
    x = Sources(["/a", "/b"], [0, 1, 1], [1, 2, 3])
    y = Sources(["/b", "/c"], [0, 1], [4, 5])
    both = Sources.concat([x, y])
    assert both.files == ("/a", "/b", "/c")
    assert list(both) == ["/a:1", "/b:2", "/b:3", "/b:4", "/c:5"]
    np.testing.assert_array_equal(both.file, [0, 1, 1, 1, 2])
