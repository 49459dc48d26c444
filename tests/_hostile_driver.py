"""`distillery` with a slowed teacher fine-tuning, for the two-process tests of test_hostile_machine.py.

    python tests/_hostile_driver.py GO STEP_DELAY ARGS...

GO: a file whose appearance the teacher's fine-tuning waits for before it starts ("-": none; the
cache entry and the run folder are locked by then), announced by a line "FINE-TUNING" on stderr. STEP_DELAY: seconds each training
step takes once a first checkpoint was written, announced by "CHECKPOINTED" (a signal sent then
lands mid-training with a checkpoint to resume from). ARGS: the command line after `distillery`.
"""

import os
import sys
import time

import distillery.training.trainer as trainer
import distillery.teacher as teacher
from distillery import cli


def main() -> None:
    go, step_delay, args = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    checkpointed = []
    finetune, save_last, lm_task_loss = teacher.finetune, trainer.save_last, teacher.lm_task_loss

    def slow_finetune(*a, **k):
        print("FINE-TUNING", file=sys.stderr, flush=True)
        deadline = time.time() + 300
        while go != "-" and not os.path.exists(go) and time.time() < deadline:
            time.sleep(0.05)
        return finetune(*a, **k)

    def announced_save_last(*a, **k):
        save_last(*a, **k)
        if not checkpointed:
            checkpointed.append(True)
            print("CHECKPOINTED", file=sys.stderr, flush=True)

    def slow_loss(task):
        loss_fn = lm_task_loss(task)

        def slow(model, batch):
            if checkpointed:
                time.sleep(step_delay)
            return loss_fn(model, batch)

        return slow

    teacher.finetune, trainer.save_last, teacher.lm_task_loss = slow_finetune, announced_save_last, slow_loss
    sys.argv = ["distillery", *args]
    cli.main()


if __name__ == "__main__":
    main()
