"""Benchmark: data preparation alone, on generated corpora of growing size (issue 10, item 6).

    python -m benchmarks.bench --data_scale                      # 10 MB, 100 MB, 1 GB; 1 and 2 processes
    python -m benchmarks.bench --data_scale --data_sizes_mb=1,10 --data_processes=1

What is measured is what `ppl_jax.evaluation.run.evaluate` does with the data before it scores: load
the tokenizer; with `data.cache_dir` (the default here), `planner.planned`: a plan-cache hit, else
the token cache (each process reads and tokenizes its share of the documents, `ppl_jax.plans.token_cache`)
and the plan from its lengths (`ppl_jax.plans.stream_plans`); without one, read the documents
(`planner.read`), apply the budget (`planner.cut`), tokenize and plan (`planner.plan`). Then lay out the
batches (`layout.plan_layout`) and check that every process planned the same windows
(`protocols.plan_digest`, `distributed.check_same_plan`). Modes: `cold` (a fresh cache folder),
`cached` (the same folder again: the plan is found), `replan` (the plans removed, the token cache
kept: another protocol or sequence length). Each measurement runs in a fresh child process
(`python -m benchmarks.bench_data --data_child=...`),
with 1 process, or 2 processes joined by `jax.distributed` on localhost (the environment of
`launch/local.sh`: PPL_JAX_COORDINATOR, PPL_JAX_NUM_PROCESSES, PPL_JAX_PROCESS_ID). A child reports
its own peak resident memory: `VmHWM` of `/proc/self/status` after each phase, the last being its
whole life's peak (the same figure as `getrusage(RUSAGE_SELF).ru_maxrss`), with its RSS before
the data were read. Wall time is the child's own, from loading the tokenizer to the plan check
(imports and the start of JAX's runtime, which `evaluate` does first for its mesh, excluded), the
slowest process's for 2 processes. Tokenizing is timed by wrapping the tokenizer's
`encode`/`encode_with_bytes`/`encode_flat_with_bytes` (the outermost call only); planning is the
rest.

Beside it, in the same run and its own child process: `tokenizers.Tokenizer.encode_batch` on the
same documents (read from the same file beforehand, not timed), in batches of `--data_peer_batch`
documents with the library's own thread pool, keeping each document's ids as an `int32` array.

Corpora: documents of 1 to 8 KB (lines of real text, lengths drawn with a fixed seed) cut from the
CPython standard library's `.py` files with a byte-level BPE trained here (vocabulary 4,096), or,
when PPL_JAX_TEST_DATA names a folder, from its WikiText-2, Tiny Shakespeare and Botchan texts
with its GPT-2 `tokenizer.json`; repeated until the requested size and written as JSONL (field
`text`). Sizes are in MB = 10^6 bytes of UTF-8 document text.

Memory and time rules: a size is run only if its projected peak (all processes together) stays
under `--data_max_projected_gb` and under 80% of the memory available now, and its projected
wall time under `--data_max_projected_s`; the projections are the 1-process child's RSS before
reading plus its growth per MB, and its seconds per MB (times the processes), at the largest size
measured so far (same protocol). They were made for the preparation that held the whole corpus
in memory and overestimate the token cache's, whose peak does not grow with the corpus; raise
the limits to run large sizes. Otherwise the row says "not run (projected N GB, S s)".
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time

from absl import flags

SIZES = flags.DEFINE_list("data_sizes_mb", ["10", "100", "1000"], "Corpus sizes, MB of text.")
PROCESSES = flags.DEFINE_list("data_processes", ["1", "2"], "Process counts to measure.")
PROTOCOLS = flags.DEFINE_list(
    "data_protocols", ["sliding", "lm_eval_rolling"], "Protocols (lm_eval_rolling needs BOS/EOS)."
)
SEQ_LEN = flags.DEFINE_integer("data_seq_len", 1024, "Window length (model inputs).")
STRIDE = flags.DEFINE_integer("data_stride", 512, "Stride of `sliding`.")
MAX_GB = flags.DEFINE_float("data_max_projected_gb", 12.0, "Largest projected peak RSS to run.")
MAX_S = flags.DEFINE_float("data_max_projected_s", 600.0, "Longest projected measurement to run.")
PEER_BATCH = flags.DEFINE_integer("data_peer_batch", 1024, "Documents per encode_batch call.")
WORK = flags.DEFINE_string("data_work_dir", "/tmp/ppl_jax_bench_data", "Corpora and tokenizer.")
SHAPE = flags.DEFINE_enum(
    "data_shape",
    "documents",
    ["documents", "lines"],
    "documents: JSONL documents of 1-8 KB; lines: many short documents, one line each "
    "(data.format=lines, 40-200 bytes, Paloma-style records).",
)
CHILD = flags.DEFINE_string("data_child", "", "Internal: a child's task, as JSON.")

MB = 10**6
DEFAULT_OUT = "bench_data_results.json"
DOC_BYTES = (1000, 8000)  # document lengths, drawn uniformly (bytes, before cutting at lines)
SHARED_TEXTS = (
    "wikitext-2/test.txt",
    "wikitext-2/valid.txt",
    "tinyshakespeare/input.txt",
    "botchan/botchan.txt",
)
CHILD_TIMEOUT_S = 1800


# ------------------------------------------------------------------------------ corpora


def source_texts() -> tuple[str, list[str]]:
    """`(kind, texts)`: the shared data's texts if PPL_JAX_TEST_DATA names a folder, else the
    standard library's top-level `.py` files (sorted by name)."""
    shared = os.environ.get("PPL_JAX_TEST_DATA", "")
    if shared and os.path.isdir(shared):
        names = [os.path.join(shared, n) for n in SHARED_TEXTS]
        kind = "shared"
    else:
        stdlib = sysconfig.get_paths()["stdlib"]
        names = sorted(os.path.join(stdlib, n) for n in os.listdir(stdlib) if n.endswith(".py"))
        kind = "stdlib"
    texts = []
    for name in names:
        with open(name, encoding="utf-8", errors="replace") as f:
            texts.append(f.read())
    return kind, texts


