"""Tables for `fairgate bench gateway`: ratios to direct from cells measured
side by side (see gateway.py)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from fairgate.bench.common import percentile
from fairgate.bench.gateway_clients import Sample


@dataclass
class Cell:
    target: str
    c: int
    wall_s: float
    samples: list[Sample]
    cpu_s: float  # the gateway's process tree over the cell; 0 for direct
    rss_bytes: float

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.samples)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def failures(self) -> int:
        return sum(not s.ok for s in self.samples)


@dataclass
class Summary:
    """One target at one concurrency, over its repetitions."""

    tokens_per_s: float  # median over repetitions
    ratio: float  # median over repetitions of tok/s ÷ direct's in the same repetition
    ttft_p50_s: float
    ttft_p99_s: float
    cpu_us_per_token: float
    cores: float  # gateway CPU ÷ wall time
    rss_mb: float
    failures: int
    requests: int
    # fairgate gRPC only (else NaN): the wait in its fair queue, and the part of
    # the client's TTFT before its handler ran (gRPC accepting the call, transport).
    queue_wait_p99_s: float = math.nan
    unseen_p50_s: float = math.nan
    # Gaps between streamed messages, over every request (one message may carry
    # several tokens: coalescing trades these for CPU).
    itl_p50_s: float = math.nan
    itl_p99_s: float = math.nan


def _pct(values: Sequence[float], q: float) -> float:
    known = [v for v in values if not math.isnan(v)]
    return percentile(known, q) if known else math.nan


def summarize(cells: Sequence[Cell], direct: Sequence[Cell]) -> Summary:
    ttfts = [s.ttft_s for cell in cells for s in cell.samples if s.ok]
    itls = [gap for cell in cells for s in cell.samples if s.ok for gap in s.itl_s]
    tokens = sum(cell.tokens for cell in cells)
    ratios = [
        mine.tokens_per_s / ref.tokens_per_s
        for mine, ref in zip(cells, direct, strict=True)
        if ref.tokens_per_s > 0
    ]
    return Summary(
        tokens_per_s=statistics.median(cell.tokens_per_s for cell in cells),
        ratio=statistics.median(ratios) if ratios else math.nan,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p99_s=percentile(ttfts, 99),
        cpu_us_per_token=sum(cell.cpu_s for cell in cells) / max(tokens, 1) * 1e6,
        cores=sum(cell.cpu_s for cell in cells) / sum(cell.wall_s for cell in cells),
        rss_mb=max(cell.rss_bytes for cell in cells) / 2**20,
        failures=sum(cell.failures for cell in cells),
        requests=sum(len(cell.samples) for cell in cells),
        queue_wait_p99_s=_pct([s.queue_wait_s for c in cells for s in c.samples if s.ok], 99),
        unseen_p50_s=_pct(
            [s.ttft_s - s.gateway_ttft_s for c in cells for s in c.samples if s.ok], 50
        ),
        itl_p50_s=percentile(itls, 50),
        itl_p99_s=percentile(itls, 99),
    )


def _by(cells: Sequence[Cell], target: str, c: int) -> list[Cell]:
    return [cell for cell in cells if cell.target == target and cell.c == c]


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:+.1f}"


def print_mode(mode: str, workers: int, tokens: int, reps: int, cells: Sequence[Cell]) -> None:
    what = "zero-latency" if mode == "zero" else "real-time simulated 4090"
    print()
    print(
        f"{what} workers ×{workers}, {tokens} output tokens per request, "
        f"{reps} interleaved repetitions (ratios to direct in the same repetition)"
    )
    header = (
        f"{'c':>5} | {'target':<22} | {'tok/s':>8} | {'× direct':>8} | "
        f"{'TTFT p50 ms':>11} | {'p99 ms':>8} | {'+p50 ms':>8} | {'+p99 ms':>8} | "
        f"{'µs CPU/tok':>10} | {'cores':>5} | {'RSS MB':>6} | {'failed':>6} | "
        f"{'queue p99':>9} | {'unseen p50':>10} | {'ITL p50/p99 ms':>14}"
    )
    print(header)
    print("-" * len(header))
    names = list(dict.fromkeys(cell.target for cell in cells))
    for c in sorted({cell.c for cell in cells}):
        direct = _by(cells, "direct", c)
        ref = summarize(direct, direct)
        for name in names:
            s = summarize(_by(cells, name, c), direct)
            gateway = name != "direct"
            print(
                f"{c:>5} | {name:<22} | {s.tokens_per_s:>8.0f} | {s.ratio:>8.2f} | "
                f"{s.ttft_p50_s * 1e3:>11.1f} | {s.ttft_p99_s * 1e3:>8.1f} | "
                f"{_ms(s.ttft_p50_s - ref.ttft_p50_s) if gateway else '':>8} | "
                f"{_ms(s.ttft_p99_s - ref.ttft_p99_s) if gateway else '':>8} | "
                f"{s.cpu_us_per_token if gateway else math.nan:>10.1f} | "
                f"{s.cores if gateway else math.nan:>5.2f} | {s.rss_mb:>6.0f} | "
                f"{s.failures:>3}/{s.requests} | {_ms(s.queue_wait_p99_s):>9} | "
                f"{_ms(s.unseen_p50_s):>10} | "
                f"{f'{s.itl_p50_s * 1e3:.1f}/{s.itl_p99_s * 1e3:.1f}':>14}"
            )
    _explain_columns()


def _explain_columns() -> None:
    print(
        "queue p99 = fairgate's fair-queue wait (its admission limits); unseen p50 = the "
        "client's TTFT minus fairgate's own (from its handler's start): gRPC accepting the "
        "call, which grows when fairgate's event loop is saturated (ms; gRPC targets only); "
        "ITL = gaps between streamed messages (a message may carry several tokens)"
    )


def print_scaling(cells: Sequence[Cell], variants: Sequence[str]) -> None:
    """Each further fairgate variant's tok/s ÷ the first's (same repetition): what
    `workers=N` variants gain over one process."""
    if len(variants) < 2:
        return
    first = variants[0]
    print(f"tok/s ÷ {first}'s, median over repetitions:")
    for c in sorted({cell.c for cell in cells}):
        ref = _by(cells, first, c)
        ratios = [
            f"{name} {summarize(_by(cells, name, c), ref).ratio:.2f}" for name in variants[1:]
        ]
        print(f"{c:>5} | " + " | ".join(ratios))


def cpu_ratios(cells: Sequence[Cell], target: str, reference: str, c: int) -> list[float]:
    """`target`'s CPU per token ÷ `reference`'s, one ratio per repetition: each pairs
    cells measured back to back, so the machine's load (which moves both) mostly
    cancels, and the spread shows how far one run's ratio can be trusted."""
    return [
        (mine.cpu_s / mine.tokens) / (ref.cpu_s / ref.tokens)
        for mine, ref in zip(_by(cells, target, c), _by(cells, reference, c), strict=True)
        if mine.tokens and ref.tokens and ref.cpu_s > 0
    ]


