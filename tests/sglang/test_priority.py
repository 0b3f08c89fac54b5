"""What SGLang's --enable-priority-scheduling does with the priorities fairgate sends.

fairgate sends priorities when /server_info says priority scheduling is on
(`rules.engine_priority`). SGLang 0.5.23 preempts a running request only when the
newcomer's priority exceeds it by more than `priority_scheduling_preemption_threshold`
(default 10): with fair_isolation=reserve fairgate's priorities stay within it and
only order SGLang's waiting queue; with preempt a light tenant's clear it. Each
check runs on the real server and on the stand-in (`sim-server` with the same
flags), which must behave alike. The findings are written up in docs/sglang.md.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from fairgate.bench.sglang_cpu import RealSglang

from scheduler import rules
from service.engines.sglang_chunks import find_key, priority_options
from tests.sglang.helpers import assert_sglang_idle, wait_running
from tests.sglang_helpers import StartSim

SLOTS = 4  # sglang_b runs --max-running-requests 4
# Long enough to still run when the late requests come (real: tiny CPU model;
# stand-in: the 4090 model in real time, ~10 ms a token at 4 running).
LOW_TOKENS = {"real": 1200, "stand-in": 400}


@pytest.fixture(params=["real", "stand-in"])
async def server_b(request: pytest.FixtureRequest, start_sim: StartSim) -> tuple[str, str]:
    """(kind, URL) of SGLang with sglang_b's flags, or the stand-in with the same."""
    if request.param == "real":
        real: RealSglang = request.getfixturevalue("sglang_b")
        return "real", real.url
    sim = await start_sim(
        time_scale=1.0,
        incremental_output=True,
        enable_priority_scheduling=True,
        max_running_requests=SLOTS,
    )
    return "stand-in", sim.url


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
    server: tuple[str, str], late: list[tuple[str, int]], lows_at: tuple[int, ...] = (0,) * SLOTS
) -> dict[str, Outcome]:
    """Fill every slot with streams (`lows_at`: their priorities, 0 unless given),
    then send `late` (rid, priority) in order."""
    kind, url = server
    low_tokens = LOW_TOKENS[kind]
    async with aiohttp.ClientSession() as s:
        lows = [
            asyncio.create_task(_stream(s, url, f"low-{i}", lows_at[i], low_tokens))
            for i in range(SLOTS)
        ]
        await wait_running(url, SLOTS)
        later = []
        for rid, priority in late:
            later.append(asyncio.create_task(_stream(s, url, rid, priority, 16)))
            await asyncio.sleep(0.2)  # arrival order is the order given
        done = await asyncio.gather(*lows, *later)
    await assert_sglang_idle(url)
    return {o.rid: o for o in done}


async def test_server_info_says_how_it_preempts(server_b: tuple[str, str]) -> None:
    async with aiohttp.ClientSession() as s, s.get(server_b[1] + "/server_info") as resp:
        info = await resp.json()
    keys = (
        "enable_priority_scheduling",
        "disable_priority_preemption",
        "schedule_low_priority_values_first",
        "priority_scheduling_preemption_threshold",
    )
    assert [find_key(info, k) for k in keys] == [True, False, False, 10]
    assert priority_options(lambda k: find_key(info, k)) == (True, 10)


async def test_reserve_mode_priorities_do_not_preempt(server_b: tuple[str, str]) -> None:
    # fairgate's widest gap: a light tenant's interactive request over heavy batch.
    def prio(batch: bool, light: bool) -> int:
        return rules.engine_priority(batch, light, 10)

    top, bottom = prio(False, True), prio(True, False)
    assert bottom == 0  # what _saturate_then fills the slots with
    got = await _saturate_then(server_b, [("interactive", top)])
    first_low_done = min(got[f"low-{i}"].done_s for i in range(SLOTS))
    # Below the preemption threshold: it waits for a slot.
    assert got["interactive"].first_token_s >= first_low_done
    assert all(got[f"low-{i}"].meta["num_retractions"] == 0 for i in range(SLOTS))
    assert all(got[f"low-{i}"].meta["finish_reason"]["type"] == "length" for i in range(SLOTS))


async def test_priority_orders_sglangs_waiting_queue(server_b: tuple[str, str]) -> None:
    # A batch request arrives first, an interactive one after it: when a slot
    # frees, SGLang starts the interactive one first (FCFS would not).
    got = await _saturate_then(server_b, [("batch", 0), ("interactive", 1)])
    assert got["interactive"].first_token_s < got["batch"].first_token_s


@pytest.mark.parametrize("batch", [True, False])
async def test_a_lent_requests_priority_preempts(server_b: tuple[str, str], batch: bool) -> None:
    # fair_isolation=preempt: a request admitted beyond the room (batch: the
    # narrowest gap) over the highest priority fairgate sends within it.
    top = rules.engine_priority(False, True, 10)
    lent = rules.engine_priority(batch, True, 10, lent=True)
    got = await _saturate_then(server_b, [("urgent", lent - top)])
    lows = [got[f"low-{i}"] for i in range(SLOTS)]
    # Served at once: done before any of the running low-priority streams.
    assert got["urgent"].done_s < min(o.done_s for o in lows)
    # One running request was retracted (its KV freed, recomputed later) to make
    # room; it still finishes in full, as do the others.
    assert sum(o.meta["num_retractions"] for o in lows) >= 1
    assert all(o.meta["finish_reason"]["type"] == "length" for o in lows)
    assert all(o.meta["completion_tokens"] == LOW_TOKENS[server_b[0]] for o in lows)


async def test_the_lowest_priority_running_request_is_the_one_retracted(
    server_b: tuple[str, str],
) -> None:
    # What rules.engine_priority's cost tiers rely on: the engine gives up the
    # lowest priority first (here not the latest arrival), so fairgate can make
    # the cheapest request to recompute the one retracted.
    got = await _saturate_then(server_b, [("urgent", 20)], lows_at=(2, 0, 2, 2))
    retractions = [got[f"low-{i}"].meta["num_retractions"] for i in range(SLOTS)]
    assert retractions == [0, 1, 0, 0]