def documents(texts: list[str], seed: int = 0) -> list[str]:
    """The texts cut at line ends into documents of about 1-8 KB (drawn with `seed`)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    docs = []
    for text in texts:
        lines, size, target = [], 0, int(rng.integers(*DOC_BYTES))
        for line in text.splitlines(keepends=True):
            lines.append(line)
            size += len(line.encode("utf-8"))
            if size >= target:
                docs.append("".join(lines))
                lines, size, target = [], 0, int(rng.integers(*DOC_BYTES))
        if "".join(lines).strip():
            docs.append("".join(lines))
    return [d for d in docs if d.strip()]


def short_documents(texts: list[str]) -> list[str]:
    """Many short documents: the texts' lines joined until each holds 40 to 200 bytes, one line
    each (no line end inside), as a `lines` corpus reads them."""
    docs, current = [], ""
    for text in texts:
        for line in text.splitlines():
            line = line.strip()
            if not line:
                continue
            current = f"{current} {line}" if current else line
            if len(current.encode("utf-8")) >= 40:
                docs.append(current[:200])
                current = ""
    return docs


def make_corpus(size_mb: float, work_dir: str, shape: str = "documents") -> dict:
    """Writes (once) a corpus of at least `size_mb` MB of document text, repeating the source
    documents in order and stopping at the first document that reaches the size: JSONL
    documents of 1-8 KB (`shape="documents"`), or a `lines` file of one-line documents of 40 to
    200 bytes (`shape="lines"`).

    Returns:
      `{"path", "source", "documents", "text_bytes", "file_bytes", "format"}` (bytes of UTF-8
      text).
    """
    kind, texts = source_texts()
    target = int(size_mb * MB)
    ext = "jsonl" if shape == "documents" else "lines.txt"
    path = os.path.join(work_dir, f"corpus-{kind}-{target}.{ext}")
    meta_path = path + ".meta.json"
    if os.path.isfile(meta_path):
        with open(meta_path, encoding="utf-8") as f:
            return json.load(f)
    if shape == "documents":
        docs = [
            (json.dumps({"text": d}, ensure_ascii=False) + "\n", len(d.encode()))
            for d in documents(texts)
        ]
    else:
        docs = [(d + "\n", len(d.encode())) for d in short_documents(texts)]
    count, text_bytes = 0, 0
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        while text_bytes < target:
            for line, n in docs:
                f.write(line)
                count += 1
                text_bytes += n
                if text_bytes >= target:
                    break
    os.replace(tmp, path)
    meta = {
        "path": path,
        "source": kind,
        "documents": count,
        "text_bytes": text_bytes,
        "file_bytes": os.path.getsize(path),
        "format": "jsonl" if shape == "documents" else "lines",
    }
    with open(meta_path, "w", encoding="utf-8") as f:
        json.dump(meta, f)
    return meta


def tokenizer_path(work_dir: str) -> str:
    """The GPT-2 `tokenizer.json` of the shared data, or a byte-level BPE (vocabulary 4,096, with
    `<|endoftext|>` as BOS/EOS) trained once on 1 MB of the standard library's source."""
    shared = os.environ.get("PPL_JAX_TEST_DATA", "")
    if shared and os.path.isdir(shared):
        return os.path.join(shared, "tokenizers", "gpt2.json")
    path = os.path.join(work_dir, "bpe-4096.json")
    if not os.path.isfile(path):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=4096,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        text = "".join(source_texts()[1])[:MB]
        tok.train_from_iterator(
            [text[i : i + 10_000] for i in range(0, len(text), 10_000)], trainer
        )
        tok.save(path)
    return path


