"""speed: the trainer's tokens/s and MFU, eager and compiled, --loss fused and classic, each against one plain
PyTorch loop, steps interleaved."""
from pathlib import Path

from harness import PlainPyTorch, TrainerSteps, ds_config_file, interleaved_seconds, print_row, trainer_settings
from gpt.train.engine import forget_compiled_code

COLUMNS = [("model", "{}"), ("dtype", "{}"), ("compiled", "{}"), ("loss", "{}"), ("micro_batch", "{}"),
           ("grad_accum", "{}"), ("tokens_per_s", "{:.0f}"), ("mfu", "{:.3f}"), ("plain_tokens_per_s", "{:.0f}"),
           ("plain_mfu", "{:.3f}"), ("ratio_to_plain", "{:.3f}")]


def measure(data, tmp, dtype, peaks, model, seq_len, micro_batch, grad_accum, compiles, repeats):
    """The trainer's speed: tokens/s and MFU, eager and compiled (`compiles`), --loss fused and classic, each
    variant's steps interleaved with one plain PyTorch loop built once (compiled if any variant is), so that
    every variant is measured against the same baseline."""
    config, rows, plain = ds_config_file(tmp, dtype), [], None
    forget_compiled_code()  # whatever an earlier section compiled
    for compiled in compiles:
        for loss in ("fused", "classic"):
            settings = trainer_settings(data, Path(tmp) / f"speed_{loss}_{'compiled' if compiled else 'eager'}", config,
                                        model, seq_len, micro_batch, grad_accum, compile=compiled, loss=loss)
            trainer = TrainerSteps(settings)
            if plain is None:
                plain = PlainPyTorch(trainer.settings, trainer.config, dtype, compile=any(compiles))
            trainer_s, plain_s = interleaved_seconds([trainer, plain], repeats)
            flops = trainer.model.flops_per_token(seq_len) * settings.data.total_batch_tokens
            trainer.close()
            rows.append(dict(model=model, dtype=dtype, compiled=compiled, loss=loss, micro_batch=micro_batch,
                             grad_accum=grad_accum, tokens_per_step=settings.data.total_batch_tokens,
                             tokens_per_s=settings.data.total_batch_tokens / trainer_s,
                             mfu=flops / trainer_s / peaks[dtype] if peaks[dtype] else None,
                             plain_compiled=any(compiles), plain_tokens_per_s=settings.data.total_batch_tokens / plain_s,
                             plain_mfu=flops / plain_s / peaks[dtype] if peaks[dtype] else None,
                             ratio_to_plain=plain_s / trainer_s))
            print_row(rows[-1], COLUMNS)
    plain.close()
    return rows
