"""Pretrain GPT-2 under the DeepSpeed engine.

    deepspeed --num_gpus 8 train_ds.py --ds_config ds_configs/zero1_bf16.json      # 8 GPUs
    python train_ds.py --model tiny --seq_len 128 --micro_batch 8 ...               # one process

Phases, top-down: parse -> setup -> build -> resume -> fit.
"""
import signal
import sys
import time
from dataclasses import asdict, dataclass

import torch

from gpt import checkpoint, hardware, hellaswag
from gpt import dist
from gpt import engine as ds_engine
from gpt.config import ConfigError, build_parser, resolve_auto_micro_batch, resolve_defaults, validate
from gpt.ds_config import precision, zero_stage
from gpt.data import ShuffledTokenLoader, ValidationSet, find_shards
from gpt.evaluate import sample, validation_loss
from gpt.guard import SpikeGuard, install_grad_norm_hook
from gpt.hf import load_hf_weights
from gpt.metrics import MetricsLogger, peak_flops
from gpt.model import GPT
from gpt.optim import OptimizerSettings
from gpt.profiling import step_profiler
from gpt.tokenizer import gpt2_tokenizer

SAMPLE_PROMPT = "\n"  # a fresh line: the model writes whatever it has learned to write
LOSS_SCALE_AT_MINIMUM = "Current loss scale already at minimum"


@dataclass
class Run:
    """Everything fit() needs, built once."""
    engine: object
    model: GPT
    train_loader: ShuffledTokenLoader
    val_set: ValidationSet
    logger: MetricsLogger
    guard: SpikeGuard
    guard_active: bool
    device: torch.device
    world_size: int
    grad_accum: int
    flops_per_step: float
    peak_flops: float
    run_config: dict
    hellaswag_examples: list


def print0(*args, **kwargs):
    """Print from rank 0 only; works before the process group exists too."""
    if dist.launched_rank() == 0:
        print(*args, **kwargs, flush=True)


def fail(message, code=2):
    """One clear message (from rank 0) and a non-zero exit, on every rank."""
    if dist.launched_rank() == 0:
        print(f"error: {message}".replace("\n", "\nerror: "), file=sys.stderr, flush=True)
    sys.exit(code)


def run_config_of(args, ds_config, model_config, world_size):
    """What a checkpoint records about the run that wrote it."""
    return {"model": asdict(model_config), "precision": precision(ds_config),
            "zero_stage": zero_stage(ds_config), "world_size": world_size,
            "args": {k: v for k, v in vars(args).items() if k != "local_rank"}}


def setup(args):
    """Validate every setting and the checkpoint to resume from before any process group exists, then
    join the process group."""
    world_size = dist.launched_world_size()
    device_type = dist.device_type()
    try:
        for note in resolve_defaults(args, device_type):
            print0(note)
        if args.micro_batch == "auto":
            plan = resolve_auto_micro_batch(args, world_size, device_type)
            if dist.launched_rank() == 0:
                print(plan, flush=True)
        ds_config, model_config, grad_accum = validate(args, world_size)
        run_config = run_config_of(args, ds_config, model_config, world_size)
        resume_from = checkpoint.find_checkpoint(args.resume, args.out_dir) if args.resume else None
        if resume_from is not None:
            checkpoint.check_compatible(resume_from, checkpoint.read_run_config(resume_from), run_config)
        examples = hellaswag.load(args.hellaswag) if args.hellaswag else []
    except (ConfigError, checkpoint.CheckpointError, hellaswag.HellaSwagError) as e:
        fail(e)
    if device_type == "cuda":
        arch_note = hardware.fix_cuda_arch_list()  # every rank, before DeepSpeed JIT-builds FusedAdam
        if arch_note:
            print0(arch_note)
    elif precision(ds_config) == "bf16" and dist.launched_rank() == 0:
        warning = hardware.cpu_bf16_warning()
        if warning:
            print(warning, file=sys.stderr, flush=True)
    if args.deterministic:
        hardware.make_deterministic(device_type)
    device = dist.setup_distributed(allow_cpu_fp16=args.cpu_fp16 and precision(ds_config) == "fp16")
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    return ds_config, model_config, grad_accum, device, run_config, resume_from, examples


