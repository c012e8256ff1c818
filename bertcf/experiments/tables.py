"""How the tables show numbers: a row's values over its seeds (mean, sd, n), their cells, and
markdown tables."""
from __future__ import annotations

import math
import statistics

from .results import FINETUNE_METRICS


def fmt(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def md_table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = [header, rule] + rows
    return "".join("| " + " | ".join(str(c) for c in line) + " |\n" for line in lines)


def md_cell(text: str, limit: int = 90) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def dig(d, *keys):
    """d[k1][k2]...; None where a level is missing or None."""
    for k in keys:
        if d is None:
            return None
        d = d.get(k) if isinstance(d, dict) else None
    return d


def over_seeds(values: dict) -> dict:
    """{seed: value or None} -> {"mean", "sd", "n", "per_seed"} over the seeds with a finite value;
    sd is the sample standard deviation (None for fewer than two values)."""
    per_seed = {str(s): None if v is None or not math.isfinite(v) else float(v) for s, v in values.items()}
    xs = [v for v in per_seed.values() if v is not None]
    return {"mean": statistics.fmean(xs) if xs else None, "sd": statistics.stdev(xs) if len(xs) > 1 else None,
            "n": len(xs), "per_seed": per_seed}


def row_summary(per_seed: dict) -> dict:
    """One row's numbers over its seeds ({seed: results.Evaluation's dict}): each metric as
    ``over_seeds``; "senteval" None when no seed ran SentEval."""
    def collect(*keys):
        return over_seeds({s: dig(r, *keys) for s, r in per_seed.items()})

    out = {"sts_spearman": collect("sts", "sts_spearman"),
           **{k: collect("finetune", k) for k in FINETUNE_METRICS},
           "alignment": collect("qqp", "alignment"), "uniformity": collect("qqp", "uniformity"),
           "sts_dev_alignment": collect("sts", "alignment"), "sts_dev_uniformity": collect("sts", "uniformity"),
           "senteval": None}
    ran = [r["senteval"] for r in per_seed.values() if r["senteval"]]
    if ran:
        out["senteval"] = {"sts": {t: collect("senteval", "sts", t) for t in ran[0]["sts"]},
                           "sts_avg": collect("senteval", "sts_avg"),
                           "transfer_avg": collect("senteval", "transfer_avg"),
                           "transfer_avg_tasks": ran[0].get("transfer_avg_tasks", [])}
    out["lexical"] = lexical_summary(per_seed)
    return out


def lexical_summary(per_seed: dict) -> dict | None:
    """A row's word similarity over its seeds: {"pooling": the encoder's own, POOLING: {task:
    over_seeds of Spearman ×100}} for the poolings it was scored with; None when no seed was."""
    ran = [r["lexical"] for r in per_seed.values() if r.get("lexical")]
    if not ran:
        return None
    out = {"pooling": ran[0]["pooling"]}
    for pooling in ("cls", "mean"):
        tasks = (ran[0].get(pooling) or {}).get("lexical")
        if tasks:
            out[pooling] = {t: over_seeds({s: dig(r, "lexical", pooling, "lexical", t) for s, r in per_seed.items()})
                            for t in tasks}
    return out


def cell(agg: dict, digits: int = 3, seeds: int = 1) -> str:
    """A table cell: the mean, ± the sd when there are several seeds, and (n=k) when fewer than
    all ``seeds`` have a value; "–" when none has."""
    if not agg["n"]:
        return "–"
    text = fmt(agg["mean"], digits)
    if seeds > 1 and agg["n"] > 1:
        text += f" ± {fmt(agg['sd'], digits)}"
    if seeds > 1 and agg["n"] != seeds:
        text += f" (n={agg['n']})"
    return text


def interval_cell(agg: dict, digits: int = 3) -> str:
    """"[lo, hi]" of an aggregate's ci95, "–" without one."""
    ci = agg.get("ci95")
    return "–" if not ci else f"[{fmt(ci[0], digits)}, {fmt(ci[1], digits)}]"
