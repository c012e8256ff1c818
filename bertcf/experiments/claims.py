"""The report's comparative claims, each tested on this output directory's rows: ``claims.json`` and
``claims.md``; beside them, each method at its paper's settings against the report's variant of it
(``objectives --preset published``), the distilled student against the MLM base (``distill``),
and the flow against BERT-whitening, the closed-form control its critics proposed, tested the same
way.

A claim says that row ``a`` scores higher than row ``b`` on a metric (``CLAIMS``). It is tested on
every metric both rows have: the CS224N STS dev Spearman, each SentEval STS set that ran (Spearman
×100) and, when both were fine-tuned, the three fine-tuned dev metrics. The difference a − b is
averaged over the seeds both rows ran with, and its 95% interval comes from a paired, hierarchical
bootstrap (``bertcf.evaluation.bootstrap.paired_difference``): resample the seeds, then the evaluation pairs
(within each STS subset; one resample shared by the drawn seeds), the same pairs for a and b. The verdict: ``supported`` when the interval
lies above 0, ``contradicted`` when it lies below 0, ``inconclusive`` otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..evaluation import bootstrap
from .published import report_value
from .results import BOOTSTRAP_SEED, FINETUNED, RESAMPLES, ItemScores, lexical_metrics
from .rows import ABLATION_ROWS, DISTILL_ROWS, LEXICAL_ROWS, PUBLISHED_ROWS, TABLE1_ROWS, Row
from .tables import fmt, md_table


@dataclass(frozen=True)
class Claim:
    a: str      # row names (rows.py: any row of ROWS)
    b: str
    what: str   # the claim in words
    report: bool = True  # a claim of the report; False: a comparison of ours


CLAIMS = (
    Claim("BERT-CF", "Mirror-flow", "the regulariser: the joint loss beats the flow alone on the same Mirror encoder"),
    Claim("BERT-CF", "MinBERT-joint", "freezing the encoder in the joint stage beats training it"),
    Claim("MinBERT-Mirror", "MinBERT", "contrastive pretraining (Mirror-BERT) improves the base encoder"),
    Claim("MinBERT-Mirror", "MinBERT-SimCSE", "the span: Mirror-BERT's span masking against SimCSE's dropout alone"),
    Claim("MinBERT-flow", "MinBERT", "the flow alone improves the base encoder"),
    Claim("BERT-CF", "MinBERT-Mirror", "the flow on top: BERT-CF improves on the Mirror encoder it starts from"),
    Claim("SimCSE (published)", "MinBERT-SimCSE", "SimCSE at its paper's settings against the report's variant",
          report=False),
    Claim("Mirror-BERT (published)", "MinBERT-Mirror", "Mirror-BERT at its paper's settings against the report's "
          "variant", report=False),
    Claim("Mirror-BERT (lexical)", "MinBERT", "Mirror-BERT's word encoder improves its base on word similarity "
          "(Mirror-BERT's Table 1)", report=False),
    Claim("Distilled student", "MinBERT", "distillation beats MLM: the student taught by --teacher against the MLM "
          "base of the same size, corpus and steps (MinBERT under `distill`)", report=False),
    # The control BERT-flow's critics proposed (BERT-whitening, Su et al. 2021): is it the flow, or its whitening?
    Claim("MinBERT-flow", "MinBERT-whitening", "the flow beats closed-form whitening of the same base encoder",
          report=False),
    Claim("Mirror-flow", "Mirror-whitening", "the flow beats closed-form whitening of the same Mirror encoder",
          report=False),
    Claim("BERT-CF", "Mirror-whitening", "BERT-CF beats closed-form whitening of the Mirror encoder it starts from",
          report=False),
)
ROWS = {r.name: r for r in TABLE1_ROWS + ABLATION_ROWS + PUBLISHED_ROWS + LEXICAL_ROWS + DISTILL_ROWS}


def metrics_of(results: dict) -> list[str]:
    """The metrics the claims are tested on: CS224N STS dev, each SentEval STS set that ran, the fine-tuned
    ones, each word-similarity set with [CLS] and with mean pooling (--lexical-dir)."""
    metrics, lexical = ["sts_spearman"], []
    for per_seed in results.values():
        for r in per_seed.values():
            for name in ((r["senteval"] or {}).get("sts_pairs") or {}):
                if f"senteval_{name}" not in metrics:
                    metrics.append(f"senteval_{name}")
            lexical += [m for m in lexical_metrics(r) if m not in lexical]
    return metrics + list(FINETUNED) + lexical


def test_claims(results: dict, seeds: list[int], data_dir) -> list[dict]:
    """Every claim of ``CLAIMS`` whose two rows are in ``results`` ({row key: {seed: ...}}), on every
    metric both have for at least one common seed."""
    evidence, out = ItemScores(data_dir), []
    for claim in CLAIMS:
        a, b = ROWS[claim.a], ROWS[claim.b]
        if a.key not in results or b.key not in results:
            continue
        for metric in metrics_of(results):
            paired = [(s, evidence.items(results[a.key][s], metric), evidence.items(results[b.key][s], metric))
                      for s in seeds]
            paired = [(s, x, y) for s, x, y in paired if x is not None and y is not None]
            if not paired:
                continue
            _, gold, groups, kind, scale = paired[0][1]
            test = bootstrap.paired_difference([x[0] for _, x, _ in paired], [y[0] for _, _, y in paired], gold,
                                               kind, groups=groups, resamples=RESAMPLES, seed=BOOTSTRAP_SEED)
            ra, rb = report_value(claim.a, metric), report_value(claim.b, metric)
            out.append({"claim": f"{claim.a} > {claim.b} — {claim.what}", "a": claim.a, "b": claim.b,
                        "metric": metric, "mean_difference": scale * test["mean_difference"],
                        "ci95": [scale * v for v in test["ci95"]], "seeds": [s for s, _, _ in paired],
                        "verdict": test["verdict"], "report_claim": claim.report,
                        "report_difference": None if ra is None or rb is None else round(ra - rb, 6)})
    return out


METRIC_LABELS = {"sts_spearman": "CS224N STS dev ρ", "sst_accuracy": "SST-5 acc (fine-tuned)",
                 "qqp_accuracy": "QQP acc (fine-tuned)", "sts_pearson": "STS r (fine-tuned)"}


def label(metric: str) -> str:
    if metric.startswith("lexical_"):
        task, _, pooling = metric.removeprefix("lexical_").rpartition("_")
        return f"{task} ρ×100 ({'[CLS]' if pooling == 'cls' else pooling})"
    return METRIC_LABELS.get(metric) or f"{metric.removeprefix('senteval_')} ρ×100"


def claims_table(claims: list[dict]) -> str:
    """The tested claims (``test_claims``' entries) as a markdown table, one line a claim and metric."""
    rows = [[c["a"], c["b"], label(c["metric"]), fmt(c["mean_difference"], 3),
             f"[{fmt(c['ci95'][0], 3)}, {fmt(c['ci95'][1], 3)}]", str(len(c["seeds"])), f"**{c['verdict']}**",
             fmt(c["report_difference"], 3)] for c in claims]
    return md_table(["a", "b", "Metric", "a − b", "95% CI", "Seeds", "Verdict", "(report)"], rows, "lllrrrlr")


def claims_md(claims: list[dict], footer: str) -> str:
    claims_text = "".join(f"- **{c.a} > {c.b}** — {c.what}" + ("" if c.report else " (ours, not the report's)")
                          + "\n" for c in CLAIMS)
    one_seed = any(len(c["seeds"]) == 1 for c in claims)
    return ("# The report's claims, tested\n\n"
            "Each claim says that row a scores higher than row b. *a − b* is the difference averaged over the "
            "seeds both rows ran with; the 95% interval is a paired, hierarchical bootstrap "
            f"({RESAMPLES} resamples): the seeds are resampled, then the evaluation pairs (within each STS "
            "subset; one resample for all the drawn seeds, which were scored on the same pairs), the same pairs "
            "for a and b. **supported**: the interval lies above 0; **contradicted**: "
            "below 0; **inconclusive**: it contains 0 (the difference is within the noise of this many seeds "
            "and pairs). *(report)*: the report's a − b on that metric (bert-base-uncased), where it has one. "
            "Marked *ours*: comparisons the report does not make. The two published ones compare each method at "
            "its paper's settings with the report's variant, where `objectives --preset published` ran in the same "
            "output directory; the lexical one compares Mirror-BERT's word encoder with its base, where `lexical` "
            "ran there (word-similarity metrics: `--lexical-dir`); the distillation one compares the distilled "
            "student with the MLM base, where `distill` ran there; three set the flow against BERT-whitening (Su "
            "et al. 2021), a linear map fitted in closed form on the same encoder's vectors: whitening has no "
            "randomness of its own, so its seeds are those of the encoder below it.\n\n"
            + claims_text + "\n"
            + (claims_table(claims) if claims else "No claim has both of its rows in this output directory yet.\n")
            + ("\nWith one seed an interval covers the noise of the evaluation pairs only, not that of training: "
               "run more seeds (--seeds) before reading a verdict as the method's.\n" if one_seed else "")
            + footer)


def claim_rows() -> list[Row]:
    """The rows the claims compare."""
    names = {n for c in CLAIMS for n in (c.a, c.b)}
    return [r for r in ROWS.values() if r.name in names]