def build(args, ds_config, model_config, grad_accum, device, run_config, examples):
    model = GPT(model_config)
    if args.init_from:
        model.load_state_dict(load_hf_weights(args.init_from, model_config))
        print0(f"initial weights from {args.init_from}")
    optimizer = OptimizerSettings(args.lr, args.weight_decay, args.warmup_steps, args.max_steps, args.min_lr_ratio)
    engine = ds_engine.initialize(model, ds_config, args.micro_batch, grad_accum, optimizer)
    if args.compile:
        engine.compile()
    rank, world_size = dist.rank(), dist.world_size()
    train_loader = ShuffledTokenLoader(find_shards(args.data, "train"), args.micro_batch, args.seq_len, rank,
                                       world_size, seed=args.seed, pin_memory=device.type == "cuda")
    val_set = ValidationSet(find_shards(args.data, "val"), args.seq_len, args.val_tokens // args.seq_len,
                            args.micro_batch, rank, world_size)
    guard = SpikeGuard(args.skip_loss_z, args.skip_grad_z, max_bad_steps=args.max_bad_steps,
                       fp16=precision(ds_config) == "fp16")
    guard_active = install_grad_norm_hook(engine, guard)
    peak, peak_label = peak_flops(device.type, precision(ds_config))
    logger = MetricsLogger(args.out_dir, enabled=rank == 0)
    print0(f"model {args.model}: {model.num_params() / 1e6:.2f}M parameters, {model_config}")
    print0(f"{precision(ds_config)}, ZeRO {engine.zero_optimization_stage()}, "
           f"{type(engine.optimizer).__name__} over {type(engine.basic_optimizer).__name__}, {world_size} rank(s) x "
           f"micro_batch {args.micro_batch} x seq_len {args.seq_len} x grad_accum {grad_accum} "
           f"= {args.total_batch_tokens:,} tokens/step; MFU against {peak_label}")
    print0(f"data {args.data}: {len(train_loader.shards)} train shard(s), {sum(train_loader.batches_per_shard):,} "
           f"batches/epoch per rank; validation on {len(val_set)} sequences of {args.seq_len} tokens")
    return Run(engine, model, train_loader, val_set, logger, guard, guard_active, device, world_size, grad_accum,
               model.flops_per_token(args.seq_len) * args.total_batch_tokens, peak, run_config,
               examples)


def resume(args, run, path):
    """Load a checkpoint; returns the step to continue from. Same world size: everything, bit-exact.
    Another world size: DeepSpeed's ZeRO partitions do not fit, so the weights only (said in the log)."""
    if path is None:
        if args.resume:
            print0(f"--resume {args.resume}: no checkpoint in {checkpoint.checkpoint_dir(args.out_dir)}; fresh start")
        return 0
    saved_world = checkpoint.read_run_config(path)["world_size"]
    exact = saved_world == run.world_size
    state = checkpoint.load(run.engine, path, load_optimizer_states=exact)
    step = state["step"] + 1
    if exact:
        run.train_loader.load_state_dict(state["loader"])
        print0(f"resumed from {path} at step {step}: weights, optimizer, schedule, data position and RNG")
    else:
        run.engine.lr_scheduler.last_epoch = step - 1
        run.engine.lr_scheduler.step()  # the schedule's value at `step`
        run.train_loader.load_state_dict({**run.train_loader.state_dict(), "epoch": state["loader"]["epoch"] + 1,
                                          "batch": 0})
        print0(f"resumed from {path} at step {step} with WEIGHTS ONLY: saved by {saved_world} rank(s), now "
               f"{run.world_size}; optimizer moments restart from zero, data from epoch {state['loader']['epoch'] + 1}")
    return step


def train_step(run):
    """One optimizer step = grad_accum micro-steps. Returns (loss averaged over micro-steps and ranks,
    whether the update was skipped)."""
    loss_sum = torch.zeros((), device=run.device)
    skip_before = run.engine.skipped_steps
    for micro in range(run.grad_accum):
        x, y = run.train_loader.next_batch()
        _, loss = run.engine(x.to(run.device, non_blocking=True), y.to(run.device, non_blocking=True))
        loss_sum += loss.detach()  # stays on device: one host sync per step, below
        if micro == run.grad_accum - 1:
            mean_loss = dist.mean_over_ranks(loss_sum).item() / run.grad_accum
            if run.guard.check_loss(mean_loss):
                if not run.guard_active:
                    raise StopTraining(f"loss {mean_loss} and this optimizer has no skip path (ZeRO 0)")
                loss = loss * float("nan")  # DeepSpeed's overflow path then skips the whole update
        run.engine.backward(loss)
        run.engine.step()  # DeepSpeed steps the optimizer only at the accumulation boundary
    return mean_loss, run.engine.skipped_steps > skip_before


class StopTraining(Exception):
    """The run cannot continue; the message says why."""


class StopRequest:
    """SIGTERM/SIGINT: finish the current step, save, exit 0. Any rank's signal stops every rank."""

    def __init__(self):
        self.requested = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        self.requested = signal.Signals(signum).name

    def agreed(self, device):
        flag = torch.tensor(float(bool(self.requested)), device=device)
        return dist.mean_over_ranks(flag).item() > 0


