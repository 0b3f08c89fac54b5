"""Load-test output: a rich table, a JSON document, PNG plots (matplotlib, optional)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from rich.box import MARKDOWN, SIMPLE_HEAD
from rich.console import Console
from rich.table import Table

from fairgate.bench.load import RunReport
from fairgate.bench.stats import RequestRecord, StepReport, percentile_key


def _ms(v: float) -> str:
    return "-" if math.isnan(v) else f"{v * 1e3:.0f}" if v >= 1 else f"{v * 1e3:.1f}"


def render_table(report: RunReport, console: Console, *, markdown: bool = False) -> None:
    """Two tables that fit 80 columns: throughput and outcomes, then latency."""
    cfg = report.config
    slo = cfg.slo
    slo_txt = ", ".join(
        f"{name} ≤ {v * 1e3:g} ms"
        for name, v in (("TTFT", slo.ttft_s), ("TPOT", slo.tpot_s))
        if v is not None
    )
    title = (
        f"fairgate bench load — {cfg.mode} loop, {cfg.lengths.describe()}"
        + (f", burstiness {cfg.burstiness:g}" if cfg.mode == "open" else "")
        + (f"; SLO {slo_txt}" if slo_txt else "")
    )
    if cfg.time_scale != 1.0:
        title += f"; times in simulated seconds (server time scale {cfg.time_scale:g})"
    style: dict[str, Any] = {"box": MARKDOWN} if markdown else {"box": SIMPLE_HEAD}
    level_name = "conc" if cfg.mode == "closed" else "rate/s"
    table = Table(title=title, title_justify="left", **style)
    cols = (level_name, "sent", "ok", "rej", "fail", "fail %", "out tok/s", "req/s", "goodput/s")
    for col in cols:
        table.add_column(col, justify="right")
    for s in report.steps:
        table.add_row(
            f"{s.level:g}",
            str(s.sent),
            str(s.ok),
            str(s.rejected),
            str(s.failed + s.unfinished),
            f"{s.failure_rate * 100:.1f}",
            f"{s.output_tokens_per_s:.0f}",
            f"{s.requests_per_s:.2f}",
            f"{s.goodput_requests_per_s:.2f}",
        )
    console.print(table)
    keys = [percentile_key(q) for q in cfg.percentiles]
    latency = Table(title="latency (ms)", title_justify="left", **style)
    for col in (level_name, "metric", "mean", *keys, "max"):
        latency.add_column(col, justify="left" if col == "metric" else "right", no_wrap=True)
    for s in report.steps:
        for i, (name, lat) in enumerate(
            (("TTFT", s.ttft), ("TPOT", s.tpot), ("ITL", s.itl), ("E2E", s.e2e))
        ):
            qs = [_ms(lat.quantiles.get(k, math.nan)) for k in keys]
            latency.add_row(
                f"{s.level:g}" if i == 0 else "",
                name,
                _ms(lat.mean),
                *qs,
                _ms(lat.max),
                end_section=i == 3,
            )
    console.print(latency)
    errors: dict[str, int] = {}
    for s in report.steps:
        for k, v in s.errors.items():
            errors[k] = errors.get(k, 0) + v
    if errors:
        console.print("errors: " + ", ".join(f"{k} × {v}" for k, v in errors.items()))
    if len(cfg.tenants) > 1:
        tenants = Table(
            title="per-tenant service (output tokens; Jain index of tokens/share)",
            title_justify="left",
            **style,
        )
        tenants.add_column(level_name, justify="right")
        names = [t.name for t in cfg.tenants]
        for name in names:
            tenants.add_column(name, justify="right", overflow="fold")
        tenants.add_column("Jain", justify="right")
        for s in report.steps:
            cells = [str(s.tenants[n].output_tokens) if n in s.tenants else "0" for n in names]
            jain = "-" if math.isnan(s.jain_index) else f"{s.jain_index:.3f}"
            tenants.add_row(f"{s.level:g}", *cells, jain)
        console.print(tenants)


def tenant_series(report: RunReport, bins: int = 40) -> dict[str, Any]:
    """Per-tenant output tokens per time bin over the whole run, by the time
    the tokens arrived (not when their request ended)."""
    end_s = max((b for _, b in report.step_spans_s), default=0.0)
    bin_s = max(end_s / bins, 0.05) if end_s > 0 else 1.0
    n = max(1, math.ceil(end_s / bin_s))
    series: dict[str, list[int]] = {t.name: [0] * n for t in report.config.tenants}
    for ev in report.token_events:
        row = series.setdefault(ev.tenant, [0] * n)
        row[min(n - 1, int(ev.t_s / bin_s))] += ev.tokens
    return {"bin_s": bin_s, "tokens": series}


def _ms_or_none(v: float | None) -> float | None:
    return None if v is None else round(v * 1e3, 3)


def request_dict(r: RequestRecord) -> dict[str, Any]:
    """One request's record (times in ms, sent_s since the run started)."""
    return {
        "tenant": r.tenant,
        "sent_s": round(r.sent_s, 6),
        "prompt_tokens": r.prompt_tokens,
        "max_tokens": r.max_tokens,
        "output_tokens": r.output_tokens,
        "ttft_ms": _ms_or_none(r.ttft_s),
        "tpot_ms": _ms_or_none(r.tpot_s),
        "e2e_ms": _ms_or_none(r.e2e_s),
        "itl_ms": [round(x * 1e3, 3) for x in r.itl_s],
        "outcome": r.outcome,
        "error": r.error,
        "finish_reason": r.finish_reason,
    }


