"""What SGLang's --enable-priority-scheduling does with the priorities fairgate sends.

fairgate sends `priority` 0-3 (`rules.engine_priority`: a light tenant's request
2 above a heavy one's, interactive 1 above batch) when /server_info says
priority scheduling is on. SGLang 0.5.23 preempts a running request only when the
newcomer's priority exceeds it by more than `priority_scheduling_preemption_threshold`
(default 10), so fairgate's priorities only order SGLang's waiting queue. The
findings are written up in docs/sglang.md.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp

from scheduler import rules
from tests.sglang.helpers import assert_sglang_idle, wait_running
from tests.sglang.real_server import RealSglang

SLOTS = 4  # sglang_b runs --max-running-requests 4


@dataclass(slots=True)
class Outcome:
    rid: str
    first_token_s: float  # on the test's monotonic clock
    done_s: float
    meta: dict[str, Any]


async def _stream(s: aiohttp.ClientSession, url: str, rid: str, priority: int, n: int) -> Outcome:
    body = {
        "rid": rid,
        "text": "hello",
        "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True},
        "stream": True,
        "priority": priority,
    }
    # Unique rids: SGLang can abort a new request whose rid an ended one used.
    body["rid"] = f"{rid}-{uuid.uuid4().hex}"
    first, last = 0.0, None
    async with s.post(url + "/generate", json=body) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data: {"):
                first = first or time.monotonic()
                last = json.loads(line[5:])
    assert last is not None and "meta_info" in last, last
    return Outcome(rid, first, time.monotonic(), last["meta_info"])


async def _saturate_then(
    url: str, late: list[tuple[str, int]], low_tokens: int = 1200
) -> dict[str, Outcome]:
    """Fill every slot with priority-0 streams, then send `late` (rid, priority) in order."""
    async with aiohttp.ClientSession() as s:
        lows = [
            asyncio.create_task(_stream(s, url, f"low-{i}", 0, low_tokens)) for i in range(SLOTS)
        ]
        await wait_running(url, SLOTS)
        later = []
        for rid, priority in late:
            later.append(asyncio.create_task(_stream(s, url, rid, priority, 16)))
            await asyncio.sleep(0.2)  # arrival order is the order given
        done = await asyncio.gather(*lows, *later)
    await assert_sglang_idle(url)
    return {o.rid: o for o in done}


async def test_fairgates_priorities_do_not_preempt(sglang_b: RealSglang) -> None:
    # fairgate's widest gap: a light tenant's interactive request over heavy batch.
    top, bottom = rules.engine_priority(False, True), rules.engine_priority(True, False)
    assert bottom == 0  # what _saturate_then fills the slots with
    got = await _saturate_then(sglang_b.url, [("interactive", top)])
    first_low_done = min(got[f"low-{i}"].done_s for i in range(SLOTS))
    # Below the preemption threshold: it waits for a slot.
    assert got["interactive"].first_token_s >= first_low_done
    assert all(got[f"low-{i}"].meta["num_retractions"] == 0 for i in range(SLOTS))
    assert all(got[f"low-{i}"].meta["finish_reason"]["type"] == "length" for i in range(SLOTS))


async def test_priority_orders_sglangs_waiting_queue(sglang_b: RealSglang) -> None:
    # A batch request arrives first, an interactive one after it: when a slot
    # frees, SGLang starts the interactive one first (FCFS would not).
    got = await _saturate_then(sglang_b.url, [("batch", 0), ("interactive", 1)])
    assert got["interactive"].first_token_s < got["batch"].first_token_s


async def test_a_priority_gap_above_the_threshold_preempts(sglang_b: RealSglang) -> None:
    got = await _saturate_then(sglang_b.url, [("urgent", 20)])
    lows = [got[f"low-{i}"] for i in range(SLOTS)]
    # Served at once: done before any of the running low-priority streams.
    assert got["urgent"].done_s < min(o.done_s for o in lows)
    # One running request was retracted (its KV freed, recomputed later) to make
    # room; it still finishes in full, as do the others.
    assert sum(o.meta["num_retractions"] for o in lows) >= 1
    assert all(o.meta["finish_reason"]["type"] == "length" for o in lows)
    assert all(o.meta["completion_tokens"] == 1200 for o in lows)
