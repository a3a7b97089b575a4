"""The experiment's phases, in the order they run; each module's `run(ctx, todo)` runs its stages.

    data      WMDP questions split into teacher-train and held-out
    teacher   Ray Train LoRA on the train split (and the positive control's letter teacher)
    numbers   teacher and base model continue number sequences through one Serve deployment
    arms      every arm x replicate trained side by side
    evaluate  every model scored on both splits, one service per base model
    report    report.json, report.md and the plots

jobs/experiment/stages.py declares every stage (its phase, what it reads, its upstream); a phase
is handed the stages the plan says must run (jobs/rundir/plan.py) and records
each one it finishes in the manifest (jobs/runtime/context.RunContext.record). A new phase is
a module here and its entry below.
"""

from jobs.phases import arms, data, evaluate, numbers, report, teacher

PHASES = {
    "data": data.run,
    "teacher": teacher.run,
    "numbers": numbers.run,
    "arms": arms.run,
    "evaluate": evaluate.run,
    "report": report.run,
}