def print_cpu_ratios(cells: Sequence[Cell], variants: Sequence[str], reference: str) -> None:
    """Each variant's CPU per token ÷ the reference's (smg), repetition by repetition."""
    if not any(cell.target == reference for cell in cells):
        return
    print(f"µs CPU/tok ÷ {reference}'s, each repetition (paired):")
    for c in sorted({cell.c for cell in cells}):
        parts = []
        for name in variants:
            ratios = cpu_ratios(cells, name, reference, c)
            parts.append(f"{name} " + " ".join(f"{r:.2f}" for r in ratios))
        print(f"{c:>5} | " + " | ".join(parts))


def print_capacity(
    rows: Sequence[tuple[int, Sequence[Cell]]], ttft_budget_ms: float, min_ratio: float, final: bool
) -> bool:
    """Print the capacity search; True while the last row passed."""
    passed_n, passed_cores, ok = 0, math.nan, True
    lines = []
    for n, cells in rows:
        names = [name for name in dict.fromkeys(cell.target for cell in cells) if name != "direct"]
        direct = [cell for cell in cells if cell.target == "direct"]
        mine = [cell for cell in cells if cell.target == names[0]]
        ref, s = summarize(direct, direct), summarize(mine, direct)
        added_ms = (s.ttft_p99_s - ref.ttft_p99_s) * 1e3
        ok = added_ms <= ttft_budget_ms and s.ratio >= min_ratio and s.failures == 0
        if ok:
            passed_n, passed_cores = n, s.cores
        lines.append(
            f"{n:>7} | {cells[0].c:>5} | {ref.tokens_per_s:>8.0f} | {s.ratio:>8.2f} | "
            f"{added_ms:>+8.1f} | {s.cores:>5.2f} | {s.ratio * n / s.cores:>9.1f} | "
            f"{'yes' if ok else 'no':>4} | {_ms(s.queue_wait_p99_s):>9} | "
            f"{_ms(s.unseen_p50_s):>10}"
        )
    if final:
        print()
        print(
            f"capacity: real-time workers added one at a time; pass = fairgate's added "
            f"TTFT p99 ≤ {ttft_budget_ms:g} ms and throughput ≥ {min_ratio:g}× direct"
        )
        print(
            f"{'workers':>7} | {'c':>5} | {'direct/s':>8} | {'× direct':>8} | "
            f"{'+p99 ms':>8} | {'cores':>5} | {'per core':>9} | {'pass':>4} | "
            f"{'queue p99':>9} | {'unseen p50':>10}"
        )
        print("\n".join(lines))
        if passed_n:
            per_core = passed_n / passed_cores if passed_cores > 0 else math.inf
            print(
                f"simulated 4090s per fairgate core: {per_core:.1f} "
                f"({passed_n} worker(s) passed using {passed_cores:.2f} core)"
            )
        else:
            print("simulated 4090s per fairgate core: none passed (1 worker failed the bounds)")
        print(
            "per core = workers' worth of tokens carried (× direct · workers) ÷ fairgate's "
            "cores: what its CPU alone would carry with spare cores for the rest"
        )
        _explain_columns()
    return ok
