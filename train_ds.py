"""Pretrain GPT-2 under the DeepSpeed engine.

    deepspeed --num_gpus 8 train_ds.py --ds_config ds_configs/zero1_bf16.json      # 8 GPUs
    python train_ds.py --model tiny --seq_len 128 --micro_batch 8 ...               # one process

The command line below (a flag per field of gpt/config/settings.py), then the trainer (gpt/train/trainer.py: the
run's start in gpt/train/start.py -> build -> resume -> fit). A malformed command line is one `error:` line and exit
status 2, as any bad training input.
"""
if __name__ == "__main__":  # first: importing torch and DeepSpeed takes seconds, and a stop then ends the run too
    from gpt.train.stop import StopRequest
    STOP = StopRequest()

from gpt.config.settings import Settings, add_setting_arguments  # noqa: E402
from gpt.console import Parser  # noqa: E402
from gpt.model.loss import LOSS_CHOICES, LOSS_HELP  # noqa: E402
from gpt.model.model import PRESETS  # noqa: E402


def build_parser():
    """A flag per setting, with the choices and help that the model's presets and the loss kernels' registry hold."""
    parser = Parser(description="Pretrain GPT-2 with DeepSpeed.", error_status=2)
    add_setting_arguments(parser, choices={"model": sorted(PRESETS), "loss": LOSS_CHOICES}, helps={"loss": LOSS_HELP})
    return parser


def parse(argv=None):
    """The command line (sys.argv without argv) as Settings; a malformed flag exits 2 with one line."""
    return Settings.from_flags(**vars(build_parser().parse_args(argv)))


def main(argv=None, stop=None):
    settings = parse(argv)  # --help and a bad flag answer before DeepSpeed is imported (and logs its accelerator)
    from gpt.train import trainer
    trainer.train(settings, stop)


if __name__ == "__main__":
    main(stop=STOP)
    from gpt.runtime.ranks import leave_process_group
    leave_process_group()  # here, not in main(): the tests' in-process runs share one group
