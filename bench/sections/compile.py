"""compile: torch.compile on and off, first-step (compile) time and the steady step-time ratio."""
from pathlib import Path

from harness import TrainerSteps, ds_config_file, interleaved_seconds, print_row, timed_step, trainer_settings

COLUMNS = [("model", "{}"), ("dtype", "{}"), ("first_step_s", "{:.1f}"), ("eager_s", "{:.3f}"),
           ("compiled_s", "{:.3f}"), ("speedup", "{:.2f}")]


def measure(data, tmp, model, seq_len, micro_batch, dtypes, repeats):
    rows = []
    for dtype in dtypes:
        eager, compiled = (TrainerSteps(trainer_settings(data, Path(tmp) / f"compile_{dtype}_{on}", ds_config_file(tmp, dtype),
                                                model, seq_len, micro_batch, 1, compile=on))
                           for on in (False, True))
        first = timed_step(compiled)  # compiles
        eager_s, compiled_s = interleaved_seconds([eager, compiled], repeats)
        rows.append(dict(model=model, dtype=dtype, first_step_s=first, eager_s=eager_s, compiled_s=compiled_s,
                         speedup=eager_s / compiled_s))
        eager.close()
        compiled.close()
        print_row(rows[-1], COLUMNS)
    return rows
