"""``finetuned.md/json``: stage 3 from each encoder row (table 1's, and the ablations' with
``--finetune-ablations``): the fine-tuned SST-5 accuracy, QQP accuracy, STS r and their mean beside
the report's, then the report's claims tested on those columns (``claims.test_claims``)."""
from __future__ import annotations

from .claims import claims_table
from .published import REPORT_TABLE1
from .report import Report, whitening_note
from .results import FINETUNE_METRICS, FINETUNED
from .rows import Row
from .tables import fmt, interval_cell, md_table

TASKS = ("sst_accuracy", "qqp_accuracy", "sts_pearson")
TEXT = ("Each row's encoder fine-tuned by `run_multitask.py` (the settings below): SST-5 and QQP dev accuracy, "
        "STS dev Pearson r and their mean (the run's `mean_dev`). 95% CI: a bootstrap over the seeds and the "
        "dev items. (report) = the report's number (bert-base-uncased, 5000 steps); its mean is of its three "
        "columns. Best step: the step of each seed's kept checkpoint (chosen on the mean dev metric); 0 means "
        "fine-tuning never beat the encoder as it came, its heads untrained.\n\n")
VERDICTS = ("\nVerdicts as in claims.md: a paired, hierarchical bootstrap over the seeds and the dev items; "
            "**supported** when the 95% interval lies above 0, **contradicted** below, **inconclusive** when it "
            "holds 0.\n")


def report_row(name: str) -> dict:
    """The report's three fine-tuned numbers for a row and their mean (None where it has none)."""
    published = REPORT_TABLE1.get(name)
    if published is None:
        return dict.fromkeys((*TASKS, "mean_dev"))
    return {k: published[k] for k in TASKS} | {"mean_dev": round(sum(published[k] for k in TASKS) / 3, 4)}


def write(report: Report, rows: list[Row], results: dict, claims: list[dict]) -> dict:
    """Write finetuned.md/json for ``rows`` (``results``: {row key: {seed: ...}}; ``claims``: every
    tested claim, of which those on the fine-tuned columns between two of ``rows`` are shown)."""
    rows_json, md_rows = [], []
    for row in rows:
        summary = report.summary(results, row)
        ours, published = {k: summary[k] for k in FINETUNE_METRICS}, report_row(row.name)
        # each seed's kept checkpoint: 0 when no evaluation beat the encoder as stage 3 found it
        steps = [r["info"].get("finetune_best_step") for r in results[row.key].values()]
        rows_json.append({"name": row.name, "ours": ours, "report": published, "best_steps": steps}
                         | report.row_info(results, row))
        md_rows.append([row.name] + [c for k in TASKS for c in (report.cell(ours[k]), interval_cell(ours[k]),
                                                                fmt(published[k]))]
                       + [report.cell(ours["mean_dev"]), fmt(published["mean_dev"]),
                          ", ".join("–" if s is None else str(s) for s in steps)])
    header = ["Encoder"] + [c for name in ("SST-5 acc", "QQP acc", "STS r") for c in (name, "95% CI", "(report)")]
    names = {r.name for r in rows}
    tested = [c for c in claims if c["metric"] in FINETUNED and {c["a"], c["b"]} <= names]
    md = ("# The fine-tuned columns: stage 3 from each encoder row\n\n" + TEXT + report.spread_note()
          + whitening_note(rows) + md_table(header + ["Mean", "(report)", "Best step"], md_rows)
          + "\n## The claims on these columns\n\n"
          + (claims_table(tested) + VERDICTS if tested else "No claim has both of its rows fine-tuned here.\n")
          + report.footer())
    obj = {"rows": rows_json, "claims": tested, "settings": report.settings_json, "command": report.command}
    report.write("finetuned.md", md)
    report.write_json("finetuned.json", obj)
    return obj
