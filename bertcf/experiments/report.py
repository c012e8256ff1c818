"""The command's outputs, rendered from the results passed in (``results.Evaluation``) and the
settings given to ``Report``: table1, ablations and objectives (markdown and JSON), analysis with
its figures and qualitative tables, and tb/ (TensorBoard). Every file is written atomically."""
from __future__ import annotations

import math
import random
import shlex
from pathlib import Path

from ..data import read_qqp, read_sst, read_sts, task_file
from ..files import atomic_path, save_dir_atomic, write_json_atomic, write_text_atomic
from ..multitask import prediction_file
from .options import SUITE_KEYS
from .plan import PRETRAININGS, TABLE1_ROWS, Plan, Row, steps_for
from .results import FINETUNE_METRICS, read_predictions

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
#: The table 1 rows shown beside the ablations (BERT-CF) and the objectives (MinBERT, MinBERT-Mirror).
ABLATION_REFERENCES = [TABLE1_ROWS[-1]]
OBJECTIVE_REFERENCES = [TABLE1_ROWS[0], TABLE1_ROWS[2]]


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
             f"- seed {a.seed}, device {plan.device}, max length {a.max_length} in training, "
             f"{a.eval_max_length or 'whole sentences'} in evaluation"]
    if plan.base:
        lines.append(f"- mlm-base: MinBERT is the MLM base, {a.mlm_steps} steps of masked language modelling from the "
                     f"random weights of `{a.config}` (stages/{plan.base}); Random weights is that encoder untrained")
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
        "multitask_steps": steps_for("multitask", plan.ft_scale), "finetune": plan.finetune}


