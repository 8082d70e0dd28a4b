"""Run `python -m bench` for two source trees in alternating rounds and compare the figures.

    python -m bench.compare OLD_TREE NEW_TREE [--rounds 3] [--only B1,B3] [--full]

Each tree needs its own virtualenv with the project installed editable (`TREE/.ci/venv`),
so each round runs that tree's daemon and client. Rounds alternate old, new, old, new, ...
so both see the same machine load; each figure's median over the rounds is compared, and a
figure more than 10% worse in the new tree is flagged (the F echo floors are printed as
the machine's state, not judged). Figures are matched by id and by
their order within that id (names carry run-dependent detail such as CPU shares).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from typing import Any

WORSE = 0.10  # flag a figure more than this much worse


def higher_is_better(unit: str) -> bool:
    return "/s" in unit


def run_bench(tree: str, out: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    python = os.path.join(tree, ".ci", "venv", "bin", "python")
    cmd = [python, "-m", "bench", "--out", out]
    if not args.full:
        cmd.append("--quick")
    if args.only:
        cmd += ["--only", args.only]
    subprocess.run(cmd, cwd=tree, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        figures: list[dict[str, Any]] = json.load(f)["figures"]
    return figures


def keyed(figures: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    seen: dict[str, int] = {}
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for fig in figures:
        n = seen.get(fig["id"], 0)
        seen[fig["id"]] = n + 1
        out[(fig["id"], n)] = fig
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", help="comma-separated figure ids")
    p.add_argument("--full", action="store_true", help="full sizes (default: --quick)")
    args = p.parse_args()
    runs: dict[str, list[dict[tuple[str, int], dict[str, Any]]]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="sdb-compare-") as tmp:
        for r in range(args.rounds):
            for side in ("old", "new"):
                out = os.path.join(tmp, f"{side}-{r}.json")
                runs[side].append(keyed(run_bench(getattr(args, side), out, args)))
                print(f"round {r + 1}/{args.rounds}: {side} done", flush=True)
    worse = 0
    print(f"\n| figure | unit | old (median of {args.rounds}) | new | new/old | verdict |")
    print("| --- | --- | --- | --- | --- | --- |")
    for key, fig in runs["old"][0].items():
        if not all(key in run for run in runs["old"] + runs["new"]):
            continue
        old = statistics.median(run[key]["value"] for run in runs["old"])
        new = statistics.median(run[key]["value"] for run in runs["new"])
        ratio = new / old if old else float("nan")
        better_up = higher_is_better(fig["unit"])
        if key[0].startswith("F"):  # the echo floors measure the machine, not sessiond
            bad, verdict = False, "(machine)"
        else:
            bad = ratio < 1 - WORSE if better_up else ratio > 1 + WORSE
            verdict = "**worse**" if bad else "ok"
        worse += bad
        print(f"| {key[0]} {fig['name'][:60]} | {fig['unit']} | {old:,.3f} | {new:,.3f} "
              f"| {ratio:.2f} | {verdict} |")
    print(f"\n{worse} figure(s) more than {WORSE:.0%} worse")


if __name__ == "__main__":
    main()