def step_json(report: RunReport, step: StepReport, records: list[RequestRecord]) -> dict[str, Any]:
    """One step as `vllm bench serve --save-result` writes a run (same names,
    per-request arrays included), plus fairgate's own fields and records."""
    cfg = report.config
    closed = cfg.mode == "closed"
    out: dict[str, Any] = {
        "date": time.strftime("%Y%m%d-%H%M%S"),
        "backend": "fairgate-grpc",
        "model_id": cfg.model or "(server default)",
        "num_prompts": step.sent,
        "request_rate": "inf" if closed else step.level,
        "burstiness": cfg.burstiness,
        "max_concurrency": int(step.level) if closed else None,
        "percentiles": list(cfg.percentiles),
        **step.to_dict(),
        "input_lens": [r.prompt_tokens for r in records],
        "output_lens": [r.output_tokens for r in records],
        "ttfts": [r.ttft_s or 0.0 for r in records],
        "itls": [list(r.itl_s) for r in records],
        "errors": [r.error for r in records],
        "requests": [request_dict(r) for r in records],
    }
    return out


def to_json(report: RunReport) -> dict[str, Any]:
    cfg = report.config
    return {
        "config": {
            "target": cfg.target,
            "mode": cfg.mode,
            "levels": list(cfg.levels),
            "cv": cfg.cv,
            "burstiness": cfg.burstiness,
            "percentiles": list(cfg.percentiles),
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
        "steps": [
            step_json(report, step, records)
            for step, records in zip(report.steps, report.records, strict=True)
        ],
        "step_spans_s": report.step_spans_s,
        "tenant_service": tenant_series(report),
    }


def write_json(report: RunReport, path: Path) -> None:
    path.write_text(json.dumps(to_json(report), indent=2, allow_nan=False) + "\n")


def write_results(report: RunReport, out_dir: Path) -> list[Path]:
    """One `vllm bench serve`-compatible JSON file per step."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for step, records in zip(report.steps, report.records, strict=True):
        name = f"c{step.level:g}" if step.mode == "closed" else f"{step.level:g}qps"
        path = out_dir / f"fairgate-{name}.json"
        path.write_text(json.dumps(step_json(report, step, records), allow_nan=False) + "\n")
        written.append(path)
    return written


def write_plots(report: RunReport, out_dir: Path) -> list[Path]:
    """latency.png, throughput.png, tenants.png; needs `pip install 'fairgate[plot]'`.

    Every y axis starts at zero (a ratio read off a plot must be the real
    one); the SLOs given are drawn as horizontal lines."""
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
    keys = ["p50", percentile_key(max(cfg.percentiles))]
    slos = {"ttft": cfg.slo.ttft_s, "tpot": cfg.slo.tpot_s}

    # Latency: one panel per metric (they differ by orders of magnitude),
    # linear from zero, with its SLO.
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    for ax, (title, attr) in zip(
        axes, (("TTFT", "ttft"), ("TPOT", "tpot"), ("end-to-end", "e2e")), strict=True
    ):
        for q, style in zip(dict.fromkeys(keys), ("-o", "--x"), strict=False):
            # NaN (no sample at that step) leaves a gap rather than a fake zero.
            ys = [getattr(s, attr).quantiles.get(q, math.nan) * 1e3 for s in report.steps]
            ax.plot(xs, ys, style, label=f"{title} {q}")
        slo = slos.get(attr)
        if slo is not None:
            ax.axhline(slo * 1e3, color="red", linestyle=":", label=f"SLO {slo * 1e3:g} ms")
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("ms")
        _log_x(ax, xs)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("latency vs load")
    written.append(out_dir / "latency.png")
    fig.savefig(written[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(xs, [s.output_tokens_per_s for s in report.steps], "-o", label="output tokens/s")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("output tokens/s")
    ax2 = ax.twinx()
    ax2.plot(xs, [s.requests_per_s for s in report.steps], "--s", color="C1", label="requests/s")
    if cfg.slo.ttft_s is not None or cfg.slo.tpot_s is not None:
        ax2.plot(
            xs,
            [s.goodput_requests_per_s for s in report.steps],
            ":^",
            color="C2",
            label="goodput/s (within SLO)",
        )
    ax2.set_ylabel("requests/s")
    _log_x(ax, xs)
    ax.set_ylim(bottom=0)
    ax2.set_ylim(bottom=0)
    ax.set_title("throughput vs load")
    ax.grid(True, alpha=0.3)
    fig.legend(loc="lower right", bbox_to_anchor=(0.88, 0.12), fontsize=8)
    written.append(out_dir / "throughput.png")
    fig.savefig(written[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    series = tenant_series(report)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bin_s = series["bin_s"]
    total = [0.0] * max((len(r) for r in series["tokens"].values()), default=0)
    for name, row in series["tokens"].items():
        ts = [(i + 0.5) * bin_s for i in range(len(row))]
        ax.plot(ts, [v / bin_s for v in row], label=name)
        total = [a + b / bin_s for a, b in zip(total, row, strict=True)]
    if len(series["tokens"]) > 1:
        ts = [(i + 0.5) * bin_s for i in range(len(total))]
        ax.plot(ts, total, color="black", linewidth=0.8, alpha=0.5, label="all tenants")
    for start, _ in report.step_spans_s[1:]:
        ax.axvline(start, color="grey", alpha=0.4, linewidth=0.8)
    ax.set_xlabel("time since start (s); grey lines: step boundaries")
    ax.set_ylabel("output tokens/s (by arrival time)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
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
