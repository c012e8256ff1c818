"""The command's outputs, rendered from the results passed in (``results.Evaluation``) and the
settings given to ``Report``: table1, ablations and objectives (markdown and JSON), analysis with
its figures and qualitative tables, and tb/ (TensorBoard). Every file is written atomically."""
from __future__ import annotations

import math
import random
import shlex
import statistics
from pathlib import Path

from ..data import read_qqp, read_sst, read_sts, task_file
from ..files import atomic_path, save_dir_atomic, write_json_atomic, write_text_atomic
from ..multitask import prediction_file
from .options import SUITE_KEYS
from .plan import PRETRAININGS, TABLE1_ROWS, Plan, Row, steps_for
from .results import FINETUNE_METRICS, FINETUNED, ItemScores, read_predictions

# ---- the report ------------------------------------------------------------------------------
#: Report table 1 (bert-base-uncased, dev sets).
REPORT_TABLE1 = {
    "MinBERT": {"sts_spearman": 0.514, "sst_accuracy": 0.512, "qqp_accuracy": 0.821, "sts_pearson": 0.848},
    "MinBERT-SimCSE": {"sts_spearman": 0.745, "sst_accuracy": 0.511, "qqp_accuracy": 0.825, "sts_pearson": 0.852},
    "MinBERT-Mirror": {"sts_spearman": 0.736, "sst_accuracy": 0.522, "qqp_accuracy": 0.820, "sts_pearson": 0.858},
    "MinBERT-flow": {"sts_spearman": 0.517, "sst_accuracy": 0.506, "qqp_accuracy": 0.821, "sts_pearson": 0.857},
    "BERT-CF": {"sts_spearman": 0.760, "sst_accuracy": 0.525, "qqp_accuracy": 0.841, "sts_pearson": 0.857},
}
#: Report ablations, unsupervised STS dev Spearman.
REPORT_ABLATIONS = {"SimCSE-joint": 0.746, "MinBERT-joint": 0.629, "Mirror-flow": 0.739}
#: Report section 6.3: alignment and uniformity on QQP train pairs.
REPORT_ANALYSIS = {
    "MinBERT": {"alignment": 0.216, "uniformity": -1.425},
    "MinBERT-SimCSE": {"alignment": 0.397, "uniformity": -3.264},
    "MinBERT-Mirror": {"alignment": 0.391, "uniformity": -2.990},
    "MinBERT-flow": {"alignment": 0.499, "uniformity": -2.857},
    "BERT-CF": {"alignment": 0.416, "uniformity": -3.198},
}
HISTOGRAM_ROWS = ("MinBERT", "BERT-CF")  # the report's appendix figures
#: The table 1 rows shown beside the ablations (BERT-CF) and the objectives (MinBERT and the report's
#: variants of SimCSE and Mirror-BERT).
ABLATION_REFERENCES = [TABLE1_ROWS[-1]]
OBJECTIVE_REFERENCES = list(TABLE1_ROWS[:3])


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


# ---- several seeds ---------------------------------------------------------------------------------
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


def settings_md(plan: Plan) -> str:
    """The plan's settings, as the tables' Settings section says them."""
    a = plan.args
    steps = {s: steps_for(s, a.steps_scale) for s in ("mirror", "joint", "flow")}
    corpus = a.corpus or ("the task train files" if a.corpus_from_tasks else f"{a.data_dir}/wiki1m_for_simcse.txt")
    lines = [f"- model: `{a.model}` (the report: bert-base-uncased)",
             f"- data: `{a.data_dir}`; pretraining corpus: {corpus}"
             + (f", first {a.max_sentences} sentences" if a.max_sentences else "") + " (the report: Wiki1M)",
             f"- steps: mirror {steps['mirror']}, joint {steps['joint']}, flow {steps['flow']}, "
             f"multitask {steps_for('multitask', plan.ft_scale)} (the report: 10^4, 10^4, 10^4, 5000)",
             (f"- seeds {', '.join(map(str, plan.seeds))} (each cell: mean ± sd over them; --seed {a.seed}'s runs "
              f"in stages/ and finetune/, the others' in seeds/SEED/)" if len(plan.seeds) > 1 else f"- seed {a.seed}")
             + f", device {plan.device}, max length {a.max_length} in training, "
             f"{a.eval_max_length or 'whole sentences'} in evaluation"]
    if plan.base:
        lines.append(f"- mlm-base: MinBERT is the MLM base, {a.mlm_steps} steps of masked language modelling from the "
                     f"random weights of `{a.config}` (stages/{plan.base}); Random weights is that encoder untrained")
    if "objectives" in plan.commands and a.preset == "published":
        lines.append("- objectives: each method at its paper's settings (`--preset published`: run_pretrain.py "
                     "--preset NAME, one epoch of the corpus each; flags in --pretrain-args win)")
    if a.pretrain_args:
        lines.append(f"- extra flags of every pretraining run: `{a.pretrain_args}`")
    if a.finetune_args:
        lines.append(f"- extra flags of every fine-tuning: `{a.finetune_args}`")
    if a.max_train_examples:
        lines.append(f"- fine-tuning on at most {a.max_train_examples} training examples per task")
    return "\n".join(lines) + "\n"

