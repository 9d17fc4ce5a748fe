"""Run by tests/integration/test_probe.py on 2 CPU ranks (in the shared launch of conftest's two_rank_runs): the trainer's
own setup -> probe -> build -> one step with --micro_batch auto, the probe called directly (the trainer probes
only on a GPU) and the fused loss running out of memory above LIMITS[rank] sequences: a GPU allocator's limit,
simulated.
Each rank writes its figures to <out_dir>/probe_rank<N>.json (the ranks' stdout lines can interleave)."""
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

from gpt.model import loss as losses
from gpt.train import start
from gpt.train.trainer import Trainer
from train_ds import parse
from gpt.model.model import GPT

LIMITS = {0: 12, 1: 6}  # sequences per rank; rank 1 runs out first, in the forward pass


def main(argv=None):
    argv = argv or sys.argv[1:]
    settings = parse([a for a in argv if not a.startswith("--local_rank")])  # the launcher adds it
    limit, real_kernel_for = LIMITS[int(os.environ["RANK"])], losses.kernel_for

    def limited_kernel_for(loss, device_type, precision):
        kernel = real_kernel_for(loss, device_type, precision)

        def limited(hidden, weight, targets, vocab):
            if hidden.shape[0] > limit * settings.data.seq_len:
                raise torch.OutOfMemoryError(f"simulated: over {limit} sequences")
            return kernel.function(hidden, weight, targets, vocab)
        return dataclasses.replace(kernel, function=limited, compiled=None)

    losses.kernel_for = limited_kernel_for  # what gpt.train.engine.wrap calls
    try:
        prepared = start.setup(settings)
        planned = prepared.settings.data.micro_batch
        run = Trainer(start.probe(prepared))
    finally:
        losses.kernel_for = real_kernel_for  # for the runs after this one in the same process
    torch.manual_seed(settings.run.seed)
    unprobed_weights = GPT(prepared.model_config).state_dict()
    same_init = all(torch.equal(unprobed_weights[k], v) for k, v in run.model.state_dict().items())
    loss = run.step(0)
    rank = run.engine.global_rank
    (Path(settings.run.out_dir) / f"probe_rank{rank}.json").write_text(json.dumps({"rank": rank, "planned": planned, "micro_batch": run.settings.data.micro_batch,
                      "grad_accum": run.grad_accum, "engine_micro_batch": run.engine.train_micro_batch_size_per_gpu(),
                      "same_init": same_init, "loss": loss}))


if __name__ == "__main__":
    main()
