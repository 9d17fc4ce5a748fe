"""Pretrain GPT-2 under the DeepSpeed engine.

    deepspeed --num_gpus 8 train_ds.py --ds_config ds_configs/zero1_bf16.json      # 8 GPUs
    python train_ds.py --model tiny --seq_len 128 --micro_batch 8 ...               # one process

The command line (gpt/commands/train.py, from gpt/config/settings.py) and the trainer (gpt/train/trainer.py: setup, with
gpt/train/preflight.py's checks -> build -> resume -> fit).
"""
if __name__ == "__main__":  # first: importing torch and DeepSpeed takes seconds, and a stop then ends the run too
    from gpt.train.stop import StopRequest
    STOP = StopRequest()

from gpt.commands.train import parse  # noqa: E402


def main(argv=None, stop=None):
    settings = parse(argv)  # --help and a bad flag answer before DeepSpeed is imported (and logs its accelerator)
    from gpt.train import trainer
    trainer.train(settings, stop)


if __name__ == "__main__":
    main(stop=STOP)
    from gpt.runtime.ranks import leave_process_group
    leave_process_group()  # here, not in main(): the tests' in-process runs share one group
