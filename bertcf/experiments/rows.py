"""What the experiments train: the report's rows (table 1, the ablations, the other objectives)
and the pretraining runs behind them, with their steps. Beside the report's rows: BERT-whitening
(``--stage whiten``) of the base and of the Mirror encoder, the closed-form control for the flow."""
from __future__ import annotations

from dataclasses import dataclass

#: The methods that train on labelled files (--train-file), not on the pretraining corpus.
LABELLED_METHODS = ("sbert-softmax", "sbert-cosine", "simcse-sup")
#: The report's steps per stage; ``--steps-scale`` multiplies them.
REPORT_STEPS = {"mirror": 10_000, "joint": 10_000, "flow": 10_000, "multitask": 5000}


@dataclass(frozen=True)
class Pretraining:
    """One run of ``run_pretrain.py`` (any --stage) in OUT/stages/<name>."""
    name: str
    stage: str              # its --stage: mirror | joint | flow | supervised | whiten
    method: str
    init: str | None        # another Pretraining's name, or None for --model
    flags: tuple = ()
    what: str = ""
    preset: str | None = None  # run_pretrain.py --preset: the method as published (its length included)
    from_config: bool = False  # starts from --config's random weights (as the MLM base), not --model
    words: bool = False        # trained on its preset's word list, not the sentence corpus (a lexical encoder)

    @property
    def reads_corpus(self) -> bool:
        """Whether the run trains on the pretraining corpus (--corpus, --corpus-from-tasks): not a
        lexical encoder (its word list) nor a method of labelled pairs (--train-file)."""
        return not self.words and self.method not in LABELLED_METHODS


PRETRAININGS = {s.name: s for s in (
    Pretraining("simcse", "mirror", "simcse", None, what="SimCSE pretraining (dropout only)"),
    Pretraining("mirror", "mirror", "mirror", None, what="Mirror-BERT pretraining (dropout + span masking)"),
    Pretraining("flow", "flow", "flow", None, what="flow on L_flow alone, encoder frozen"),
    Pretraining("bertcf", "joint", "mirror", "mirror", what="joint flow + 0.3 L_mirror, encoder frozen"),
    Pretraining("simcse-joint", "joint", "simcse", "simcse", what="joint flow + 0.3 L_simcse, encoder frozen"),
    Pretraining("minbert-joint", "joint", "mirror", None, ("--unfreeze-encoder",),
                what="joint flow + 0.3 L_mirror, encoder unfrozen"),
    Pretraining("mirror-flow", "flow", "flow", "mirror", what="flow on L_flow alone (no regulariser)"),
    # BERT-whitening (Su et al. 2021), the closed-form control for the flow: no training, no randomness
    Pretraining("minbert-whitening", "whiten", "whitening", None,
                what="BERT-whitening of --model, fitted in closed form on the corpus"),
    Pretraining("mirror-whitening", "whiten", "whitening", "mirror",
                what="BERT-whitening of the Mirror encoder, fitted in closed form on the corpus"),
    Pretraining("bsl", "mirror", "bsl", None, what="BSL: BYOL-style bootstrapping to an EMA target, no negatives"),
    Pretraining("ct", "mirror", "ct", None, what="Contrastive Tension: two encoder copies, pair dot products, BCE"),
    Pretraining("tsdae", "mirror", "tsdae", None,
                what="TSDAE: rebuild the sentence from one vector after token deletion"),
    Pretraining("mlm", "mirror", "mlm", None, what="masked language modelling"),
    # objectives --preset published: each method at its paper's settings (bertcf.objectives.presets)
    Pretraining("simcse-published", "mirror", "simcse", None, what="SimCSE as published", preset="simcse-unsup"),
    Pretraining("mirror-published", "mirror", "mirror", None, what="Mirror-BERT as published", preset="mirror-bert"),
    Pretraining("bsl-published", "mirror", "bsl", None, what="BSL as published", preset="bsl"),
    Pretraining("ct-published", "mirror", "ct", None, what="Contrastive Tension as published", preset="ct"),
    Pretraining("tsdae-published", "mirror", "tsdae", None, what="TSDAE as published", preset="tsdae"),
    # lexical: Mirror-BERT's word encoder (its 10k most frequent words, dropout only, [CLS], 2 epochs)
    Pretraining("mirror-lexical", "mirror", "mirror", None, what="Mirror-BERT's lexical encoder, on words",
                preset="mirror-bert-lexical", words=True),
    # supervised: trained on labelled data (--nli; the STS train file of --data-dir) at the papers' settings
    Pretraining("sbert-nli", "supervised", "sbert-softmax", None, preset="sbert-nli",
                what="SBERT-NLI: softmax classifier on [u; v; |u - v|] of the NLI pairs, one epoch"),
    Pretraining("simcse-sup", "supervised", "simcse-sup", None, preset="simcse-sup",
                what="supervised SimCSE: NLI triples, the contradiction a hard negative, three epochs"),
    Pretraining("sbert-nli-sts", "supervised", "sbert-cosine", "sbert-nli", preset="sbert-sts",
                what="SBERT-NLI, then cosine regression on the CS224N STS train split (holds STS-B test pairs)"),
    # distill: a student from --config's random weights learns --teacher's vectors of the corpus
    Pretraining("distill", "supervised", "distill", None, from_config=True,
                what="distillation: MSE to --teacher's vectors of the corpus, student from --config"),
)}


