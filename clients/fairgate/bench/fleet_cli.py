"""The typer command behind `fairgate bench fleet` (registered in cli/main.py)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from fairgate.bench.fleet_scenarios import MIXES
from fairgate.bench.fleet_stacks import DEFAULT_VARIANTS, VARIANTS
from fairgate.bench.seeds import seed_list


def fleet_command(
    workers: Annotated[
        int, typer.Option(min=1, help="sim-server workers behind every gateway")
    ] = 4,
    seconds: Annotated[float, typer.Option(min=1, help="simulated seconds per run")] = 40.0,
    time_scale: Annotated[
        float, typer.Option(help="wall seconds per simulated second (the workers' time scale)")
    ] = 2.0,
    seed: Annotated[int, typer.Option(help="plan seed (prompts and arrivals)")] = 1,
    seeds: Annotated[
        str,
        typer.Option(
            help="several plans, e.g. 1-3 or 1,4,7 (instead of --seed): each run, then "
            "per variant the median (min-max) over them (fleet_summary's table)"
        ),
    ] = "",
    load: Annotated[
        float, typer.Option(min=0.01, help="offered load of the heavy tenants (1: the default mix)")
    ] = 1.0,
    variants: Annotated[
        str, typer.Option(help=f"comma-separated, among {','.join(VARIANTS)}")
    ] = ",".join(DEFAULT_VARIANTS),
    repetitions: Annotated[
        int, typer.Option(min=1, help="runs of every variant, order rotated; medians reported")
    ] = 1,
    smg: Annotated[
        str | None, typer.Option(help="smg binary (default: beside python, then PATH)")
    ] = None,
    no_smg: Annotated[bool, typer.Option("--no-smg", help="leave the smg variants out")] = False,
    mix: Annotated[
        str,
        typer.Option(
            help="prefix (shared prefixes, conversations) or long (bench stagger's long prompts)"
        ),
    ] = "prefix",
    one_solo: Annotated[
        bool,
        typer.Option(
            "--one-solo", help="one solo run (the first variant's stack), every stack's reference"
        ),
    ] = False,
    json_out: Annotated[str, typer.Option("--json", help="also write the report here")] = "",
) -> None:
    """Prefix-heavy mix on N workers: fairgate (locality, least_full, fcfs, 2 replicas)
    vs smg (cache_aware, round_robin), in one run."""
    from fairgate.bench.fairness_report import write_json
    from fairgate.bench.fleet import main as fleet_main
    from fairgate.bench.fleet_summary import print_summary

    if mix not in MIXES:
        raise typer.BadParameter(f"use one of {','.join(MIXES)}", param_hint="--mix")
    chosen = [v.strip() for v in variants.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in VARIANTS]
    if not chosen or unknown:
        raise typer.BadParameter(f"use keys among {','.join(VARIANTS)}", param_hint="--variants")
    try:
        chosen_seeds = seed_list(seeds) if seeds else [seed]
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--seeds") from None
    reports = {
        s: asyncio.run(
            fleet_main(
                workers=workers,
                seconds=seconds,
                time_scale=time_scale,
                seed=s,
                load=load,
                variants=chosen,
                repetitions=repetitions,
                smg_binary=None if no_smg else (smg or ""),
                mix=mix,
                one_solo=one_solo,
            )
        )
        for s in chosen_seeds
    }
    if len(chosen_seeds) == 1:
        out = reports[chosen_seeds[0]]
    else:
        print(f"\nseeds {','.join(map(str, chosen_seeds))}:")
        summary = print_summary(list(reports.values()))
        out = {"seeds": {str(s): r for s, r in reports.items()}, "summary": summary}
    if json_out:
        write_json(json_out, out)