class Report:
    """Writes into ``out``; ``settings_md``/``settings_json`` (see the functions above) and
    ``command`` (the argv) go under every table; ``data_dir`` holds the dev files the qualitative
    tables quote; ``outputs`` lists what was written."""

    def __init__(self, out: Path, settings_md: str, settings_json: dict, command: list, data_dir: Path,
                 senteval_dir: Path, transfer: bool, seed: int, qualitative_pairs: int):
        self.out, self.settings_md, self.settings_json, self.command = out, settings_md, settings_json, command
        self.data_dir, self.senteval_dir, self.transfer = data_dir, senteval_dir, transfer
        self.seed, self.qualitative_pairs = seed, qualitative_pairs
        self.outputs: list[str] = []

    def senteval_columns(self, results: dict, rows: list[Row]) -> tuple[list[str], dict]:
        """The optional columns: the STS test average ("7 STS avg (test)" when all seven are
        there) and, with --transfer, the transfer average; {row key: cells}."""
        found = {r.key: results[r.key]["senteval"] for r in rows if (results.get(r.key) or {}).get("senteval")}
        if not found:
            return [], {}
        n = len(next(iter(found.values()))["sts"])
        header = ["7 STS avg (test)" if n == 7 else f"STS avg (test, {n} sets)"]
        header += ["Transfer avg (fasttest)"] if self.transfer else []
        cells = {k: [fmt(v["sts_avg"], 2)] + ([fmt(v["transfer_avg"], 2)] if self.transfer else [])
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

    def table1(self, rows: list[Row], results: dict) -> dict:
        """table1.md/json: each row's unsupervised STS dev Spearman and fine-tuned dev metrics."""
        rows_json, md_rows = [], []
        for row in rows:
            r = results[row.key]
            ours = {"sts_spearman": r["sts"]["sts_spearman"] if r["sts"] else None}
            ours |= r["finetune"] or {k: None for k in FINETUNE_METRICS}
            report = REPORT_TABLE1.get(row.name, dict.fromkeys(REPORT_TABLE1["MinBERT"]))
            rows_json.append({"name": row.name, "ours": ours, "report": report} | r["info"])
            md_rows.append([row.name] + [c for k in ("sts_spearman", "sst_accuracy", "qqp_accuracy", "sts_pearson")
                                         for c in (fmt(ours[k]), fmt(report[k]))])
        header = ["Encoder", "Unsup. STS ρ", "(report)", "SST-5 acc", "(report)", "QQP acc", "(report)",
                  "STS r", "(report)"]
        extra, cells = self.senteval_columns(results, rows)
        header += extra
        md_rows = [r + cells.get(row.key, ["–"] * len(extra)) for r, row in zip(md_rows, rows)]
        for r, row in zip(rows_json, rows):
            r["ours"]["senteval"] = results[row.key]["senteval"]
        md = ("# Table 1: sentence encoders on the CS224N dev sets\n\n"
              "Unsupervised STS ρ: Spearman of cos(f(x1), f(x2)) with the STS dev scores, before fine-tuning. "
              "SST-5 / QQP accuracy and STS Pearson r: after multitask fine-tuning of each encoder. "
              "(report) = the report's number (bert-base-uncased).\n\n"
              + md_table(header, md_rows) + self.footer())
        if not self.settings_json["finetune"] and all(r["ours"]["sst_accuracy"] is None for r in rows_json):
            md += "\nFine-tuning was not run (--no-finetune): the supervised columns are empty.\n"
        obj = {"rows": rows_json, "settings": self.settings_json, "command": self.command}
        self.write("table1.md", md)
        self.write_json("table1.json", obj)
        return obj

    def ablations(self, rows: list[Row], results: dict) -> dict:
        return self.sts_table("ablations", "Ablations: unsupervised STS dev Spearman", "", "Variant", rows,
                              REPORT_ABLATIONS, ABLATION_REFERENCES, results)

    def objectives(self, rows: list[Row], results: dict) -> dict:
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
        def entry(row: Row, report_value) -> dict:
            r = results[row.key]
            what = PRETRAININGS[row.pretraining].what if row.pretraining else "--model, untouched"
            return {"name": row.name, "what": what,
                    "ours": {"sts_spearman": r["sts"]["sts_spearman"] if r["sts"] else None,
                             "senteval": r["senteval"]},
                    "report": {"sts_spearman": report_value}} | r["info"]

        present = [r for r in references if (results.get(r.key) or {}).get("sts")]
        rows_json = [entry(row, report.get(row.name)) for row in rows]
        refs_json = [entry(row, REPORT_TABLE1[row.name]["sts_spearman"]) for row in present]
        labelled = [r["name"] for r in rows_json] + [f"*{r['name']}* (reference)" for r in refs_json]
        extra, cells = self.senteval_columns(results, rows + present)
        md_rows = [[label, r["what"], fmt(r["ours"]["sts_spearman"]), fmt(r["report"]["sts_spearman"])]
                   + cells.get(row.key, ["–"] * len(extra))
                   for label, r, row in zip(labelled, rows_json + refs_json, rows + present)]
        absent = [r.name for r in references if r not in present]
        note = (f"\n{', '.join(absent)} (reference): not trained in this --out-dir yet (`table1` or `all` "
                f"with the same --out-dir trains it).\n" if absent else "")
        md = (f"# {title}\n\n{text}"
              + md_table([first, "What", "Unsup. STS ρ", "(report)"] + extra, md_rows, "llrr" + "r" * len(extra))
              + note + self.footer())
        obj = {"rows": rows_json, "reference": refs_json, "settings": self.settings_json, "command": self.command}
        self.write(f"{name}.md", md)
        self.write_json(f"{name}.json", obj)
        return obj

    def analysis(self, rows: list[Row], results: dict) -> dict:
        """analysis.md/json (alignment and uniformity, the SentEval STS sets, the histograms),
        qualitative.md and tb/."""
        import torch

        rows_json, md_rows, info = [], [], {}
        for row in rows:
            r = results[row.key]
            q = r["qqp"] or {}
            report = REPORT_ANALYSIS[row.name]
            sts = r["sts"] or {}
            rows_json.append({"name": row.name, "ours": {"alignment": q.get("alignment"),
                                                          "uniformity": q.get("uniformity"),
                                                          "sts_dev_alignment": sts.get("alignment"),
                                                          "sts_dev_uniformity": sts.get("uniformity")},
                              "report": report})
            md_rows.append([row.name, fmt(q.get("alignment")), fmt(report["alignment"]),
                            fmt(q.get("uniformity")), fmt(report["uniformity"]),
                            fmt(sts.get("alignment")), fmt(sts.get("uniformity"))])
            info = q or info
        sample = (f"{info.get('pairs')} QQP train pairs ({info.get('positives')} duplicates, "
                  f"{info.get('sentences')} distinct sentences)" if info else "QQP train pairs")
        # Histograms of the STS dev cosines: PNG and TensorBoard.
        gold = [p.label for p in read_sts(task_file(self.data_dir, "sts", "dev"))]
        figures, histograms = [], {}
        for row in rows:
            if row.name in HISTOGRAM_ROWS and results[row.key]["sts"]:
                cosines = results[row.key]["sts"]["cosines"]
                name = f"figures/sts-dev-cosines-{row.key}.png"
                write_histogram_png(self.out / name, cosines, gold, f"{row.name}: STS dev pair cosines")
                self.outputs.append(str(self.out / name))
                figures.append((row.name, name))
                histograms[row.name] = torch.tensor(cosines)
        md = ("# Alignment and uniformity (report section 6.3)\n\n"
              f"On {sample}, sampled with seed {self.seed}. Alignment: mean ‖f(x)−f(y)‖² over duplicate "
              "pairs (lower is better); uniformity: log mean exp(−2‖f(x)−f(y)‖²) over all pairs of sentences "
              "(lower is better); f normalised. The last two columns: the same on STS dev (pairs with gold ≥ 4).\n\n"
              + md_table(["Encoder", "Alignment", "(report)", "Uniformity", "(report)",
                          "STS-dev align.", "STS-dev unif."], md_rows)
              + self.senteval_md(rows, results)
              + "\n# STS dev cosine histograms\n\n"
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
        found = [(r.name, results[r.key]["senteval"]) for r in rows if results[r.key]["senteval"]]
        if not found:
            return ""
        table = [[name] + [fmt(v["sts"].get(t), 2) for t in STS_TASKS] + [fmt(v["sts_avg"], 2)] for name, v in found]
        return ("\n# SentEval STS test sets\n\nSpearman ×100 of the cosine of raw vectors (STS12-16: SentEval's "
                f"\"all\" setting), whole sentences, from `{self.senteval_dir}` (`python -m bertcf.evaluate`).\n\n"
                + md_table(["Encoder", *STS_TASKS, "Avg."], table))

    def qualitative_md(self, table1_rows: list[Row], results: dict) -> str:
        k, rng = self.qualitative_pairs, random.Random(self.seed)
        rows = [r for r in table1_rows if results[r.key]["sts"]]
        sts_dev = read_sts(task_file(self.data_dir, "sts", "dev"))
        picked = sorted(rng.sample(range(len(sts_dev)), min(k, len(sts_dev))), key=lambda i: -sts_dev[i].label)
        table = [[md_cell(sts_dev[i].sentence1, 60), md_cell(sts_dev[i].sentence2, 60), f"{sts_dev[i].label:.1f}"]
                 + [fmt(results[r.key]["sts"]["cosines"][i], 2) for r in rows] for i in picked]
        md = ("# Qualitative examples\n\n## STS dev: gold score and each encoder's cosine (before fine-tuning)\n\n"
              + md_table(["Sentence 1", "Sentence 2", "Gold"] + [r.name for r in rows], table, "llr" + "r" * len(rows)))
        tuned = [r for r in table1_rows if results[r.key]["finetune"] is not None]
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
            preds = {r.name: read_predictions(Path(results[r.key]["info"]["finetune_dir"]) / "predictions" / file)
                     for r in tuned}
            header = (["Question 1", "Question 2", "Label"] if task == "qqp" else ["Sentence", "Label"])
            table = [fields(p) + [_pred(preds[r.name].get(p.id)) for r in tuned] for p in picked]
            md += (f"\n## {title}\n\n"
                   + md_table(header + [r.name for r in tuned], table, "l" * (len(header) - 1) + "r" * (1 + len(tuned))))
        return md

    def tensorboard(self, histograms: dict) -> None:
        texts = {name: (self.out / f"{name}.md").read_text() for name in ("table1", "ablations", "analysis",
                                                                            "qualitative")
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

