#!/usr/bin/env python3
"""Turn one benchmark run into the tables and the ratio chart of docs/performance.md.

Usage (from the repository root):

    python3 scripts/bench-report.py --run      # build, run the three benches with
                                               # --quick, then report
    python3 scripts/bench-report.py            # report the last run again

It reads criterion's `<target>/criterion/<group>/<function>/new/estimates.json` (the
median of each benchmark) and the lines the benches print (the `scale` summary and the
contended writers' rates) from the run's log, `<target>/bench-report/run.log`.
`<target>` is `$CARGO_TARGET_DIR`, or `target`.

It rewrites the part of docs/performance.md between the `bench-report:start` and
`bench-report:end` markers, and writes docs/performance-ratios.svg. Plain Python 3.11,
standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHES = ["stage_read", "pause_resume_cycle", "scale"]
START = "<!-- bench-report:start -->"
END = "<!-- bench-report:end -->"

CRITERION = [
    ("stage_read", ["taskstage", "rwlock_baseline", "atomic_floor"]),
    ("stage_read_contended", ["taskstage", "rwlock_baseline", "atomic_floor"]),
    (
        "pause_resume_cycle",
        [
            "taskstage_current_thread",
            "bare_tokio_current_thread",
            "taskstage_multi_thread",
            "bare_tokio_multi_thread",
        ],
    ),
    ("core_cycle", ["lifecycle_core", "state_word", "locked_word"]),
]


@dataclass
class Ratio:
    """taskstage's cost divided by a reference cost: lower is better."""

    label: str
    value: float
    goal: float | None  # met when value <= goal
    goal_text: str

    @property
    def met(self) -> bool | None:
        return None if self.goal is None else self.value <= self.goal


def target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip()
    return f"{os.cpu_count()} cores, {cpu}, {platform.system()}, {rustc}"


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def run(log: Path, meta: Path) -> None:
    """Builds the benches, then runs each with --quick, logging everything."""
    log.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["cargo", "bench", "--no-run"] + [f"--bench={b}" for b in BENCHES], check=True
    )
    info = {"machine": machine(), "load_before": load_average(), "seconds": {}}
    with log.open("w") as out:
        started = time.monotonic()
        for bench in BENCHES:
            t = time.monotonic()
            cmd = ["cargo", "bench", "--bench", bench, "--", "--quick"]
            print("$", " ".join(cmd), file=sys.stderr)
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
            out.write(proc.stdout)
            sys.stdout.write(proc.stdout)
            if proc.returncode != 0:
                sys.exit(f"{' '.join(cmd)} failed with {proc.returncode}")
            info["seconds"][bench] = round(time.monotonic() - t, 1)
        info["seconds"]["total"] = round(time.monotonic() - started, 1)
    info["load_after"] = load_average()
    info["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    meta.write_text(json.dumps(info, indent=2) + "\n")


# Operations per criterion iteration: the stage reads are measured in batches (see
# benches/stage_read.rs), and reported per read.
PER_ITERATION = {"stage_read": 1_000, "stage_read_contended": 1_000}


def medians(criterion: Path) -> dict[str, float]:
    """Median nanoseconds per operation, keyed `group/function`."""
    found = {}
    for group, functions in CRITERION:
        for function in functions:
            path = criterion / group / function / "new" / "estimates.json"
            try:
                estimates = json.loads(path.read_text())
            except FileNotFoundError:
                sys.exit(f"missing {path}: run the benches first (--run)")
            per_iteration = PER_ITERATION.get(group, 1)
            found[f"{group}/{function}"] = estimates["median"]["point_estimate"] / per_iteration
    return found


def scale_figures(text: str) -> dict[str, float]:
    figures: dict[str, float] = {}
    for prefix in ("scale-detail", "scale"):
        lines = [l for l in text.splitlines() if l.startswith(prefix + " ")]
        if not lines:
            sys.exit(f"no `{prefix} ...` line in the run's log")
        for key, value in re.findall(r"(\w+)=([0-9.]+)", lines[-1]):
            figures[key] = float(value)
    return figures


def writer_rates(text: str) -> dict[str, float]:
    rates = {}
    for name, rate in re.findall(
        r"stage_read_contended/(\w+) writer: .*\(([0-9]+) per second\)", text
    ):
        rates[name] = float(rate)
    return rates


def fmt_time(ns: float) -> str:
    if ns < 1_000:
        return f"{ns:.2f} ns"
    if ns < 1_000_000:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns / 1e6:.2f} ms"


