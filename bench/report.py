"""Print a results file as the markdown table bench/README.md keeps:
`python -m bench.report FILE`."""

from __future__ import annotations

import json
import sys


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "bench/results-full.json"
    with open(path) as f:
        results = json.load(f)
    base = results["baseline"]
    print(f"{results['mode']} run, {results['date']}, {results['machine']}. Raw-SQLite "
          f"baselines in the same run: one transaction per row "
          f"{base['per_row_rows_per_s']:,.0f} rows/s ({base['per_row_median_s'] * 1000:.3f} ms"
          f"/row); batches of 100 {base['batched100_rows_per_s']:,.0f} rows/s.\n")
    print("| id | figure | value | compared with | ratio | target | met |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for f in results["figures"]:
        value = f"{f['value']:,.3f} {f['unit']}"
        base_v = f"{f['baseline']:,.3f}" if f["baseline"] is not None else ""
        ratio = f"{f['ratio']:.2f}" if f["ratio"] is not None else ""
        met = {True: "yes", False: "**no**", None: ""}[f["met"]]
        note = f" ({f['note']})" if f["note"] else ""
        cells = [f["id"], f["name"] + note, value, base_v, ratio, f["target"], met]
        print("| " + " | ".join(str(cell) for cell in cells) + " |")


if __name__ == "__main__":
    main()
