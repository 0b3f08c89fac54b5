"""`fairgate bench fleet`: a prefix-heavy mix through N workers, behind each
gateway variant in turn, in one run.

The plan (fleet_scenarios.py) is drawn once and replayed open loop through
every variant (fleet_stacks.py), each in front of N fresh sim-server workers;
repetitions rotate the variants' order so machine noise hits all of them.
Then the light tenant alone, once per stack (fairgate, fairgate on replicas,
smg; through the first variant of that stack asked for), is the solo reference
of its TTFT. Times are simulated seconds.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

from fairgate.bench.collector import collector_off
from fairgate.bench.fairness import _tenants_yaml, analyse
from fairgate.bench.fleet_clients import Clock, FleetRecord, Sender
from fairgate.bench.fleet_long import scenario
from fairgate.bench.fleet_report import FleetRun, print_report, report
from fairgate.bench.fleet_scenarios import MAX_PROMPT_TOKENS, FleetScenario, Item
from fairgate.bench.fleet_stacks import (
    VARIANTS,
    FleetVariant,
    fleet_m_tokens,
    fleet_workers,
    gateway_sender,
    routing_setting_exists,
)
from fairgate.bench.gateway import _uptime, find_smg
from scheduler.rules import W_IN, W_OUT, vtc_bound
from service.settings import Settings


async def replay(
    items: list[Item], send: Sender, window_s: float, time_scale: float
) -> list[FleetRecord]:
    """Open loop: each item leaves at its time; a conversation's later turns a think
    time after the previous reply. Everything still running at the window's end is
    cancelled (a conversation stops at a turn that did not complete)."""
    loop = asyncio.get_running_loop()
    now_s = Clock(loop.time(), time_scale, loop.time)
    records: list[FleetRecord] = []

    async def at(t_s: float) -> None:
        delay = now_s.t0 + t_s * time_scale - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)

    def record(tenant: str, ids: list[int], max_tokens: int) -> FleetRecord:
        # Made when the request leaves, not in its task: a task cancelled at the
        # window's end before it ran still counts as sent.
        rec = FleetRecord(tenant, now_s(), len(ids), max_tokens)
        records.append(rec)
        return rec

    async def conversation(item: Item) -> None:
        prompt: list[int] = []
        for turn in item.turns:
            prompt += turn.user_ids
            if len(prompt) + turn.max_tokens > MAX_PROMPT_TOKENS:
                return
            await asyncio.sleep(turn.think_s * time_scale)
            rec = record(item.tenant, prompt, turn.max_tokens)
            out = await send(rec, prompt, now_s)
            if not rec.completed:
                return
            prompt += out

    tasks: list[asyncio.Task[Any]] = []
    for item in items:
        await at(item.t_s)
        if item.turns:
            tasks.append(asyncio.create_task(conversation(item)))
        else:
            ids = list(item.prompt_ids)
            rec = record(item.tenant, ids, item.max_tokens)
            tasks.append(asyncio.create_task(send(rec, ids, now_s)))
    await at(window_s)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for rec in records:
        # Still streaming at the window's end: admission ~ first token.
        if rec.admitted_s is None and rec.first_token_s is not None:
            rec.admitted_s = rec.first_token_s
    return records


def stated_bound(sc: FleetScenario, plan: list[Item]) -> float:
    """VTC bound (longest prompt, the fleet's admitted KV, the light credit) plus the
    fair allowance, as fairgate states it for admission across engines."""
    s = Settings()
    base = vtc_bound(
        W_IN,
        W_OUT,
        sc.longest_prompt_tokens(plan),
        fleet_m_tokens(sc.workers),
        s.fair_light_credit,
    )
    return base + s.fair_allowance_tokens


async def run_variant(
    v: FleetVariant,
    items: list[Item],
    sc: FleetScenario,
    time_scale: float,
    seed: int,
    tenants_file: str,
    smg: str | None,
    bound: float,
    label: str,
) -> FleetRun:
    async with (
        fleet_workers(sc.workers, time_scale, seed, v.kv_events) as workers,
        gateway_sender(v, workers, tenants_file, smg) as send,
    ):
        with collector_off():
            records = await replay(items, send, sc.seconds, time_scale)
    # Service as fairgate charges it (cached prompt tokens at vtc_w_cached), for
    # every variant alike: the yardstick of Jain and of the gap.
    w_cached = Settings().vtc_w_cached
    result = analyse(sc, list(records), sc.seconds, bound, label, v.replicas, w_cached)
    return FleetRun(label, result, records)


def _write_tenants(folder: str, weights: dict[str, float]) -> str:
    path = Path(folder) / "tenants.yaml"
    path.write_text(_tenants_yaml(weights))
    return str(path)


async def main(
    *,
    workers: int,
    seconds: float,
    time_scale: float,
    seed: int,
    load: float,
    variants: list[str],
    repetitions: int,
    smg_binary: str | None,
    mix: str = "prefix",
    one_solo: bool = False,
) -> dict[str, Any]:
    smg = None if smg_binary is None else find_smg(smg_binary)
    chosen = [VARIANTS[k] for k in variants if smg is not None or VARIANTS[k].gateway != "smg"]
    sc = scenario(mix, workers, seconds, load)
    plan = sc.plan(seed)
    bound = stated_bound(sc, plan)
    routing = routing_setting_exists()
    before = _uptime()
    print(
        f"fleet benchmark, {mix} mix: {workers} workers, {seconds:g} simulated s per run,\n"
        f"time scale {time_scale:g}, seed {seed}, load {load:g}, {repetitions} repetition(s), "
        f"{os.cpu_count()} cores, {before};\n"
        f"smg: {smg or 'not installed (its variants skipped)'}"
        + ("" if routing else "; no FAIRGATE_SGLANG_ROUTING here: fairgate variants route alike")
    )
    reps: list[dict[str, FleetRun]] = []
    solos: dict[str, FleetRun] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tenants_file = _write_tenants(tmp, sc.weights)
        for rep in range(repetitions):
            k = rep % len(chosen)
            runs: dict[str, FleetRun] = {}
            for v in chosen[k:] + chosen[:k]:
                runs[v.key] = await run_variant(
                    v, plan, sc, time_scale, seed, tenants_file, smg, bound, v.key
                )
                acc = runs[v.key].accounting()
                print(f"  repetition {rep + 1}: {v.key} done ({acc})", flush=True)
            reps.append(runs)
        light = [i for i in plan if i.tenant == sc.victim]
        for v in chosen[:1] if one_solo else chosen:
            if v.stack not in solos:
                solos[v.stack] = await run_variant(
                    v,
                    light,
                    sc,
                    time_scale,
                    seed,
                    tenants_file,
                    smg,
                    bound,
                    f"solo {v.stack}",
                )
                print(f"  solo {v.stack} done", flush=True)
        if one_solo:  # the first variant's solo run is every stack's reference
            solos = dict.fromkeys((v.stack for v in chosen), solos[chosen[0].stack])
    out = report(sc, bound, chosen, reps, solos, routing)
    out["time_scale"], out["seed"] = time_scale, seed
    out["machine_before"], out["machine_after"] = before, _uptime()
    print_report(out)
    print(f"machine after: {out['machine_after']}")
    return out
