"""Pretrain GPT-2 under the DeepSpeed engine.

    deepspeed --num_gpus 8 train_ds.py --ds_config ds_configs/zero1_bf16.json      # 8 GPUs
    python train_ds.py --model tiny --seq_len 128 --micro_batch 8 ...               # one process

The command line (gpt/config.py) and the trainer (gpt/trainer.py: setup -> build -> resume -> fit).
"""
from gpt import trainer
from gpt.config import parse


def main(argv=None):
    trainer.main(parse(argv))


if __name__ == "__main__":
    main()
