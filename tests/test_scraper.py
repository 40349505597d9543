"""The scraper and snapshot store, with a hand-written fetch (no network)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from ext_proc.policy.model import Pool
from ext_proc.signals.scraper import Scraper, SnapshotStore


class PageFetch:
    """Serves a page per URL; a string starting with '!' raises OSError with that text."""

    def __init__(self, pages: dict[str, str]) -> None:
        self.pages = pages
        self.calls = 0
        self.finished_hangs = 0

    async def __call__(self, url: str, timeout_s: float) -> str:
        self.calls += 1
        page = self.pages[url]
        if page.startswith("!"):
            raise OSError(page[1:])
        if page == "hang":
            await asyncio.sleep(timeout_s * 10)
            self.finished_hangs += 1
        return page


POOL = Pool(name="p", metrics_urls=("http://a/metrics", "http://b/metrics"), max_age_s=2.0)


def test_a_scrape_publishes_a_snapshot_of_the_backends_that_answered() -> None:
    fetch = PageFetch(
        {
            "http://a/metrics": "vllm:kv_cache_usage_perc 0.5\n",
            "http://b/metrics": "!connection refused",
        }
    )
    store = SnapshotStore({"p": 2.0})
    snap = asyncio.run(Scraper({"p": POOL}, store, fetch=fetch).scrape_once(POOL))
    assert [b.url for b in snap.backends] == ["http://a/metrics"]
    got = store.get("p", now_s=snap.taken_at_s + 1.0)
    assert got is snap and got.kv_cache_usage == 0.5


def test_snapshot_turns_stale_after_max_age() -> None:
    fetch = PageFetch(
        {
            "http://a/metrics": "vllm:kv_cache_usage_perc 0.5\n",
            "http://b/metrics": "vllm:kv_cache_usage_perc 0.5\n",
        }
    )
    store = SnapshotStore({"p": 2.0})
    snap = asyncio.run(Scraper({"p": POOL}, store, fetch=fetch).scrape_once(POOL))
    assert store.get("p", now_s=snap.taken_at_s + 1.99) is snap
    assert store.get("p", now_s=snap.taken_at_s + 2.01) is None


def test_all_backends_failing_keeps_the_previous_snapshot_to_age() -> None:
    pages = {"http://a/metrics": "vllm:kv_cache_usage_perc 0.5\n", "http://b/metrics": "!down"}
    fetch = PageFetch(pages)
    store = SnapshotStore({"p": 2.0})
    scraper = Scraper({"p": POOL}, store, fetch=fetch)
    first = asyncio.run(scraper.scrape_once(POOL))
    pages["http://a/metrics"] = "<html>garbage"
    second = asyncio.run(scraper.scrape_once(POOL))
    assert second.backends == ()
    assert store.get("p", now_s=first.taken_at_s) is first


def test_failures_are_logged_once_per_change_of_state(caplog: pytest.LogCaptureFixture) -> None:
    pages = {"http://a/metrics": "!down", "http://b/metrics": "!down"}
    scraper = Scraper({"p": POOL}, SnapshotStore({"p": 2.0}), fetch=PageFetch(pages))
    caplog.set_level(logging.INFO, logger="ice.scraper")
    for _ in range(5):
        asyncio.run(scraper.scrape_once(POOL))
    assert len([r for r in caplog.records if "failed" in r.message]) == 2  # one per URL
    pages["http://a/metrics"] = "vllm:kv_cache_usage_perc 0.1\n"
    asyncio.run(scraper.scrape_once(POOL))
    assert len([r for r in caplog.records if "recovered" in r.message]) == 1


def test_background_loop_scrapes_repeatedly_and_stops() -> None:
    fetch = PageFetch(
        {
            "http://a/metrics": "vllm:kv_cache_usage_perc 0.3\n",
            "http://b/metrics": "vllm:kv_cache_usage_perc 0.3\n",
        }
    )
    fast = Pool(name="p", metrics_urls=POOL.metrics_urls, scrape_interval_s=0.01)
    store = SnapshotStore({"p": 2.0})

    async def run() -> None:
        scraper = Scraper({"p": fast}, store, fetch=fetch)
        await scraper.start()
        await asyncio.sleep(0.2)
        await scraper.stop()

    asyncio.run(run())
    assert fetch.calls >= 10
    assert store.get("p") is not None


def test_a_hanging_source_is_cut_at_its_timeout() -> None:
    hanging = Pool(name="p", metrics_urls=("http://a/metrics",), scrape_timeout_s=0.05)
    fetch = PageFetch({"http://a/metrics": "hang"})
    store = SnapshotStore({"p": 2.0})

    snap = asyncio.run(Scraper({"p": hanging}, store, fetch=fetch).scrape_once(hanging))
    assert snap.backends == ()
    assert fetch.calls == 1 and fetch.finished_hangs == 0  # the hang was cancelled, not awaited
