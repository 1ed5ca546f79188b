"""The feed (`ppl_jax.scoring.scorer`): batches prepared ahead of the loop in a background thread give
the very same per-window sums as batches prepared in the loop; skipped batches are never
prepared; a stop or an error on either side ends the thread; the host's share is reported."""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.models import registry
from ppl_jax.plans import windows as windows_lib
from ppl_jax.plans.layout import plan_layout
from ppl_jax.plans.windows import Windows
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring.scorer import Scorer

import helpers

BATCH = 8


class Watch:
    """An observer of the loop (`ppl_jax.scoring.observers.ScoreObserver`) from two callbacks."""

    def __init__(self, stop=None, fetched=None):
        self.stop, self.fetched = stop, fetched

    def should_stop(self, i):
        return bool(self.stop and self.stop(i))

    def on_batch(self, i, rows, host):
        if self.fetched:
            self.fetched(i)

    def close(self):
        pass


class SpyWindows(Windows):
    """Windows whose `fill` records which batch it filled, in which thread, and can fail or
    wait (the hooks are set per test in `hooks`)."""

    hooks: dict = {}

    def fill(self, row_windows, width):
        first = next((r[0] for r in row_windows if r), None)
        batch = self.hooks["batch_of"].get(first)
        self.hooks["filled"].append((batch, threading.current_thread().name))
        if batch == self.hooks.get("fail_at"):
            raise ValueError(f"a bug while filling batch {batch}")
        time.sleep(self.hooks.get("sleep", 0.0))
        arrays = super().fill(row_windows, width)
        if batch in self.hooks["events"]:
            self.hooks["events"][batch].set()
        return arrays


