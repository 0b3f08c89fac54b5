"""The table of `fairgate bench gateway --sglang-cpu` (gateway_sglang.py), and the
issue's bar for the in-process mode, checked on the run's own numbers."""

from __future__ import annotations

import math
from collections.abc import Sequence

from fairgate.bench.gateway_report import Cell, Summary, summarize

REFERENCE = "sglang generate"
INPROC = "inproc grpc"


def messages_per_token(cells: Sequence[Cell]) -> float:
    """Streamed messages ÷ tokens (a message may carry several tokens)."""
    ok = [s for cell in cells for s in cell.samples if s.ok]
    tokens = sum(s.tokens for s in ok)
    return sum(len(s.itl_s) + 1 for s in ok) / tokens if tokens else math.nan


def _by(cells: Sequence[Cell], target: str, c: int) -> list[Cell]:
    return [cell for cell in cells if cell.target == target and cell.c == c]


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def print_sglang_cpu(tokens: int, reps: int, cells: Sequence[Cell]) -> None:
    print()
    print(
        f"real SGLang (CPU), {tokens} output tokens per request, {reps} interleaved "
        f"repetitions; CPU = front processes only (SGLang's main process, not its "
        f"scheduler/detokenizer); ratios to {REFERENCE!r} in the same repetition"
    )
    header = (
        f"{'c':>4} | {'target':<16} | {'tok/s':>7} | {'× ref':>5} | {'TTFT p50':>8} | "
        f"{'p99 ms':>7} | {'Δp99 ms':>7} | {'µs CPU/tok':>10} | {'× ref':>5} | "
        f"{'msg/tok':>7} | {'failed':>7}"
    )
    print(header)
    print("-" * len(header))
    names = list(dict.fromkeys(cell.target for cell in cells))
    table: dict[tuple[str, int], Summary] = {}
    for c in sorted({cell.c for cell in cells}):
        ref_cells = _by(cells, REFERENCE, c)
        ref = summarize(ref_cells, ref_cells)
        for name in names:
            mine = _by(cells, name, c)
            s = table[name, c] = summarize(mine, ref_cells)
            print(
                f"{c:>4} | {name:<16} | {s.tokens_per_s:>7.0f} | {s.ratio:>5.2f} | "
                f"{s.ttft_p50_s * 1e3:>8.1f} | {s.ttft_p99_s * 1e3:>7.1f} | "
                f"{(s.ttft_p99_s - ref.ttft_p99_s) * 1e3:>+7.1f} | "
                f"{s.cpu_us_per_token:>10.1f} | "
                f"{_ratio(s.cpu_us_per_token, ref.cpu_us_per_token):>5.2f} | "
                f"{messages_per_token(mine):>7.2f} | {s.failures:>3}/{s.requests}"
            )
    _print_bar(table)


def _print_bar(table: dict[tuple[str, int], Summary]) -> None:
    """#25's done-when, where the run has the cells for it."""
    lines = []
    cpu = table.get((INPROC, 64)), table.get((REFERENCE, 64)), table.get(("smg", 64))
    if cpu[0] and cpu[1]:
        r = _ratio(cpu[0].cpu_us_per_token, cpu[1].cpu_us_per_token)
        lines.append(f"CPU/token ÷ SGLang's server at c=64: {r:.2f} (bar ≤ 1.0)")
    if cpu[0] and cpu[2]:
        r = _ratio(cpu[0].cpu_us_per_token, cpu[2].cpu_us_per_token)
        lines.append(f"CPU/token ÷ smg + SGLang's server at c=64: {r:.2f} (bar < 1.0)")
    ttft = table.get((INPROC, 16)), table.get((REFERENCE, 16))
    if ttft[0] and ttft[1]:
        d = (ttft[0].ttft_p99_s - ttft[1].ttft_p99_s) * 1e3
        lines.append(f"TTFT p99 - SGLang's server's at c=16: {d:+.1f} ms (bar ≤ +5 ms)")
    ratios = [s.ratio for (name, _), s in table.items() if name == INPROC]
    if ratios:
        lines.append(f"tok/s ÷ SGLang's server, worst level: {min(ratios):.2f} (bar ≥ 0.97)")
    if lines:
        print(f"{INPROC} against the bar of issue #25:")
        print("\n".join("  " + line for line in lines))