def ratios(m: dict[str, float], s: dict[str, float]) -> list[Ratio]:
    """The goals of the current round (docs/performance.md says which are met)."""
    p = "pause_resume_cycle/"
    c = "core_cycle/"
    return [
        Ratio(
            "stage read: taskstage ÷ atomic floor",
            m["stage_read/taskstage"] / m["stage_read/atomic_floor"],
            1.2,
            "≤ 1.2",
        ),
        Ratio(
            "contended read: taskstage ÷ RwLock",
            m["stage_read_contended/taskstage"] / m["stage_read_contended/rwlock_baseline"],
            0.2,
            "≤ 0.2 (5× faster)",
        ),
        Ratio(
            "contended read: taskstage ÷ atomic floor",
            m["stage_read_contended/taskstage"] / m["stage_read_contended/atomic_floor"],
            None,
            "(no goal)",
        ),
        Ratio(
            "pause+resume, current-thread: ÷ bare tokio",
            m[p + "taskstage_current_thread"] / m[p + "bare_tokio_current_thread"],
            1.0,
            "≤ 1.0",
        ),
        Ratio(
            "pause+resume, multi-thread: ÷ bare tokio",
            m[p + "taskstage_multi_thread"] / m[p + "bare_tokio_multi_thread"],
            1.0,
            "≤ 1.0",
        ),
        Ratio(
            "core's four inputs ÷ a state word's",
            m[c + "lifecycle_core"] / m[c + "state_word"],
            None,
            "(no goal)",
        ),
        Ratio(
            "a locked word ÷ a state word",
            m[c + "locked_word"] / m[c + "state_word"],
            None,
            "(no goal)",
        ),
        Ratio(
            "scale: bytes per task ÷ floor",
            s["bytes_per_task"] / s["floor_bytes_per_task"],
            1.5,
            "≤ 1.5",
        ),
        Ratio(
            "scale: pause all ÷ floor",
            s["pause_all_ms"] / s["floor_pause_all_ms"],
            1.5,
            "≤ 1.5",
        ),
        Ratio(
            "scale: resume all ÷ floor",
            s["resume_all_ms"] / s["floor_resume_all_ms"],
            1.5,
            "≤ 1.5",
        ),
        Ratio(
            "scale: stop all ÷ floor",
            s["stop_all_ms"] / s["floor_stop_all_ms"],
            1.5,
            "≤ 1.5",
        ),
    ]


def markdown(m, s, rates, rs, info) -> str:
    out = []
    if info:
        secs = info.get("seconds", {})
        out.append(
            f"Run of {info.get('date', '?')} on {info.get('machine', '?')}; load average "
            f"{info.get('load_before', '?')} before and {info.get('load_after', '?')} after. "
            "Wall time with `--quick` (builds excluded): "
            + ", ".join(f"{k} {v} s" for k, v in secs.items())
            + "."
        )
        out.append("")
    out.append("### Criterion medians")
    out.append("")
    out.append("| group | function | median |")
    out.append("|---|---|---:|")
    for key, ns in m.items():
        group, function = key.split("/")
        out.append(f"| `{group}` | `{function}` | {fmt_time(ns)} |")
    out.append("")
    if rates:
        out.append(
            "Contended writers (stage writes per second while the reader was measured): "
            + ", ".join(f"{k} {v:,.0f}" for k, v in rates.items())
            + "."
        )
        out.append("")
    out.append(f"### Scale ({s['tasks']:,.0f} tasks on one multi-thread runtime, 2 workers)")
    out.append("")
    out.append("| figure | taskstage | bare tokio + token |")
    out.append("|---|---:|---:|")
    out.append(
        f"| heap bytes per task | {s['bytes_per_task']:,.0f} | {s['floor_bytes_per_task']:,.0f} |"
    )
    for key, name in [
        ("spawn_all_ms", "spawn all, until every run is alive"),
        ("pause_all_ms", "pause all, until every run has returned"),
        ("resume_all_ms", "resume all, until every run is alive"),
        ("stop_all_ms", "stop all, until every task is Stopped"),
    ]:
        out.append(f"| {name} | {s[key]:,.2f} ms | {s['floor_' + key]:,.2f} ms |")
    out.append("")
    out.append("### Ratios (taskstage ÷ reference; lower is better)")
    out.append("")
    out.append("| comparison | ratio | goal | met |")
    out.append("|---|---:|---|---|")
    for r in rs:
        met = {True: "yes", False: "**no**", None: "–"}[r.met]
        out.append(f"| {r.label} | {r.value:.2f} | {r.goal_text} | {met} |")
    out.append("")
    out.append("![ratios](performance-ratios.svg)")
    return "\n".join(out)