@pytest.fixture(scope="module")
def setup():
    """A tiny Llama on the 8 fake devices, windows of documents of varied lengths, and their
    layout in batches of two bucket widths (one window per row)."""
    cfg = helpers.TINY
    model = registry.build(cfg.to_dict(), jnp.float32)
    mesh = mesh_lib.make_mesh(-1, 1)
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    params = jax.device_put(helpers.random_params(cfg, seed=4), shardings)
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 34, size=120)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    tokens = rng.integers(0, cfg.vocab_size, size=int(lengths.sum())).astype(np.int32)
    plain = windows_lib.make(tokens, starts, lengths, np.ones(lengths.size), 32)
    win = SpyWindows(**{f: getattr(plain, f) for f in plain.__dataclass_fields__})
    layout = plan_layout(win, BATCH, num_buckets=2)
    assert layout.num_batches == 15 and len(set(layout.widths)) == 2
    batch_of = {layout.rows[r][0]: r // BATCH for r in range(len(layout.rows))}
    scorer = Scorer(model, mesh, shardings)
    return scorer, params, win, layout, batch_of


@pytest.fixture
def spy(setup):
    scorer, params, win, layout, batch_of = setup
    SpyWindows.hooks = {"batch_of": batch_of, "filled": [], "events": {}}
    scorer.prefetch = Scorer.prefetch
    yield SpyWindows.hooks
    scorer.prefetch = Scorer.prefetch


def _score(setup, prefetch, layout=None, stop=None, fetched=None, more=(), **kwargs):
    scorer, params, win, default_layout, _ = setup
    layout = layout or default_layout
    scorer.prefetch = prefetch
    threads = threading.active_count()
    totals = scorer.score(params, win, layout, observers=[Watch(stop, fetched), *more], **kwargs)
    assert threading.active_count() == threads  # the feed's thread is joined
    return totals


def _same(a, b, where=slice(None)):
    for name in ("window_nll", "window_tokens", "window_entropy", "window_correct"):
        np.testing.assert_array_equal(getattr(a, name)[where], getattr(b, name)[where])


def test_prefetching_gives_the_sums_of_the_loop_bit_for_bit(setup, spy):
    _, _, win, layout, _ = setup
    inline = _score(setup, 0)
    assert {thread for _, thread in spy["filled"]} == {threading.current_thread().name}
    spy["filled"].clear()
    ahead = _score(setup, 2)
    assert {thread for _, thread in spy["filled"]} == {"ppl_jax-feed"}
    assert [b for b, _ in spy["filled"]] == list(range(layout.num_batches))  # in order, once
    _same(inline, ahead)
    np.testing.assert_array_equal(ahead.window_tokens, win.num_scored())
    assert np.all(ahead.window_nll > 0)
    for totals in (inline, ahead):
        assert 0 < totals.host_seconds <= totals.scoring_seconds
        assert totals.prepare_seconds > 0
    assert inline.host_seconds >= inline.prepare_seconds  # prepared in the loop itself
    # Packed rows (several windows per row, their sums per segment slot).
    packed = plan_layout(win, BATCH, pack=True)
    assert packed.max_segments > 1
    inline, ahead = _score(setup, 0, layout=packed), _score(setup, 3, layout=packed)
    _same(inline, ahead)
    np.testing.assert_array_equal(ahead.window_tokens, win.num_scored())


def test_the_feed_prepares_ahead_of_the_loop(setup, spy):
    """Before the loop asks whether to stop at batch 1, the thread has batch 2 ready (with
    prefetch off it cannot: nothing is prepared before the loop asks for it)."""
    ready = threading.Event()
    spy["events"][2] = ready
    seen = {}

    def should_stop(i):
        if i == 1:
            seen["ahead"] = ready.wait(timeout=seen["timeout"])
        return False

    seen["timeout"] = 30
    _score(setup, 2, stop=should_stop)
    assert seen["ahead"] is True
    ready.clear()
    seen["timeout"] = 0.5
    _score(setup, 0, stop=should_stop)
    assert seen["ahead"] is False


@pytest.mark.parametrize("prefetch", [0, 2, 3])
def test_skipped_batches_are_never_prepared_nor_changed(setup, spy, prefetch):
    scorer, params, win, layout, _ = setup
    full = _score(setup, 0)
    skip = np.zeros(layout.num_batches, bool)
    skip[[0, 3, layout.num_batches - 1]] = True
    resumed = type(full).zeros(win.num_windows)
    skipped = np.asarray([k for i in np.flatnonzero(skip) for r in layout.batch_rows(i) for k in r])
    resumed.window_nll[skipped] = -7.0  # what a journal held for those batches is kept
    spy["filled"].clear()
    fetched = []
    totals = _score(setup, prefetch, totals=resumed, skip=skip, fetched=fetched.append)
    assert totals is resumed
    assert sorted(b for b, _ in spy["filled"]) == list(np.flatnonzero(~skip))
    assert fetched == list(np.flatnonzero(~skip))
    assert np.all(totals.window_nll[skipped] == -7.0)
    others = np.setdiff1d(np.arange(win.num_windows), skipped)
    _same(full, totals, others)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_stop_at_batch_k_ends_the_loop_and_the_thread(setup, spy, prefetch):
    _, _, win, layout, _ = setup
    full = _score(setup, 0)
    k = 4
    asked, fetched = [], []

    def should_stop(i):
        asked.append(i)
        return i == k

    later, told = [], []  # a second observer: asked at every index too, told of every batch
    second = Watch(lambda i: later.append(i), lambda i: told.append(i))
    totals = _score(setup, prefetch, stop=should_stop, fetched=fetched.append, more=[second])
    assert totals.stopped_at == k
    assert asked == later == list(range(k + 1)) and fetched == told == list(range(k))
    done = np.asarray([w for i in range(k) for r in layout.batch_rows(i) for w in r])
    _same(full, totals, done)
    rest = np.setdiff1d(np.arange(win.num_windows), done)
    assert np.all(totals.window_tokens[rest] == 0) and np.all(totals.window_nll[rest] == 0)


def test_an_error_in_the_feed_is_raised_in_the_loop(setup, spy):
    spy["fail_at"] = 3
    fetched = []
    with pytest.raises(ValueError, match="a bug while filling batch 3"):
        _score(setup, 2, fetched=fetched.append)
    assert fetched == [0, 1]  # batch 2 was in flight when batch 3 failed to come


def test_an_error_in_the_loop_stops_the_feed(setup, spy):
    spy["sleep"] = 0.02

    def on_fetched(i):
        if i == 1:
            raise KeyError("the journal failed")

    with pytest.raises(KeyError, match="the journal failed"):
        _score(setup, 3, fetched=on_fetched)
    # The loop took batches 0-2; the thread prepared at most 3 more for the queue and one that
    # waited for room, then stopped.
    assert setup[3].num_batches > 7
    assert [b for b, _ in spy["filled"]] == list(range(len(spy["filled"])))
    assert 3 <= len(spy["filled"]) <= 7


def test_the_host_share_counts_the_waits(setup, spy):
    """Preparing in the loop, every batch's preparation is waited for; ahead, the loop waits less
    than the thread spent preparing (the device works meanwhile)."""
    _, _, _, layout, _ = setup
    spy["sleep"] = 0.05
    inline = _score(setup, 0)
    assert inline.host_seconds >= 0.05 * layout.num_batches
    assert inline.prepare_seconds >= 0.05 * layout.num_batches
    spy["filled"].clear()
    ahead = _score(setup, 2, fetched=lambda i: time.sleep(0.1))  # a loop slower than the feed
    assert ahead.prepare_seconds >= 0.05 * layout.num_batches
    assert ahead.host_seconds < ahead.prepare_seconds
