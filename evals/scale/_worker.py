"""One ``--workers`` worker: runs its shard of the plan in this process, says how it ended.

A forked worker calls :func:`work`; a worker started as a fresh interpreter (where forking is
not safe) runs this module with the pickled plan's path.
"""

from __future__ import annotations

import pickle
import sys

from twice.mocks import RunError, TwiceError
from twice.reports import LogReadError, Shard
from twice.tasks import remember_command_secrets, scrub

from ..run import EXIT_INTERRUPTED, LAST_INTERRUPT, batch_gc, run_suite
from ..suite import parse_shard
from ._hand_off import save_records, stop_with_parent
from ._plan import WorkerOutcome, WorkerPlan


def work(plan: WorkerPlan, shard: Shard, outcome: str, records: str) -> int:
    """Run ``shard`` of ``plan`` into ``plan.log_dir``; write the outcome to ``outcome`` and
    what was read of the logs to ``records`` (for the parent's merge).

    Returns:
        The worker's exit code: 0 done, 1 something failed (the outcome says what), 2 the
        plan was refused, 130/143 stopped by SIGINT/SIGTERM.
    """
    batch_gc()
    try:
        result = run_suite(
            plan.suite,
            plan.log_dir,
            shard=shard,
            model_args=plan.model_args,
            max_connections=plan.max_connections,
            display=plan.display,
            report=False,  # the parent renders the one merged report
            timeout=plan.timeout,
            max_retries=plan.max_retries,
            keep_records=lambda found: save_records(records, found),
        )
    except LogReadError as ex:  # its own logs, read back: the run failed, not its input
        said = WorkerOutcome(RunError.exit_code, (scrub(str(ex)),))
    except TwiceError as ex:
        said = WorkerOutcome(ex.exit_code, (scrub(str(ex)),))
    except KeyboardInterrupt:
        name = LAST_INTERRUPT.signal or "SIGINT"
        said = WorkerOutcome(EXIT_INTERRUPTED.get(name, 130), (f"interrupted by {name}",))
    else:
        errors = [*result.unreachable, *result.failed]
        if result.missing:
            errors.append(f"{len(result.missing)} cell(s) did not finish")
        said = WorkerOutcome(result.exit_code, tuple(errors))
    said.write(outcome)
    return said.code


def main(argv: list[str]) -> int:
    """``python -m twice.evals.scale._worker PLAN SHARD OUTCOME RECORDS``."""
    stop_with_parent()
    plan_path, shard, outcome, records = argv
    with open(plan_path, "rb") as f:
        plan: WorkerPlan = pickle.load(f)  # written by this run's parent, into a 0700 dir
    if plan.suite.agent_cmd:
        # What the parent learnt while parsing the command line, this interpreter has not.
        remember_command_secrets(plan.suite.agent_cmd)
    return work(plan, parse_shard(shard), outcome, records)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