def svg(rs: list[Ratio]) -> str:
    """A horizontal bar chart of the ratios on a log scale, with each goal marked."""
    left, right, top, row, width = 330, 40, 48, 34, 880
    height = top + row * len(rs) + 56
    lo, hi = 0.01, 20.0
    lo = min(lo, min(r.value for r in rs) / 1.5)
    hi = max(hi, max(r.value for r in rs) * 1.5)

    def x(v: float) -> float:
        span = math.log10(hi) - math.log10(lo)
        return left + (width - left - right) * (math.log10(v) - math.log10(lo)) / span

    def esc(t: str) -> str:
        return t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="13">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">'
        "taskstage cost ÷ reference cost (log scale; lower is better)</text>",
    ]
    axis_y = top + row * len(rs) + 6
    tick = lo
    ticks = []
    for decade in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            v = m * 10**decade
            if lo <= v <= hi:
                ticks.append(v)
    for tick in ticks:
        tx = x(tick)
        label = f"{tick:g}×"
        parts.append(
            f'<line x1="{tx:.1f}" y1="{top - 6}" x2="{tx:.1f}" y2="{axis_y}" '
            f'stroke="{"#888" if tick == 1 else "#ddd"}" stroke-width="1"/>'
        )
        parts.append(
            f'<text x="{tx:.1f}" y="{axis_y + 16}" text-anchor="middle" fill="#444">{label}</text>'
        )
    for i, r in enumerate(rs):
        y = top + row * i
        colour = {True: "#2e7d32", False: "#c62828", None: "#607d8b"}[r.met]
        x0, x1 = x(lo), x(r.value)
        parts.append(
            f'<text x="{left - 8}" y="{y + 17}" text-anchor="end">{esc(r.label)}</text>'
        )
        parts.append(
            f'<rect x="{x0:.1f}" y="{y + 5}" width="{max(x1 - x0, 1):.1f}" height="{row - 12}" '
            f'fill="{colour}"/>'
        )
        parts.append(
            f'<text x="{x1 + 5:.1f}" y="{y + 17}" fill="#222">{r.value:.2f}×</text>'
        )
        if r.goal is not None:
            gx = x(r.goal)
            parts.append(
                f'<line x1="{gx:.1f}" y1="{y + 1}" x2="{gx:.1f}" y2="{y + row - 3}" '
                'stroke="black" stroke-width="2" stroke-dasharray="4,2"/>'
            )
    legend_y = axis_y + 36
    parts.append(
        f'<text x="{left}" y="{legend_y}" fill="#444">green: goal met · red: goal missed · '
        "grey: no goal · dashed line: the goal</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="store_true", help="build and run the benches first")
    parser.add_argument("--doc", default=str(ROOT / "docs" / "performance.md"))
    parser.add_argument("--svg", default=str(ROOT / "docs" / "performance-ratios.svg"))
    args = parser.parse_args()

    out_dir = target_dir() / "bench-report"
    log, meta = out_dir / "run.log", out_dir / "run.json"
    if args.run:
        run(log, meta)
    text = log.read_text() if log.exists() else sys.exit(f"missing {log}: use --run")
    info = json.loads(meta.read_text()) if meta.exists() else {}

    m = medians(target_dir() / "criterion")
    s = scale_figures(text)
    rs = ratios(m, s)
    report = markdown(m, s, writer_rates(text), rs, info)
    print(report)

    Path(args.svg).write_text(svg(rs))
    doc = Path(args.doc)
    if doc.exists():
        body = doc.read_text()
        if START in body and END in body:
            head, rest = body.split(START, 1)
            _, tail = rest.split(END, 1)
            doc.write_text(f"{head}{START}\n{report}\n{END}{tail}")
        else:
            sys.exit(f"{doc} has no {START} ... {END} section to fill")


if __name__ == "__main__":
    main()