def settings_json(plan: Plan) -> dict:
    a = plan.args
    return {k: getattr(a, k) for k in SUITE_KEYS} | {
        "device": str(plan.device),
        "stage_steps": {s: steps_for(s, a.steps_scale) for s in ("mirror", "joint", "flow")},
        "multitask_steps": steps_for("multitask", plan.ft_scale), "finetune": plan.finetune, "seeds": plan.seeds}


class Report:
    """Writes into ``out``; ``settings_md``/``settings_json`` (see the functions above) and
    ``command`` (the argv) go under every table; ``data_dir`` holds the dev files the qualitative
    tables quote; ``seeds``: the seeds every row ran with (the histograms and qualitative tables
    show the first); ``outputs`` lists what was written. The tables take results.Evaluation's
    results, {row key: {seed: ...}}."""

    def __init__(self, out: Path, settings_md: str, settings_json: dict, command: list, data_dir: Path,
                 senteval_dir: Path, transfer: bool, seed: int, seeds: list[int], qualitative_pairs: int):
        self.out, self.settings_md, self.settings_json, self.command = out, settings_md, settings_json, command
        self.data_dir, self.senteval_dir, self.transfer = data_dir, senteval_dir, transfer
        self.seed, self.seeds, self.qualitative_pairs = seed, seeds, qualitative_pairs
        self.items = ItemScores(data_dir)
        self.outputs: list[str] = []

    def summary(self, results: dict, row: Row) -> dict:
        """``row_summary`` with the 95% intervals (``ci95``, over the seeds and the evaluation items)
        of the unsupervised STS dev ρ, each SentEval STS set and the fine-tuned metrics."""
        per_seed = results[row.key]
        summary = row_summary(per_seed)
        for metric in ("sts_spearman", *FINETUNED):
            summary[metric]["ci95"] = self.items.interval(per_seed, metric)
        for task, agg in (summary["senteval"] or {"sts": {}})["sts"].items():
            agg["ci95"] = self.items.interval(per_seed, f"senteval_{task}")
        return summary

    def cell(self, agg: dict, digits: int = 3) -> str:
        return cell(agg, digits, len(self.seeds))

    def spread_note(self) -> str:
        """What a cell is, under a table of several seeds."""
        if len(self.seeds) == 1:
            return ""
        return (f"Each cell: mean ± sd over the {len(self.seeds)} seeds {', '.join(map(str, self.seeds))} "
                "((n=k): only k seeds have the value); the per-seed values are in the JSON beside this file, "
                "and claims.md tests the differences between rows.\n\n")

    def interval_note(self) -> str:
        """What the 95% CI column is."""
        what = "the seeds and the STS dev pairs" if len(self.seeds) > 1 else "the STS dev pairs (one seed: not training noise)"
        return (f"95% CI: the unsupervised ρ's percentile interval from a bootstrap over {what}; "
                "the JSON also has one for every SentEval STS set and fine-tuned metric.\n\n")

    def first_seed(self, results: dict, row: Row) -> dict:
        """The row's results for the first seed (the histograms and qualitative tables)."""
        return results[row.key][self.seeds[0]]

    def senteval_columns(self, summaries: dict) -> tuple[list[str], dict]:
        """The optional columns: the STS test average ("7 STS avg (test)" when all seven are
        there) and, with --transfer, the transfer average; {row key: cells}. ``summaries``: {row key:
        row_summary}."""
        found = {k: v["senteval"] for k, v in summaries.items() if v["senteval"]}
        if not found:
            return [], {}
        first = next(iter(found.values()))
        n = len(first["sts"])
        header = ["7 STS avg (test)" if n == 7 else f"{next(iter(first['sts']))} (test)" if n == 1
                  else f"STS avg (test, {n} sets)"]
        if self.transfer:  # the anchors' average is over all seven tasks: say which this one covers
            tasks = first["transfer_avg_tasks"]
            header.append("Transfer avg (fasttest)" if len(tasks) == 7 else
                          f"Transfer avg of {len(tasks)}/7 (fasttest: {', '.join(tasks)})")
        cells = {k: [self.cell(v["sts_avg"], 2)] + ([self.cell(v["transfer_avg"], 2)] if self.transfer else [])
                 for k, v in found.items()}
        return header, cells

    def footer(self) -> str:
        """The Settings section and the command, under every table."""
        command = shlex.join(["python", "-m", "bertcf.experiments"] + self.command)
        return "\n## Settings\n\n" + self.settings_md + "\n" + f"Command: `{command}`\n"

    def write(self, name: str, text: str) -> None:
        write_text_atomic(self.out / name, text)
        self.outputs.append(str(self.out / name))

    def write_json(self, name: str, obj) -> None:
        write_json_atomic(self.out / name, obj)
        self.outputs.append(str(self.out / name))

    def row_info(self, results: dict, row: Row) -> dict:
        """The row's encoder and runs (results.Evaluation.info) for the first seed, and every seed's
        under "seeds" when there are several."""
        per_seed = {s: r["info"] for s, r in results[row.key].items()}
        info = dict(per_seed[self.seeds[0]])
        return info | ({"seeds": {str(s): i for s, i in per_seed.items()}} if len(self.seeds) > 1 else {})

    def table1(self, rows: list[Row], results: dict) -> dict:
        """table1.md/json: each row's unsupervised STS dev Spearman and fine-tuned dev metrics."""
        summaries = {row.key: self.summary(results, row) for row in rows}
        keys = ("sts_spearman", "sst_accuracy", "qqp_accuracy", "sts_pearson")
        rows_json, md_rows = [], []
        for row in rows:
            summary = summaries[row.key]
            ours = {k: summary[k] for k in ("sts_spearman", *FINETUNE_METRICS)} | {"senteval": summary["senteval"]}
            report = REPORT_TABLE1.get(row.name, dict.fromkeys(REPORT_TABLE1["MinBERT"]))
            rows_json.append({"name": row.name, "ours": ours, "report": report} | self.row_info(results, row))
            md_rows.append([row.name, self.cell(ours["sts_spearman"]), interval_cell(ours["sts_spearman"])]
                           + [c for k in keys for c in ([] if k == "sts_spearman" else [self.cell(ours[k])])
                              + [fmt(report[k])]])
        header = ["Encoder", "Unsup. STS ρ", "95% CI", "(report)", "SST-5 acc", "(report)", "QQP acc", "(report)",
                  "STS r", "(report)"]
        extra, cells = self.senteval_columns(summaries)
        header += extra
        md_rows = [r + cells.get(row.key, ["–"] * len(extra)) for r, row in zip(md_rows, rows)]
        md = ("# Table 1: sentence encoders on the CS224N dev sets\n\n"
              "Unsupervised STS ρ: Spearman of cos(f(x1), f(x2)) with the STS dev scores, before fine-tuning. "
              "SST-5 / QQP accuracy and STS Pearson r: after multitask fine-tuning of each encoder. "
              "(report) = the report's number (bert-base-uncased).\n\n"
              + self.spread_note() + self.interval_note() + md_table(header, md_rows) + self.footer())
        if not self.settings_json["finetune"] and all(not r["ours"]["sst_accuracy"]["n"] for r in rows_json):
            md += "\nFine-tuning was not run (--no-finetune): the supervised columns are empty.\n"
        obj = {"rows": rows_json, "settings": self.settings_json, "command": self.command}
        self.write("table1.md", md)
        self.write_json("table1.json", obj)
        return obj

    def ablations(self, rows: list[Row], results: dict) -> dict:
        return self.sts_table("ablations", "Ablations: unsupervised STS dev Spearman", "", "Variant", rows,
                              REPORT_ABLATIONS, ABLATION_REFERENCES, results)

    def objectives(self, rows: list[Row], results: dict) -> dict:
        if any(PRETRAININGS[r.pretraining].preset for r in rows if r.pretraining):
            text = ("Each method at its paper's settings (`run_pretrain.py --preset NAME`: its loss variant, "
                    "pooling, augmentation, temperature, batch, learning rate, length, one epoch of the corpus; "
                    "README's table of methods says what still differs), from --model, with the choice of "
                    "the best STS-dev checkpoint of this project. MLM has no preset: it runs as in `objectives`. "
                    "The report has no numbers for these, so their (report) cells are empty.\n\n")
        else:
            text = ("Other self-supervised objectives in the first pretraining stage (`--stage mirror "
                    "--method bsl|ct|tsdae|mlm`), each from --model with the same corpus, steps and choice "
                    "of the best STS-dev checkpoint as MinBERT-Mirror. The report has no numbers for these "
                    "(it trains Mirror-BERT and SimCSE only), so their (report) cells are empty.\n\n")
        return self.sts_table("objectives", "Pretraining objectives: unsupervised STS dev Spearman", text,
                              "Encoder", rows, {}, OBJECTIVE_REFERENCES, results)

    def sts_table(self, name: str, title: str, text: str, first: str, rows: list[Row], report: dict,
                  references: list[Row], results: dict) -> dict:
        """NAME.md/json: each row's unsupervised STS dev Spearman beside the report's (``report``:
        by row name; a row not in it has none), then those of the ``references`` (table 1 rows,
        with the report's table 1 number) whose encoder is there (evaluated: in ``results``)."""
        present = [r for r in references if r.key in results and row_summary(results[r.key])["sts_spearman"]["n"]]
        summaries = {row.key: self.summary(results, row) for row in rows + present}

        def entry(row: Row, report_value) -> dict:
            spec = PRETRAININGS[row.pretraining] if row.pretraining else None
            what = "--model, untouched" if spec is None else spec.what + (
                f" (`--preset {spec.preset}`)" if spec.preset else "")
            summary = summaries[row.key]
            return {"name": row.name, "what": what,
                    "ours": {"sts_spearman": summary["sts_spearman"], "senteval": summary["senteval"]},
                    "report": {"sts_spearman": report_value}} | self.row_info(results, row)

        rows_json = [entry(row, report.get(row.name)) for row in rows]
        refs_json = [entry(row, REPORT_TABLE1[row.name]["sts_spearman"]) for row in present]
        labelled = [r["name"] for r in rows_json] + [f"*{r['name']}* (reference)" for r in refs_json]
        extra, cells = self.senteval_columns(summaries)
        md_rows = [[label, r["what"], self.cell(r["ours"]["sts_spearman"]), interval_cell(r["ours"]["sts_spearman"]),
                    fmt(r["report"]["sts_spearman"])] + cells.get(row.key, ["–"] * len(extra))
                   for label, r, row in zip(labelled, rows_json + refs_json, rows + present)]
        absent = [r.name for r in references if r not in present]
        note = (f"\n{', '.join(absent)} (reference): not trained in this --out-dir yet (`table1` or `all` "
                f"with the same --out-dir trains it).\n" if absent else "")
        md = (f"# {title}\n\n{text}" + self.spread_note() + self.interval_note()
              + md_table([first, "What", "Unsup. STS ρ", "95% CI", "(report)"] + extra, md_rows,
                         "llrrr" + "r" * len(extra))
              + note + self.footer())
        obj = {"rows": rows_json, "reference": refs_json, "settings": self.settings_json, "command": self.command}
        self.write(f"{name}.md", md)
        self.write_json(f"{name}.json", obj)
        return obj

    def claims(self, claims: list[dict]) -> dict:
        """claims.md/json: the report's claims, tested (``claims.test_claims``)."""
        from .claims import claims_md
        obj = {"claims": claims, "settings": self.settings_json, "command": self.command}
        self.write("claims.md", claims_md(claims, self.footer()))
        self.write_json("claims.json", obj)
        return obj

    def analysis(self, rows: list[Row], results: dict) -> dict:
        """analysis.md/json (alignment and uniformity, the SentEval STS sets, the histograms),
        qualitative.md and tb/."""
        import torch

        keys = ("alignment", "uniformity", "sts_dev_alignment", "sts_dev_uniformity")
        rows_json, md_rows, info = [], [], {}
        for row in rows:
            summary = row_summary(results[row.key])
            report = REPORT_ANALYSIS[row.name]
            rows_json.append({"name": row.name, "ours": {k: summary[k] for k in keys}, "report": report})
            md_rows.append([row.name, self.cell(summary["alignment"]), fmt(report["alignment"]),
                            self.cell(summary["uniformity"]), fmt(report["uniformity"]),
                            self.cell(summary["sts_dev_alignment"]), self.cell(summary["sts_dev_uniformity"])])
            info = self.first_seed(results, row)["qqp"] or info
        sample = (f"{info.get('pairs')} QQP train pairs ({info.get('positives')} duplicates, "
                  f"{info.get('sentences')} distinct sentences)" if info else "QQP train pairs")
        # Histograms of the STS dev cosines (the first seed's): PNG and TensorBoard.
        gold = [p.label for p in read_sts(task_file(self.data_dir, "sts", "dev"))]
        which = f" (seed {self.seeds[0]})" if len(self.seeds) > 1 else ""
        figures, histograms = [], {}
        for row in rows:
            sts = self.first_seed(results, row)["sts"]
            if row.name in HISTOGRAM_ROWS and sts:
                name = f"figures/sts-dev-cosines-{row.key}.png"
                write_histogram_png(self.out / name, sts["cosines"], gold, f"{row.name}: STS dev pair cosines{which}")
                self.outputs.append(str(self.out / name))
                figures.append((row.name, name))
                histograms[row.name] = torch.tensor(sts["cosines"])
        md = ("# Alignment and uniformity (report section 6.3)\n\n"
              f"On {sample}, sampled with seed {self.seed}. Alignment: mean ‖f(x)−f(y)‖² over duplicate "
              "pairs (lower is better); uniformity: log mean exp(−2‖f(x)−f(y)‖²) over all pairs of sentences "
              "(lower is better); f normalised. The last two columns: the same on STS dev (pairs with gold ≥ 4).\n\n"
              + self.spread_note()
              + md_table(["Encoder", "Alignment", "(report)", "Uniformity", "(report)",
                          "STS-dev align.", "STS-dev unif."], md_rows)
              + self.senteval_md(rows, results)
              + f"\n# STS dev cosine histograms{which}\n\n"
              + "".join(f"![{n}]({p})\n\n" for n, p in figures)
              + self.footer())
        obj = {"rows": rows_json, "sample": info, "figures": [p for _, p in figures],
               "settings": self.settings_json, "command": self.command}
        self.write("analysis.md", md)
        self.write_json("analysis.json", obj)
        self.write("qualitative.md", self.qualitative_md(rows, results))
        self.tensorboard(histograms)
        return obj

    def senteval_md(self, rows: list[Row], results: dict) -> str:
        """The analysis' per-set table of SentEval's STS test sets (Spearman ×100), when run."""
        from ..senteval import STS_TASKS
        found = [(r.name, s) for r in rows if (s := row_summary(results[r.key])["senteval"])]
        if not found:
            return ""
        empty = {"n": 0}
        table = [[name] + [self.cell(v["sts"].get(t, empty), 2) for t in STS_TASKS] + [self.cell(v["sts_avg"], 2)]
                 for name, v in found]
        return ("\n# SentEval STS test sets\n\nSpearman ×100 of the cosine of raw vectors (STS12-16: SentEval's "
                f"\"all\" setting), whole sentences, from `{self.senteval_dir}` (`python -m bertcf.evaluate`).\n\n"
                + md_table(["Encoder", *STS_TASKS, "Avg."], table))

    def qualitative_md(self, table1_rows: list[Row], results: dict) -> str:
        k, rng = self.qualitative_pairs, random.Random(self.seed)
        first = {r.key: self.first_seed(results, r) for r in table1_rows}
        rows = [r for r in table1_rows if first[r.key]["sts"]]
        sts_dev = read_sts(task_file(self.data_dir, "sts", "dev"))
        picked = sorted(rng.sample(range(len(sts_dev)), min(k, len(sts_dev))), key=lambda i: -sts_dev[i].label)
        table = [[md_cell(sts_dev[i].sentence1, 60), md_cell(sts_dev[i].sentence2, 60), f"{sts_dev[i].label:.1f}"]
                 + [fmt(first[r.key]["sts"]["cosines"][i], 2) for r in rows] for i in picked]
        which = f" (seed {self.seeds[0]})" if len(self.seeds) > 1 else ""
        md = (f"# Qualitative examples{which}\n\n## STS dev: gold score and each encoder's cosine (before fine-tuning)\n\n"
              + md_table(["Sentence 1", "Sentence 2", "Gold"] + [r.name for r in rows], table, "llr" + "r" * len(rows)))
        tuned = [r for r in table1_rows if first[r.key]["finetune"] is not None]
        if not tuned:
            return md + "\nNo fine-tuned encoders (table1 with fine-tuning adds QQP and SST predictions here).\n"
        for task, title, reader, fields in (
                ("qqp", "QQP dev: duplicate label and each fine-tuned encoder's prediction", read_qqp,
                 lambda p: [md_cell(p.sentence1, 60), md_cell(p.sentence2, 60), f"{p.label:g}"]),
                ("sst", "SST-5 dev: sentiment label and each fine-tuned encoder's prediction", read_sst,
                 lambda p: [md_cell(p.sentence, 100), str(p.label)])):
            path = task_file(self.data_dir, task, "dev")
            if not path.is_file():
                continue
            examples = reader(path)
            picked = rng.sample(examples, min(k, len(examples)))
            file = prediction_file(task, "dev")
            preds = {r.name: read_predictions(Path(first[r.key]["info"]["finetune_dir"]) / "predictions" / file)
                     for r in tuned}
            header = (["Question 1", "Question 2", "Label"] if task == "qqp" else ["Sentence", "Label"])
            table = [fields(p) + [_pred(preds[r.name].get(p.id)) for r in tuned] for p in picked]
            md += (f"\n## {title}\n\n"
                   + md_table(header + [r.name for r in tuned], table, "l" * (len(header) - 1) + "r" * (1 + len(tuned))))
        return md

    def tensorboard(self, histograms: dict) -> None:
        texts = {name: (self.out / f"{name}.md").read_text() for name in ("table1", "ablations", "analysis",
                                                                            "qualitative", "claims")
                 if (self.out / f"{name}.md").is_file()}

        def write(tmp):
            from torch.utils.tensorboard import SummaryWriter
            writer = SummaryWriter(str(tmp))
            for name, values in histograms.items():
                writer.add_histogram(f"sts_dev_cosines/{name}", values, 0)
            for name, text in texts.items():
                writer.add_text(name, text, 0)
            writer.close()
        save_dir_atomic(self.out / "tb", write)
        self.outputs.append(str(self.out / "tb"))


def _pred(value) -> str:
    if value is None:
        return "–"
    try:
        return f"{float(value):g}"
    except ValueError:
        return md_cell(value, 20)


def write_histogram_png(path, cosines, gold, title: str) -> None:
    """A histogram of pair cosines over [-1, 1], stacked by gold-score band; written atomically."""
    import numpy as np
    from matplotlib.figure import Figure

    cosines, gold = np.asarray(cosines, dtype=float), np.asarray(gold, dtype=float)
    bands = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5.001)]
    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    ax = fig.subplots()
    ax.hist([cosines[(gold >= lo) & (gold < hi)] for lo, hi in bands], bins=np.linspace(-1, 1, 81), stacked=True,
            label=[f"gold {lo:g}–{min(hi, 5):g}" for lo, hi in bands], color=[
                "#d73027", "#fc8d59", "#fee090", "#91bfdb", "#4575b4"])
    ax.axvline(float(cosines.mean()), color="black", linestyle="--", linewidth=1,
               label=f"mean {cosines.mean():.2f}")
    ax.set_xlim(-1, 1)
    ax.set_xlabel("cosine similarity of the pair's sentence vectors")
    ax.set_ylabel("STS dev pairs")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")

