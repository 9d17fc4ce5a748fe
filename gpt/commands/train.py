"""train_ds.py's command line: a flag per field of gpt.config.settings.Settings (its default, help and range are
there), read into Settings. A malformed command line is one `error:` line and exit status 2, as any bad
training input."""
from gpt.console import Parser
from gpt.model.loss import LOSS_CHOICES, LOSS_HELP
from gpt.model.model import PRESETS
from gpt.config.settings import Settings, add_setting_arguments

MODEL_FLAGS = ("model", "n_layer", "n_embd", "n_head")  # gpt-plan takes them too
CHOICES = {"model": sorted(PRESETS), "loss": LOSS_CHOICES}
HELPS = {"loss": LOSS_HELP}  # each kernel's own words, from its registry


def build_parser():
    parser = Parser(description="Pretrain GPT-2 with DeepSpeed.", error_status=2)
    add_setting_arguments(parser, choices=CHOICES, helps=HELPS)
    return parser


def add_model_arguments(parser):
    """The model's shape flags, as the trainer takes them."""
    add_setting_arguments(parser, names=MODEL_FLAGS, choices=CHOICES)


def parse(argv=None):
    """The command line (sys.argv without argv) as Settings; a malformed flag exits 2 with one line."""
    return Settings.from_flags(**vars(build_parser().parse_args(argv)))
