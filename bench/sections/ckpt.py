"""ckpt: activation checkpointing off and on, step-time ratio and the activation bytes saved."""
from pathlib import Path

from harness import TrainerSteps, ds_config_file, interleaved_seconds, print_row, trainer_settings
from gpt.memory.footprint import measure_activation_bytes

COLUMNS = [("model", "{}"), ("dtype", "{}"), ("tokens", "{}"), ("off_s", "{:.3f}"), ("on_s", "{:.3f}"),
           ("time_ratio", "{:.2f}"), ("activations_off", "{:,}"), ("activations_on", "{:,}"),
           ("bytes_saved", "{:.0%}")]


def measure(data, tmp, model, seq_len, micro_batch, dtypes, repeats):
    rows = []
    for dtype in dtypes:
        trainers = [TrainerSteps(trainer_settings(data, Path(tmp) / f"ckpt_{dtype}_{on}", ds_config_file(tmp, dtype, checkpointing=on),
                                         model, seq_len, micro_batch, 1)) for on in (False, True)]
        off_s, on_s = interleaved_seconds(trainers, repeats)
        config = trainers[0].config
        off_bytes, on_bytes = (measure_activation_bytes(config, micro_batch, seq_len, dtype, on) for on in (False, True))
        rows.append(dict(model=model, dtype=dtype, tokens=micro_batch * seq_len, off_s=off_s, on_s=on_s,
                         time_ratio=on_s / off_s, activations_off=off_bytes, activations_on=on_bytes,
                         bytes_saved=1 - on_bytes / off_bytes))
        for trainer in trainers:
            trainer.close()
        print_row(rows[-1], COLUMNS)
    return rows