@dataclass(frozen=True)
class Row:
    name: str                # as in the report
    key: str                 # directory-safe name
    pretraining: str | None  # the Pretraining whose best/ is the row's encoder; None: --model itself


TABLE1_ROWS = (Row("MinBERT", "minbert", None), Row("MinBERT-SimCSE", "simcse", "simcse"),
               Row("MinBERT-Mirror", "mirror", "mirror"), Row("MinBERT-flow", "flow", "flow"),
               Row("MinBERT-whitening", "minbert-whitening", "minbert-whitening"),
               Row("BERT-CF", "bertcf", "bertcf"))
ABLATION_ROWS = (Row("SimCSE-joint", "simcse-joint", "simcse-joint"),
                 Row("MinBERT-joint", "minbert-joint", "minbert-joint"),
                 Row("Mirror-flow", "mirror-flow", "mirror-flow"),
                 Row("Mirror-whitening", "mirror-whitening", "mirror-whitening"))
OBJECTIVE_ROWS = (Row("MinBERT-BSL", "bsl", "bsl"), Row("MinBERT-CT", "ct", "ct"),
                  Row("MinBERT-TSDAE", "tsdae", "tsdae"), Row("MinBERT-MLM", "mlm", "mlm"))
#: objectives --preset published: every method at its paper's settings (MLM has no preset).
PUBLISHED_ROWS = (Row("SimCSE (published)", "simcse-published", "simcse-published"),
                  Row("Mirror-BERT (published)", "mirror-published", "mirror-published"),
                  Row("BSL (published)", "bsl-published", "bsl-published"),
                  Row("CT (published)", "ct-published", "ct-published"),
                  Row("TSDAE (published)", "tsdae-published", "tsdae-published"), OBJECTIVE_ROWS[-1])
#: lexical: Mirror-BERT's word encoder trained from --model (the base is MinBERT, --model itself).
LEXICAL_ROWS = (Row("Mirror-BERT (lexical)", "mirror-lexical", "mirror-lexical"),)
#: supervised: SBERT's and SimCSE's supervised recipes from --model (or the MLM base).
SUPERVISED_ROWS = (Row("SBERT-NLI", "sbert-nli", "sbert-nli"), Row("SimCSE-sup", "simcse-sup", "simcse-sup"),
                   Row("SBERT-NLI then STS", "sbert-nli-sts", "sbert-nli-sts"))
#: distill: the student, beside the teacher and the MLM base of the same size (MinBERT there).
DISTILL_ROWS = (Row("Distilled student", "distill", "distill"),)
TEACHER_ROW = Row("Teacher", "teacher", None)  # --teacher itself, untouched
ROW_OF_PRETRAINING = {r.pretraining: r for r in TABLE1_ROWS + ABLATION_ROWS + OBJECTIVE_ROWS + PUBLISHED_ROWS
                      + LEXICAL_ROWS + SUPERVISED_ROWS + DISTILL_ROWS if r.pretraining}

#: mlm-base: MLM pretraining from random weights (--config), whose best/ is then every row's
#: --model; batch 64, lr 5e-4 with a linear warm-up over the first tenth of the steps and a
#: linear decay, 15% masking (80/10/10), the head tied to the word embeddings.
MLM_BASE = Pretraining("mlm-base", "mirror", "mlm", None, what="masked language modelling from random weights")
RANDOM_ROW = Row("Random weights", "random", None)  # mlm-base: the --config encoder itself, untrained


def mlm_base_flags(steps: int) -> list[str]:
    """The base's best/ is chosen by held-out masked-token accuracy: MLM lowers STS at first (the
    anisotropy the report describes), so STS would keep the random step 0."""
    return ["--batch-size", "64", "--lr", "5e-4", "--lr-schedule", "linear", "--warmup-steps", str(max(1, steps // 10)),
            "--select-on", "mlm-heldout"]


def distill_flags(steps: int) -> list[str]:
    """The distilled student trains as the MLM base does (batch 64, lr 5e-4, warm-up over the first
    tenth, linear decay), for as many steps: the two students differ in their objective only."""
    return ["--batch-size", "64", "--lr", "5e-4", "--lr-schedule", "linear", "--warmup-steps", str(max(1, steps // 10))]


def steps_for(stage: str, scale: float) -> int:
    return max(1, round(REPORT_STEPS[stage] * scale))


def is_whitening(row: Row) -> bool:
    """A row fitted in closed form (``--stage whiten``): no steps, no randomness of its own."""
    return row.pretraining is not None and PRETRAININGS[row.pretraining].stage == "whiten"