def save(args, run, step):
    client_state = {"step": step, "tokens": (step + 1) * args.total_batch_tokens,
                    "loader": run.train_loader.state_dict()}
    start = time.perf_counter()
    path = checkpoint.save(run.engine, args.out_dir, step, client_state, run.run_config, args.keep_last,
                           args.keep_every)
    print0(f"step {step:5d} | saved {path} in {time.perf_counter() - start:.2f}s")


def log_samples(args, run, step):
    tokenizer = gpt2_tokenizer()
    generator = torch.Generator().manual_seed(args.seed + run.engine.global_rank)  # private: training RNG untouched
    tokens = sample(run.model, tokenizer.encode_ordinary(SAMPLE_PROMPT), args.sample_tokens, generator, run.device)
    print(f"[rank {run.engine.global_rank}] sample at step {step}: {tokenizer.decode(tokens)!r}", flush=True)


def log_step(args, run, step, lr, loss, skipped, dt):
    """The step's metrics to console, TensorBoard and metrics.jsonl; the guard's verdict on it."""
    metrics = dict(loss=loss, lr=lr, dt=dt, tokens_per_s=args.total_batch_tokens / dt,
                   **ds_engine.step_stats(run.engine), skipped=int(skipped), guard_skips=run.guard.skipped)
    if run.peak_flops:
        metrics["mfu"] = run.flops_per_step / dt / (run.peak_flops * run.world_size)
    run.logger.log(step, metrics, console=f"step {step:5d} | " + " | ".join(
        f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()))
    bad = run.guard.end_step(loss, skipped)
    if skipped:
        print0(f"step {step:5d} | update skipped: {run.guard.reason}")
    if bad:
        raise StopTraining(bad)


def fit(args, run, start_step):
    stop = StopRequest()
    profiler = step_profiler(args.profile, args.out_dir, run.device.type, run.engine.global_rank)
    for step in range(start_step, args.max_steps):
        last = step == args.max_steps - 1
        lr = run.engine.get_lr()[0]
        start = time.perf_counter()
        loss, skipped = train_step(run)
        log_step(args, run, step, lr, loss, skipped, time.perf_counter() - start)
        profiler.step()
        if args.val_every and (step % args.val_every == 0 or last):
            val = validation_loss(run.engine, run.val_set, run.device)
            run.logger.log(step, {"val_loss": val}, console=f"step {step:5d} | val_loss {val:.4f}")
        if run.hellaswag_examples and (step % args.eval_every == 0 or last):
            scores = hellaswag.evaluate(run.engine, run.hellaswag_examples, run.device, run.model.config.block_size,
                                        args.micro_batch, progress=True)
            run.logger.log(step, {"hellaswag/acc_norm": scores["acc_norm"], "hellaswag/acc": scores["acc"]},
                           console=f"step {step:5d} | hellaswag acc_norm {scores['acc_norm']:.4f} "
                                   f"acc {scores['acc']:.4f} ({scores['examples']} examples)")
        if args.sample_every and (step % args.sample_every == 0 or last) and run.engine.global_rank == 0:
            log_samples(args, run, step)
        stopping = stop.agreed(run.device)
        if last or stopping or (args.save_every and (step + 1) % args.save_every == 0):
            save(args, run, step)
        if stopping:
            print0(f"step {step:5d} | stopped by {stop.requested or 'another rank'}: checkpoint saved, exiting")
            break
    profiler.stop()
    run.train_loader.close()
    run.logger.close()


def main(argv=None):
    args = build_parser().parse_args(argv)
    ds_config, model_config, grad_accum, device, run_config, resume_from, examples = setup(args)
    run = build(args, ds_config, model_config, grad_accum, device, run_config, examples)
    start_step = resume(args, run, resume_from)
    try:
        fit(args, run, start_step)
    except StopTraining as e:
        tags = checkpoint.complete_tags(checkpoint.checkpoint_dir(args.out_dir))
        fail(f"stopping: {e}. Last good checkpoint: "
             f"{checkpoint.checkpoint_dir(args.out_dir) / tags[-1] if tags else 'none'}", code=1)
    except Exception as e:
        if LOSS_SCALE_AT_MINIMUM not in str(e):
            raise
        fail("fp16 loss scale fell to its minimum: gradients keep overflowing. Remedies: train in bf16 "
             "(ds_configs/*_bf16.json) where the GPU has it; raise fp16.hysteresis (e.g. 4) so single "
             "overflows do not lower the scale; lower fp16.initial_scale_power; lower --lr", code=1)


if __name__ == "__main__":
    main()
