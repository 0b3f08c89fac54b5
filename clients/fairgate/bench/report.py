"""Load-test output: a rich table, a JSON document, PNG plots (matplotlib, optional)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.box import MARKDOWN
from rich.console import Console
from rich.table import Table

from fairgate.bench.load import RunReport


def _ms(v: float) -> str:
    return "-" if math.isnan(v) else f"{v * 1e3:.0f}" if v >= 1 else f"{v * 1e3:.1f}"


def render_table(report: RunReport, console: Console, *, markdown: bool = False) -> None:
    cfg = report.config
    slo = cfg.slo
    slo_txt = ", ".join(
        f"{name} ≤ {v * 1e3:g} ms"
        for name, v in (("TTFT", slo.ttft_s), ("TPOT", slo.tpot_s))
        if v is not None
    )
    title = (
        f"fairgate bench load — {cfg.mode} loop, {cfg.lengths.describe()}"
        + (f", cv {cfg.cv:g}" if cfg.mode == "open" else "")
        + (f"; SLO {slo_txt}" if slo_txt else "")
    )
    if cfg.time_scale != 1.0:
        title += f"; times in simulated seconds (server time scale {cfg.time_scale:g})"
    box_style = {"box": MARKDOWN} if markdown else {}
    table = Table(title=title, title_justify="left", **box_style)  # type: ignore[arg-type]
    level_name = "concurrency" if cfg.mode == "closed" else "rate/s"
    for col in (
        level_name,
        "sent",
        "ok",
        "rej",
        "fail",
        "out tok/s",
        "req/s",
        "goodput/s",
        "TTFT p50/p99 ms",
        "TPOT p50/p99 ms",
        "ITL p50/p99 ms",
        "E2E mean/p50/p99/max ms",
        "fail %",
    ):
        table.add_column(col, justify="right")
    for s in report.steps:
        table.add_row(
            f"{s.level:g}",
            str(s.sent),
            str(s.ok),
            str(s.rejected),
            str(s.failed + s.unfinished),
            f"{s.output_tokens_per_s:.0f}",
            f"{s.requests_per_s:.2f}",
            f"{s.goodput_requests_per_s:.2f}",
            f"{_ms(s.ttft.p50)}/{_ms(s.ttft.p99)}",
            f"{_ms(s.tpot.p50)}/{_ms(s.tpot.p99)}",
            f"{_ms(s.itl.p50)}/{_ms(s.itl.p99)}",
            f"{_ms(s.e2e.mean)}/{_ms(s.e2e.p50)}/{_ms(s.e2e.p99)}/{_ms(s.e2e.max)}",
            f"{s.failure_rate * 100:.1f}",
        )
    console.print(table)
    errors: dict[str, int] = {}
    for s in report.steps:
        for k, v in s.errors.items():
            errors[k] = errors.get(k, 0) + v
    if errors:
        console.print("errors: " + ", ".join(f"{k} × {v}" for k, v in errors.items()))
    if len(cfg.tenants) > 1:
        tenants = Table(
            title="per-tenant service (output tokens)",
            title_justify="left",
            **box_style,  # type: ignore[arg-type]
        )
        tenants.add_column(level_name, justify="right")
        names = [t.name for t in cfg.tenants]
        for name in names:
            tenants.add_column(name, justify="right")
        tenants.add_column("Jain index (tokens/share)", justify="right")
        for s in report.steps:
            cells = [str(s.tenants[n].output_tokens) if n in s.tenants else "0" for n in names]
            jain = "-" if math.isnan(s.jain_index) else f"{s.jain_index:.3f}"
            tenants.add_row(f"{s.level:g}", *cells, jain)
        console.print(tenants)


def tenant_series(report: RunReport, bins: int = 40) -> dict[str, Any]:
    """Per-tenant output tokens per time bin over the whole run."""
    end_s = max((b for _, b in report.step_spans_s), default=0.0)
    bin_s = max(end_s / bins, 0.05) if end_s > 0 else 1.0
    n = max(1, math.ceil(end_s / bin_s))
    series: dict[str, list[int]] = {t.name: [0] * n for t in report.config.tenants}
    for ev in report.token_events:
        row = series.setdefault(ev.tenant, [0] * n)
        row[min(n - 1, int(ev.t_s / bin_s))] += ev.tokens
    return {"bin_s": bin_s, "tokens": series}


def to_json(report: RunReport) -> dict[str, Any]:
    cfg = report.config
    return {
        "config": {
            "target": cfg.target,
            "mode": cfg.mode,
            "levels": list(cfg.levels),
            "cv": cfg.cv,
            "duration_s": cfg.duration_s,
            "requests": cfg.requests,
            "drain_s": cfg.drain_s,
            "lengths": cfg.lengths.describe(),
            "tenants": [{"name": t.name, "share": t.share} for t in cfg.tenants],
            "slo": {
                "ttft_ms": None if cfg.slo.ttft_s is None else cfg.slo.ttft_s * 1e3,
                "tpot_ms": None if cfg.slo.tpot_s is None else cfg.slo.tpot_s * 1e3,
            },
            "seed": cfg.seed,
            "time_scale": cfg.time_scale,
        },
        "steps": [s.to_dict() for s in report.steps],
        "step_spans_s": report.step_spans_s,
        "tenant_service": tenant_series(report),
    }


def write_json(report: RunReport, path: Path) -> None:
    path.write_text(json.dumps(to_json(report), indent=2, allow_nan=False) + "\n")


def write_plots(report: RunReport, out_dir: Path) -> list[Path]:
    """latency.png, throughput.png, tenants.png; needs `pip install 'fairgate[plot]'`."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the extra
        raise RuntimeError("plots need matplotlib: pip install 'fairgate[plot]'") from exc
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = report.config
    xs = [s.level for s in report.steps]
    xlabel = "concurrency" if cfg.mode == "closed" else "arrival rate (requests/s)"
    written: list[Path] = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, attr in (("TTFT", "ttft"), ("TPOT", "tpot"), ("E2E", "e2e")):
        for q, style in (("p50", "-o"), ("p99", "--x")):
            ys = [getattr(getattr(s, attr), q) * 1e3 for s in report.steps]
            ax.plot(xs, ys, style, label=f"{name} {q}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    _log_x(ax, xs)
    ax.set_title("latency vs load")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    written.append(out_dir / "latency.png")
    fig.savefig(written[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(xs, [s.output_tokens_per_s for s in report.steps], "-o", label="output tokens/s")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("output tokens/s")
    ax2 = ax.twinx()
    ax2.plot(xs, [s.requests_per_s for s in report.steps], "--s", color="C1", label="requests/s")
    ax2.plot(
        xs, [s.goodput_requests_per_s for s in report.steps], ":^", color="C2", label="goodput/s"
    )
    ax2.set_ylabel("requests/s")
    _log_x(ax, xs)
    ax.set_title("throughput vs load")
    ax.grid(True, alpha=0.3)
    fig.legend(loc="lower right", bbox_to_anchor=(0.88, 0.12), fontsize=8)
    written.append(out_dir / "throughput.png")
    fig.savefig(written[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    series = tenant_series(report)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bin_s = series["bin_s"]
    for name, row in series["tokens"].items():
        ts = [(i + 1) * bin_s for i in range(len(row))]
        ax.plot(ts, [v / bin_s for v in row], label=name)
    for start, _ in report.step_spans_s[1:]:
        ax.axvline(start, color="grey", alpha=0.4, linewidth=0.8)
    ax.set_xlabel("time since start (s); grey lines: step boundaries")
    ax.set_ylabel("output tokens/s")
    ax.set_title("per-tenant service over time")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    written.append(out_dir / "tenants.png")
    fig.savefig(written[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)
    return written


def _log_x(ax: Any, xs: list[float]) -> None:
    if xs and min(xs) > 0 and max(xs) / min(xs) >= 20:
        ax.set_xscale("log")
