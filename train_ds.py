"""Pretrain GPT-2 under the DeepSpeed engine.

    deepspeed --num_gpus 8 train_ds.py --ds_config ds_configs/zero1_bf16.json      # 8 GPUs
    python train_ds.py --model tiny --seq_len 128 --micro_batch 8 ...               # one process

Phases, top-down: parse -> setup -> build -> fit.
"""
import sys
import time
from dataclasses import dataclass

import torch

from gpt import engine as ds_engine
from gpt.config import ConfigError, build_parser, precision, validate
from gpt.data import ShuffledTokenLoader, ValidationSet, find_shards
from gpt.evaluate import sample, validation_loss
from gpt.metrics import MetricsLogger, flops_per_token, peak_flops
from gpt.model import GPT
from gpt.tokenizer import gpt2_tokenizer

SAMPLE_PROMPT = "\n"  # a fresh line: the model writes whatever it has learned to write


@dataclass
class Run:
    """Everything fit() needs, built once."""
    engine: object
    model: GPT
    train_loader: ShuffledTokenLoader
    val_set: ValidationSet
    logger: MetricsLogger
    device: torch.device
    world_size: int
    grad_accum: int
    flops_per_step: float
    peak_flops: float


def setup(args):
    """Validate every setting before any process group exists, then join the process group."""
    world_size = ds_engine.launched_world_size()
    try:
        ds_config, model_config, grad_accum = validate(args, world_size)
    except ConfigError as e:
        if ds_engine.launched_rank() == 0:
            print(f"error: {e}".replace("\n", "\nerror: "), file=sys.stderr)
        sys.exit(2)
    device = ds_engine.setup_distributed(allow_cpu_fp16=args.cpu_fp16 and precision(ds_config) == "fp16")
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    return ds_config, model_config, grad_accum, device


def build(args, ds_config, model_config, grad_accum, device):
    model = GPT(model_config)
    engine = ds_engine.initialize(model, args, ds_config, grad_accum)
    if args.compile:
        engine.compile()
    rank, world_size = ds_engine.rank(), ds_engine.world_size()
    train_loader = ShuffledTokenLoader(find_shards(args.data, "train"), args.micro_batch, args.seq_len, rank,
                                       world_size, seed=args.seed, pin_memory=device.type == "cuda")
    val_set = ValidationSet(find_shards(args.data, "val"), args.seq_len, args.val_tokens // args.seq_len,
                            args.micro_batch, rank, world_size)
    n_params = model.num_params() - model.transformer.wpe.weight.numel()  # wpe is a lookup, not a matmul
    peak, peak_label = peak_flops(device.type, precision(ds_config))
    logger = MetricsLogger(args.out_dir, enabled=rank == 0)
    if rank == 0:
        print(f"model {args.model}: {model.num_params() / 1e6:.2f}M parameters, {model_config}")
        print(f"{precision(ds_config)}, ZeRO {engine.zero_optimization_stage()}, {world_size} rank(s) x "
              f"micro_batch {args.micro_batch} x seq_len {args.seq_len} x grad_accum {grad_accum} "
              f"= {args.total_batch_tokens:,} tokens/step; MFU against {peak_label}")
        print(f"data {args.data}: {len(train_loader.shards)} train shard(s), {sum(train_loader.batches_per_shard):,} "
              f"batches/epoch per rank; validation on {len(val_set)} sequences of {args.seq_len} tokens")
    return Run(engine, model, train_loader, val_set, logger, device, world_size, grad_accum,
               flops_per_token(model_config, n_params, args.seq_len) * args.total_batch_tokens, peak)


def train_step(run):
    """One optimizer step = grad_accum micro-steps. Returns the loss averaged over micro-steps and ranks."""
    loss_sum = torch.zeros((), device=run.device)
    for _ in range(run.grad_accum):
        x, y = run.train_loader.next_batch()
        _, loss = run.engine(x.to(run.device, non_blocking=True), y.to(run.device, non_blocking=True))
        run.engine.backward(loss)
        run.engine.step()  # DeepSpeed steps the optimizer only at the accumulation boundary
        loss_sum += loss.detach()  # stays on device: no host sync per micro-step
    return ds_engine.mean_over_ranks(loss_sum).item() / run.grad_accum


def log_samples(args, run, step):
    tokenizer = gpt2_tokenizer()
    generator = torch.Generator().manual_seed(args.seed + run.engine.global_rank)  # private: training RNG untouched
    tokens = sample(run.model, tokenizer.encode_ordinary(SAMPLE_PROMPT), args.sample_tokens, generator, run.device)
    print(f"[rank {run.engine.global_rank}] sample at step {step}: {tokenizer.decode(tokens)!r}", flush=True)


def fit(args, run):
    tokens_per_step = args.total_batch_tokens
    for step in range(args.max_steps):
        last = step == args.max_steps - 1
        lr = run.engine.get_lr()[0]
        start = time.perf_counter()
        loss = train_step(run)
        dt = time.perf_counter() - start
        stats = ds_engine.step_stats(run.engine)
        metrics = dict(loss=loss, lr=lr, dt=dt, tokens_per_s=tokens_per_step / dt, **stats)
        if run.peak_flops:
            metrics["mfu"] = run.flops_per_step / dt / (run.peak_flops * run.world_size)
        run.logger.log(step, metrics, console=f"step {step:5d} | " + " | ".join(
            f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()))
        if args.val_every and (step % args.val_every == 0 or last):
            val = validation_loss(run.engine, run.val_set, run.device)
            run.logger.log(step, {"val_loss": val}, console=f"step {step:5d} | val_loss {val:.4f}")
        if args.sample_every and (step % args.sample_every == 0 or last) and run.engine.global_rank == 0:
            log_samples(args, run, step)
    run.train_loader.close()
    run.logger.close()


def main(argv=None):
    args = build_parser().parse_args(argv)
    ds_config, model_config, grad_accum, device = setup(args)
    run = build(args, ds_config, model_config, grad_accum, device)
    fit(args, run)


if __name__ == "__main__":
    main()
