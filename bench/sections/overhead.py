"""overhead and mfu: the trainer's step against a plain PyTorch AdamW step, same model, initial weights, data and
dtype, 1 process (on a GPU also both compiled); MFU against the matmul peak."""
from pathlib import Path

from harness import PlainPyTorch, TrainerSteps, ds_config_file, interleaved_seconds, print_row, trainer_settings


COLUMNS = [("model", "{}"), ("dtype", "{}"), ("compiled", "{}"), ("tokens_per_step", "{}"),
           ("plain_s", "{:.3f}"), ("trainer_s", "{:.3f}"), ("ratio", "{:.3f}"), ("tflops", "{:.3f}"),
           ("mfu", "{:.2f}"), ("plain_mfu", "{:.2f}"), ("tokens_per_s", "{:.0f}"),
           ("plain_tokens_per_s", "{:.0f}")]


def measure(data, tmp, models, dtypes, compiles, repeats, peaks):
    rows = []
    for model, seq_len, micro_batch, accum in models:
        for dtype in dtypes:
            for compiled in compiles:
                name = f"{model}_{dtype}{'_compiled' if compiled else ''}"
                settings = trainer_settings(data, Path(tmp) / name, ds_config_file(tmp, dtype), model, seq_len,
                                            micro_batch, accum, compile=compiled)
                trainer = TrainerSteps(settings)
                plain = PlainPyTorch(trainer.settings, trainer.config, dtype, compile=compiled)
                ds_seconds, plain_seconds = interleaved_seconds([trainer, plain], repeats)
                flops = trainer.model.flops_per_token(seq_len) * settings.data.total_batch_tokens
                mfu = (lambda seconds: flops / seconds / peaks[dtype]) if peaks[dtype] else (lambda seconds: None)
                rows.append(dict(model=model, dtype=dtype, compiled=compiled, tokens_per_step=settings.data.total_batch_tokens,
                                 plain_s=plain_seconds, trainer_s=ds_seconds, ratio=ds_seconds / plain_seconds,
                                 tflops=flops / ds_seconds / 1e12, mfu=mfu(ds_seconds), plain_mfu=mfu(plain_seconds),
                                 tokens_per_s=settings.data.total_batch_tokens / ds_seconds,
                                 plain_tokens_per_s=settings.data.total_batch_tokens / plain_seconds))
                trainer.close()
                plain.close()
                print_row(rows[-1], COLUMNS)
    return rows