# ------------------------------------------------------------------------------ children


def _status_kb(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def cache_supported() -> bool:
    """Whether `DatasetSpec` has a token cache (`cache_dir`) to measure a cached mode with."""
    from ppl_jax.data import DatasetSpec

    return "cache_dir" in {f.name for f in dataclasses.fields(DatasetSpec)}


def child_prepare(task: dict) -> dict:
    """One process's data preparation, as `evaluate` does it; phase seconds and peak RSS."""
    from ppl_jax.runtime import distributed

    distributed.initialize_from_env()
    import jax

    jax.process_count()  # JAX's runtime starts before the data, as in `evaluate` (its mesh)
    from ppl_jax import tokenizer
    from ppl_jax.data import DatasetSpec
    from ppl_jax.plans import BatchSpec, ProtocolSpec, plan_layout, planner, protocols

    extra = {"cache_dir": task["cache_dir"]} if task.get("cache_dir") else {}
    ds = DatasetSpec(
        name="bench",
        path=task["corpus"],
        format=task.get("format", "jsonl"),
        tokenizer=task["tokenizer"],
        errors="strict",
        separator="\n\n",
        jsonl_field="text",
        allow_tokenizer_mismatch=False,
        **extra,
    )
    sliding = task["protocol"] == "sliding"
    protocol = ProtocolSpec(
        name=task["protocol"],
        seq_len=task["seq_len"],
        stride=task["stride"] if sliding else None,
        add_bos="auto",
    )
    batch = BatchSpec(batch_size=8, packing=not sliding, length_buckets=1)
    out = {"rss_before_mb": _status_kb("VmRSS") / 1024}
    phases, peaks = {}, {}
    t0 = last = time.perf_counter()

    def mark(name: str) -> None:
        nonlocal last
        now = time.perf_counter()
        phases[name] = now - last
        peaks[name] = _status_kb("VmHWM") / 1024
        last = now

    tok = tokenizer.load_tokenizer(ds.tokenizer, None)
    mark("tokenizer_load")
    docs, counts = [], None
    if not ds.cache_dir:
        docs, counts = planner.read(ds)
        mark("read")
        docs, counts = planner.cut(docs, counts, ds, tok)
    encode_s, depth = [0.0], [0]

    def timed(method):
        def wrapper(texts):
            if depth[0]:  # called by another encoding method: timed there
                return method(texts)
            depth[0] += 1
            t = time.perf_counter()
            try:
                return method(texts)
            finally:
                encode_s[0] += time.perf_counter() - t
                depth[0] -= 1

        return wrapper

    for name in ("encode", "encode_with_bytes", "encode_flat_with_bytes"):
        if hasattr(tok, name):
            setattr(tok, name, timed(getattr(tok, name)))
    if ds.cache_dir:  # as `evaluate` does: the plan cache, else the token cache, else read
        p = planner.planned(ds, protocol, tok, tok.vocab_size)[0]
    else:
        p = planner.plan(ds, protocol, docs, counts, tok, tok.vocab_size)
    mark("plan")
    phases["tokenize"] = encode_s[0]
    phases["plan"] -= encode_s[0]
    layout = plan_layout(p.windows, batch.batch_size, pack=batch.packing)
    mark("layout")
    distributed.check_same_plan(protocols.plan_digest(p, batch.batch_size), "data 'bench'")
    mark("check_same_plan")
    out.update(
        prepare_s=time.perf_counter() - t0,
        phases_s=phases,
        peak_mb_after=peaks,
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        documents=p.num_documents,
        text_tokens=p.text_tokens,
        windows=p.windows.num_windows,
        batches=layout.num_batches,
    )
    return out


def child_peer(task: dict) -> dict:
    """`tokenizers`' own `encode_batch` on the corpus's documents; seconds and peak RSS."""
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(task["tokenizer"])
    out = {"rss_before_mb": _status_kb("VmRSS") / 1024}
    t = time.perf_counter()
    with open(task["corpus"], encoding="utf-8") as f:
        if task.get("format", "jsonl") == "jsonl":
            texts = [json.loads(line)["text"] for line in f if line.strip()]
        else:
            texts = [line.rstrip("\n") for line in f if line.strip()]
    out["read_s"] = time.perf_counter() - t
    t = time.perf_counter()
    ids, batch = [], task["batch"]
    for at in range(0, len(texts), batch):
        encs = tok.encode_batch(texts[at : at + batch], add_special_tokens=False)
        ids.extend(np.asarray(e.ids, np.int32) for e in encs)
    out.update(
        prepare_s=time.perf_counter() - t,
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        documents=len(texts),
        text_tokens=int(sum(a.size for a in ids)),
    )
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_children(task: dict, num_processes: int) -> list[dict]:
    """Runs `task` in `num_processes` fresh children (jax.distributed for 2 or more); returns
    each one's JSON. Raises RuntimeError with the child's stderr if one fails."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    if num_processes > 1:
        env.update(
            PPL_JAX_COORDINATOR=f"127.0.0.1:{_free_port()}",
            PPL_JAX_NUM_PROCESSES=str(num_processes),
        )
    cmd = [sys.executable, "-m", "benchmarks.bench_data", f"--data_child={json.dumps(task)}"]
    procs = []
    for i in range(num_processes):
        e = dict(env, PPL_JAX_PROCESS_ID=str(i)) if num_processes > 1 else env
        procs.append(
            subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    results = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise RuntimeError(f"a {task['kind']} child ran past {CHILD_TIMEOUT_S} s") from None
        if proc.returncode:
            for p in procs:
                p.kill()
            raise RuntimeError(f"a {task['kind']} child failed:\n{stderr[-3000:]}")
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return results


# ------------------------------------------------------------------------------ driver


def projected_peak_mb(measured: list[tuple[float, float, float]], size_mb: float, procs: int):
    """Projected peak RSS (MB, all `procs` processes together) of preparing `size_mb` MB, from
    `(text_mb, rss_before_mb, peak_rss_mb)` of one process at the sizes measured so far: the
    RSS before reading plus the growth per MB at the largest size, times `size_mb`. None when
    nothing was measured yet."""
    if not measured:
        return None
    text_mb, before, peak = max(measured)[:3]
    return procs * (before + (peak - before) / text_mb * size_mb)


def projected_seconds(measured: list[tuple[float, ...]], size_mb: float, procs: int):
    """Projected wall seconds of preparing `size_mb` MB on `procs` processes, from
    `(text_mb, rss_before_mb, peak_rss_mb, wall_s)` of one process: its seconds per MB at the
    largest size measured, times `size_mb` and `procs` (each process prepares the whole corpus
    today, on the same cores). None when nothing was measured yet."""
    if not measured:
        return None
    text_mb, wall = max(measured)[0], max(measured)[3]
    return procs * wall / text_mb * size_mb


def _available_mb() -> float:
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("inf")


def _row(size_mb, text_mb, procs, protocol, mode, status, children=None) -> dict:
    row = {"size_mb": size_mb, "text_mb": text_mb, "processes": procs, "protocol": protocol}
    row.update(mode=mode, status=status)
    if children:
        wall = max(c["prepare_s"] for c in children)
        row.update(
            wall_s=wall,
            mb_per_s=text_mb / wall,
            peak_rss_mb=max(c["peak_rss_mb"] for c in children),
            total_peak_rss_mb=sum(c["peak_rss_mb"] for c in children),
            children=children,
        )
    return row


def benchmark(
    sizes_mb: list[float],
    processes: list[int],
    protocols: list[str],
    work_dir: str,
    *,
    seq_len: int = 1024,
    stride: int = 512,
    max_projected_gb: float = 12.0,
    max_projected_s: float = 600.0,
    peer_batch: int = 1024,
    tokenizer_file: str | None = None,
    shape: str = "documents",
) -> dict:
    """Runs every measurement (see the module docstring).

    Args:
      sizes_mb: corpus sizes, MB (10^6 bytes) of document text, ascending.
      processes: process counts; protocols: `sliding` and/or `lm_eval_rolling` (dropped when
        the tokenizer has neither BOS nor EOS).
      work_dir: where corpora (and the trained tokenizer) are written and reused.
      seq_len, stride: the windows; max_projected_gb: the memory rule's limit (GB = 2^30 bytes);
      max_projected_s: the time rule's (a measurement projected to take longer is not run);
      peer_batch: documents per `encode_batch` call; tokenizer_file: a `tokenizer.json` in
        place of `tokenizer_path`'s choice; shape: the corpus (`make_corpus`).

    Returns:
      `{"rows": [...], ...}`: per row `size_mb`, `text_mb`, `processes`, `protocol`, `mode`,
      `status` ("ok", "not run (projected N GB)", "no cache yet") and, when run, `wall_s`,
      `mb_per_s`, `peak_rss_mb` (the largest process's, MiB), `total_peak_rss_mb`, each child's
      report, and the ratios to `encode_batch` (`_compare`).

    Raises:
      RuntimeError: a child failed (with its stderr) or ran past `CHILD_TIMEOUT_S`.
    """
    from ppl_jax.tokenizer import HFTokenizer

    os.makedirs(work_dir, exist_ok=True)
    tok_path = tokenizer_file or tokenizer_path(work_dir)
    tok = HFTokenizer.from_file(tok_path)
    if tok.bos_id is None and tok.eos_id is None:
        protocols = [p for p in protocols if p != "lm_eval_rolling"]
    cached = cache_supported()
    rows, measured = [], {p: [] for p in protocols}
    limit_mb = max_projected_gb * 1024
    for size in sizes_mb:
        plans = {}
        for protocol in protocols:
            for procs in processes:
                need = projected_peak_mb(measured[protocol], size, procs)
                room = min(limit_mb, 0.8 * _available_mb())
                took = projected_seconds(measured[protocol], size, procs)
                ok = need is None or (need <= room and took <= max_projected_s)
                plans[protocol, procs] = ok, need, took
        if not any(ok for ok, _, _ in plans.values()):
            need, took = min((n, t) for _, n, t in plans.values())
            rows.append(_not_run(_row(size, None, "-", "encode_batch", "cold", ""), need, took))
            for (protocol, procs), (_, need, took) in plans.items():
                rows.append(_not_run(_row(size, None, procs, protocol, "cold", ""), need, took))
            continue
        corpus = make_corpus(size, work_dir, shape)
        text_mb = corpus["text_bytes"] / MB
        base = {"corpus": corpus["path"], "tokenizer": tok_path, "format": corpus["format"]}
        peer = run_children(dict(base, kind="peer", batch=peer_batch), 1)
        rows.append(_row(size, text_mb, "-", "encode_batch", "cold", "ok", peer))
        _print_progress(rows[-1])
        for (protocol, procs), (ok, _, _) in plans.items():
            need = projected_peak_mb(measured[protocol], size, procs)
            took = projected_seconds(measured[protocol], size, procs)
            if not ok or (took is not None and took > max_projected_s):
                rows.append(_not_run(_row(size, text_mb, procs, protocol, "cold", ""), need, took))
                continue
            task = dict(base, kind="prepare", protocol=protocol)
            task.update(seq_len=seq_len, stride=stride)
            cache_dir = tempfile.mkdtemp(dir=work_dir) if cached else ""
            for mode in ("cold", "cached", "replan"):
                if mode != "cold" and not cached:
                    rows.append(_row(size, text_mb, procs, protocol, mode, "no cache yet"))
                    continue
                if mode == "replan":  # the token cache kept, the plans dropped
                    if not any(n.startswith("tokens-") for n in os.listdir(cache_dir)):
                        continue  # a protocol the token cache does not serve
                    for name in os.listdir(cache_dir):
                        if not name.startswith("tokens-"):
                            shutil.rmtree(os.path.join(cache_dir, name))
                children = run_children(dict(task, cache_dir=cache_dir), procs)
                rows.append(_row(size, text_mb, procs, protocol, mode, "ok", children))
                _compare(rows[-1], rows, peer)
                _print_progress(rows[-1])
                if mode == "cold" and procs == min(processes):  # per process, for projections
                    c = children[0]
                    measured[protocol].append(
                        (text_mb, c["rss_before_mb"], c["peak_rss_mb"], c["prepare_s"] / procs)
                    )
    return {
        "what": "data preparation alone (benchmarks.bench_data)",
        "tokenizer": tok.name,
        "tokenizer_path": tok_path,
        "source": source_texts()[0],
        "seq_len": seq_len,
        "stride": stride,
        "peer_batch_documents": peer_batch,
        "max_projected_gb": max_projected_gb,
        "max_projected_s": max_projected_s,
        "cache_supported": cached,
        "rss_measure": "VmHWM of /proc/self/status in each child (= getrusage RUSAGE_SELF)",
        "rows": rows,
    }


def _not_run(row: dict, need_mb: float, took_s: float) -> dict:
    row.update(
        status=f"not run (projected {need_mb / 1024:.1f} GB, {took_s:,.0f} s)",
        projected_peak_mb=need_mb,
        projected_s=took_s,
    )
    return row


def _compare(row: dict, rows: list[dict], peer: list[dict]) -> None:
    """Adds the ratios to the `encode_batch` run of the same size: throughput (MB/s over its
    MB/s; issue 10 asks at least 0.8), tokenizing alone likewise, and peak RSS."""
    p = peer[0]
    row["throughput_vs_encode_batch"] = p["prepare_s"] / row["wall_s"]
    tokenize = max(c["phases_s"]["tokenize"] for c in row["children"])
    # None for a cached run, which tokenizes nothing.
    row["tokenize_throughput_vs_encode_batch"] = p["prepare_s"] / tokenize if tokenize else None
    row["peak_rss_vs_encode_batch"] = row["peak_rss_mb"] / p["peak_rss_mb"]
    tokens = {c["text_tokens"] for c in row["children"]}
    row["text_tokens"] = tokens.pop() if len(tokens) == 1 else sorted(tokens)


COLUMNS = (
    ("size MB", "size_mb", "{:g}"),
    ("procs", "processes", "{}"),
    ("protocol", "protocol", "{}"),
    ("mode", "mode", "{}"),
    ("wall s", "wall_s", "{:.1f}"),
    ("MB/s", "mb_per_s", "{:.2f}"),
    ("peak RSS MB", "peak_rss_mb", "{:,.0f}"),
    ("x encode_batch MB/s", "throughput_vs_encode_batch", "{:.2f}"),
    ("x encode_batch RSS", "peak_rss_vs_encode_batch", "{:.2f}"),
)


def format_table(result: dict) -> str:
    """The rows as a Markdown table (peak RSS per process; a status in place of numbers)."""
    lines = ["| " + " | ".join(c[0] for c in COLUMNS) + " |"]
    lines.append("| " + " | ".join("---" if i < 4 else "---:" for i in range(len(COLUMNS))) + " |")
    for row in result["rows"]:
        cells = []
        for i, (_, key, fmt) in enumerate(COLUMNS):
            if row["status"] != "ok" and i >= 4:
                cells.append(row["status"] if i == 4 else "")
            else:
                cells.append("" if row.get(key) is None else fmt.format(row[key]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _print_progress(row: dict) -> None:
    print(
        f"  {row['size_mb']:g} MB, {row['processes']} proc, {row['protocol']}, {row['mode']}: "
        f"{row['wall_s']:.1f} s, {row['peak_rss_mb']:,.0f} MB peak",
        flush=True,
    )


def main(out: str = DEFAULT_OUT) -> dict:
    """`python -m benchmarks.bench --data_scale`: runs `benchmark` with the `--data_*` flags,
    prints the table and writes the JSON to `out`."""
    t = time.perf_counter()
    result = benchmark(
        [float(s) for s in SIZES.value],
        [int(p) for p in PROCESSES.value],
        list(PROTOCOLS.value),
        WORK.value,
        seq_len=SEQ_LEN.value,
        stride=STRIDE.value,
        max_projected_gb=MAX_GB.value,
        max_projected_s=MAX_S.value,
        peer_batch=PEER_BATCH.value,
        shape=SHAPE.value,
    )
    result["shape"] = SHAPE.value
    result["benchmark_seconds"] = time.perf_counter() - t
    result["machine"] = {"cpus": os.cpu_count(), "memory_gb": _total_gb()}
    result["load_average"] = os.getloadavg()
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(format_table(result))
    print(f"results: {out} ({result['benchmark_seconds']:.0f} s)")
    return result


def _total_gb() -> float:
    with open("/proc/meminfo", encoding="ascii") as f:
        return int(f.readline().split()[1]) / 2**20


def _child_main(argv: list[str]) -> None:
    del argv
    task = json.loads(CHILD.value)
    result = child_prepare(task) if task["kind"] == "prepare" else child_peer(task)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    from absl import app

    app.run(_child_main)
