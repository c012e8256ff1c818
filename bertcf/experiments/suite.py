"""The experiments as a whole (``run_suite``): plan, run what is missing, evaluate every row, write
the outputs; or print the plan (``dry_run``). The command is ``bertcf.commands.experiments``."""
from __future__ import annotations

import time

from ..utils import environment
from ..utils.files import write_json_atomic
from . import finetuned
from .checks import BadFlags
from .claims import claim_rows, test_claims
from .execute import command_line, execute
from .options import SUITE_FILE, SUITE_KEYS
from .plan import Plan
from .planned import PlannedRun, now
from .report import (
    ABLATION_REFERENCES,
    LEXICAL_REFERENCES,
    REFERENCES,
    Report,
    settings_json,
    settings_md,
)
from .results import Evaluation


def run_suite(args, argv: list) -> dict:
    """Plan, run what is missing, evaluate every row, write the outputs (OUT locked)."""
    started = time.perf_counter()
    plan = Plan(args, argv)
    tasks = plan.runs()
    plan.preflight(tasks)
    settings = {k: getattr(args, k) for k in SUITE_KEYS}
    if args.saved_settings is not None and args.saved_settings != settings:
        print(f"note: {plan.out / SUITE_FILE} is updated with this command's settings", flush=True)
    write_json_atomic(plan.out / SUITE_FILE, {"settings": settings, "updated": now(),
                                              "environment": environment.collect(plan.device)})
    execute(plan, tasks)

    evaluation = Evaluation(plan)
    results = evaluation.rows(plan.rows, analysis="analysis" in plan.commands)
    own = [c for c in plan.commands if c in REFERENCES]  # objectives, supervised, distill: a table of their own
    references = ((ABLATION_REFERENCES if plan.ablation_rows else [])
                  + ([r for c in own for r in REFERENCES[c]] if plan.objective_rows else [])
                  + (LEXICAL_REFERENCES if plan.lexical_rows else []))
    results |= evaluation.rows([r for r in references if r.key not in results], analysis=False)
    results |= evaluation.rows([r for r in claim_rows() if r.key not in results], analysis=False)
    report = Report(plan.out, settings_md(plan), settings_json(plan), argv, plan.data_dir, evaluation.senteval_dir,
                    args.transfer, args.seed, plan.seeds, args.qualitative_pairs)
    claims = test_claims(results, plan.seeds, plan.data_dir)
    summary = {}
    if "table1" in plan.commands:
        summary["table1"] = report.table1(plan.table1_rows, results)
    if "ablations" in plan.commands:
        summary["ablations"] = report.ablations(plan.ablation_rows, results)
    for command in own:
        summary[command] = getattr(report, command)(plan.objective_rows, results)
    if "lexical" in plan.commands:
        summary["lexical"] = report.lexical(plan.lexical_rows, results, claims)
    if plan.finetune_rows:
        summary["finetuned"] = finetuned.write(report, plan.finetune_rows, results, claims)
    summary["claims"] = report.claims(claims)
    if "analysis" in plan.commands:
        summary["analysis"] = report.analysis(plan.table1_rows, results)
    wall = time.perf_counter() - started
    print(f"done in {wall:.0f} s: " + ", ".join(plan.rel(p) for p in report.outputs) + f" in {plan.out}", flush=True)
    return summary | {"outputs": report.outputs, "wall_s": wall}


def dry_run(plan: Plan, tasks: list[PlannedRun]) -> dict:
    """Print the plan and each run's command, then what is missing before it can run (inputs, runs
    on disk that cannot be used, bad flags); run nothing. A run that its command would refuse for
    its flags ends the dry run with that line (exit status 2)."""
    n = len(tasks)
    for i, task in enumerate(tasks, 1):
        state = {"done": "finished, would be reused", "resume": "would continue with --resume",
                 "restart": "would be cleared and started again", "new": "would run"}[task.state]
        print(f"[{i}/{n}] {task.label}: {task.description} [{state}]")
        if task.state != "done":
            print(f"    {command_line(task)}")
    rows = ", ".join(r.name for r in plan.rows)
    print(f"then: evaluate {rows} and write the {', '.join(plan.commands)} outputs into {plan.out}")
    found = plan.problems(tasks)
    problems = [str(p) for p in found]
    if problems:
        print("missing before this can run:\n" + "".join(f"  - {p}\n" for p in problems), end="")
    bad_flags = [p for p in found if isinstance(p, BadFlags)]
    if bad_flags:  # inputs can be fetched before the real run; flags would be refused as they are
        raise bad_flags[0]
    return {"tasks": [{"label": t.label, "kind": t.kind, "dir": str(t.dir), "state": t.state,
                       "command": command_line(t)} for t in tasks], "problems": problems}
