"""HellaSwag, completion style (as llm.c and build-nanogpt score it): for each of the 4 endings, the
cross-entropy of the ending's tokens given the context; `acc` picks the lowest summed loss, `acc_norm`
the lowest mean loss. OpenAI's GPT-2 124M scores acc_norm 0.2955 on the 10,042 validation examples.

Inputs: the official jsonl (ctx, endings, label), or llm.c's `hellaswag_val.bin` (already tokenized).
"""
import errno
import json
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from gpt.console import BadInput, atomic_write, download_cache, json_line, regular_file_problem
from gpt.data.tokenizer import gpt2_tokenizer

OFFICIAL_VAL_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
EVAL_MAGIC, EVAL_VERSION = 20240522, 1  # llm.c's eval-file header
START_EXAMPLE = 2**16 - 1
PAD_TO = 32  # rows are padded to a multiple of this: few distinct shapes, so torch.compile rarely recompiles



@dataclass(frozen=True)
class Example:
    context: tuple
    endings: tuple  # 4 tuples of token ids
    label: int


def empty_problem(context, endings):
    """Why an example with this context and these endings (text or tokens) cannot be scored, or None. Nothing to
    score after (an empty context) or nothing to score (an empty ending) made the mean loss NaN, and argmin then
    picked ending 0; official rows never have either, so such a row is a broken copy."""
    if not len(context):
        return "the context is empty: an ending is scored on the context before it"
    empty = [i for i, ending in enumerate(endings) if not len(ending)]
    return f"ending {empty[0]} is empty: there is nothing to score" if empty else None


def parse_example(line, where):
    """(context, endings, label) of one official jsonl line, or an error naming where it is."""
    row = json_line(line, where, BadInput)
    if not isinstance(row, dict):
        raise BadInput(f"{where}: expected a JSON object with ctx, endings and label")
    for key in ("ctx", "endings", "label"):
        if key not in row:
            raise BadInput(f"{where}: no '{key}' field")
    context, endings, label = row["ctx"], row["endings"], row["label"]
    if not isinstance(context, str):
        raise BadInput(f"{where}: 'ctx' must be a string, got {json.dumps(context)[:40]}")
    if not (isinstance(endings, list) and len(endings) == 4 and all(isinstance(e, str) for e in endings)):
        raise BadInput(f"{where}: 'endings' must be a list of 4 strings, got {json.dumps(endings)[:40]}")
    problem = empty_problem(context.strip(), [e.strip() for e in endings])
    if problem:
        raise BadInput(f"{where}: {problem}")
    if isinstance(label, str) and label in ("0", "1", "2", "3"):  # some copies hold the label as a string
        label = int(label)
    if type(label) is not int or not 0 <= label <= 3:
        raise BadInput(f"{where}: 'label' must be 0, 1, 2 or 3, got {json.dumps(label)[:40]}")
    return context, endings, label


def read_jsonl(path):
    """Examples from the official jsonl; each ending is tokenized with a leading space, as GPT-2 saw text."""
    tokenizer = gpt2_tokenizer()
    examples = []
    with open(path, "rb") as f:
        for line_number, line in enumerate(f, 1):
            if not line.strip():
                continue
            context, endings, label = parse_example(line, f"{path}:{line_number}")
            examples.append(Example(tuple(tokenizer.encode_ordinary(context)),
                                    tuple(tuple(tokenizer.encode_ordinary(" " + e)) for e in endings), label))
    if not examples:
        raise BadInput(f"{path}: no examples")
    return examples


def read_llmc_bin(path):
    """Examples from llm.c's eval file: a 256-int32 header (magic 20240522, version 1, example count), then
    per example uint16s: 65535, byte count, index, label, number of endings, then length-prefixed context
    and ending token lists."""
    raw = Path(path).read_bytes()
    if len(raw) < 1024:
        raise BadInput(f"{path}: shorter than the 1024-byte header")
    header = np.frombuffer(raw[:1024], dtype="<i4")
    if header[0] != EVAL_MAGIC or header[1] != EVAL_VERSION:
        raise BadInput(f"{path}: bad header (magic {header[0]}, version {header[1]}; "
                       f"expected {EVAL_MAGIC}, {EVAL_VERSION})")
    stream = np.frombuffer(raw[1024:len(raw) - (len(raw) - 1024) % 2], dtype="<u2")
    examples, position = [], 0
    for index in range(int(header[2])):
        try:
            if stream[position] != START_EXAMPLE:
                raise IndexError
            size = int(stream[position + 1]) // 2
            fields = stream[position:position + size].tolist()
            if len(fields) != size:
                raise IndexError
            label, count, cursor = fields[3], fields[4], 5
            lists = []
            for _ in range(count + 1):
                n = fields[cursor]
                lists.append(tuple(fields[cursor + 1:cursor + 1 + n]))
                cursor += 1 + n
        except IndexError:
            raise BadInput(f"{path}: example {index} is truncated or misaligned") from None
        if count != 4 or not 0 <= label < 4:
            raise BadInput(f"{path}: example {index}: expected 4 endings and a label in 0..3, "
                           f"found {count} and {label}")
        problem = empty_problem(lists[0], lists[1:])
        if problem:
            raise BadInput(f"{path}: example {index}: {problem}")
        examples.append(Example(lists[0], tuple(lists[1:]), label))
        position += size
    if not examples:
        raise BadInput(f"{path}: no examples")
    return examples


def load(path, cache_dir=None):
    """Examples from a .jsonl or llm.c .bin path; 'val' downloads the official validation jsonl once."""
    if str(path) == "val":
        cache = Path(cache_dir or download_cache()) / "hellaswag_val.jsonl"
        if not cache.exists():
            try:
                cache.parent.mkdir(parents=True, exist_ok=True)
                if not os.access(cache.parent, os.W_OK):  # a read-only disk or HOME: EROFS even for root
                    raise OSError(errno.EROFS, "not writable")
            except OSError as e:
                raise BadInput(f"{cache.parent}: cannot keep HellaSwag's download there ({e.strerror}); set "
                               f"XDG_CACHE_HOME to a writable directory, or pass a local hellaswag_val.jsonl") from None
            with atomic_write(cache) as tmp:
                try:
                    with urllib.request.urlopen(OFFICIAL_VAL_URL, timeout=30) as response:
                        tmp.write_bytes(response.read())
                except OSError as e:
                    raise BadInput(f"cannot download HellaSwag (offline?): {e}; pass a local hellaswag_val.jsonl "
                                   f"or llm.c's hellaswag_val.bin instead") from None
        path = cache
    path = Path(path)
    if not path.is_file():  # a FIFO would block the read: said, not opened
        raise BadInput(f"{path}: a directory, not a file" if path.is_dir() else regular_file_problem(path))
    return read_llmc_bin(path) if path.suffix == ".bin" else read_jsonl(path)


def example_losses(model, examples, device, block_size):
    """(summed, mean) ending losses, each (len(examples), 4), scoring the examples in one padded batch.
    Contexts too long for block_size lose their oldest tokens; an ending longer than it loses the context too,
    and its own first tokens."""
    rows, spans = [], []
    for example in examples:
        for ending in example.endings:
            tokens = (example.context + ending)[-block_size - 1:]
            rows.append(tokens)
            # the ending's positions within the row; an ending longer than the block keeps only its last tokens,
            # of which the row's first has nothing before it to be predicted from (a negative start scored padding)
            spans.append((max(1, len(tokens) - len(ending)), len(tokens)))
    width = -(-max(len(r) for r in rows) // PAD_TO) * PAD_TO
    batch = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width - 1))
    for i, (row, (start, end)) in enumerate(zip(rows, spans)):
        batch[i, :len(row)] = torch.tensor(row)
        mask[i, start - 1:end - 1] = 1  # the target at position t is token t + 1
    inputs = batch[:, :-1][:, :block_size].to(device)
    logits, _ = model(inputs)  # -inf beyond the real vocabulary (GPT.forward): the padding takes no probability
    losses = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), batch[:, 1:inputs.size(1) + 1].reshape(-1)
                             .to(device), reduction="none").view(len(rows), -1).cpu()
    mask = mask[:, :inputs.size(1)]
    summed = (losses * mask).sum(dim=1)
    return summed.view(-1, 4), (summed / mask.sum(dim=1)).view(-1, 4)


@torch.no_grad()
def evaluate(model, examples, device, block_size, batch_examples=8, progress=False, cut_short=lambda: False):
    """{'acc', 'acc_norm', 'examples'}: rank r of W scores examples r, r + W, ...; counts are summed. None on every
    rank once cut_short(), asked before each batch (a stop request), is true on any: that rank skips the rest (the sum
    still runs, once, as on every rank) and its flag in the sum tells the others their counts are partial."""
    from tqdm import tqdm

    was_training = model.training
    model.eval()
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    mine = examples[rank::world]
    counts = torch.zeros(4, dtype=torch.float64)  # correct by sum, correct by mean, examples, ranks cut short
    for start in tqdm(range(0, len(mine), batch_examples), desc="hellaswag", disable=not (progress and rank == 0)):
        if cut_short():
            counts[3] = 1.0
            break
        group = mine[start:start + batch_examples]
        summed, mean = example_losses(model, group, device, block_size)
        labels = torch.tensor([e.label for e in group])
        counts[:3] += torch.tensor([(summed.argmin(1) == labels).sum().item(), (mean.argmin(1) == labels).sum().item(),
                                    len(group)], dtype=torch.float64)
    if dist.is_initialized():
        counts = counts.to(device)
        dist.all_reduce(counts, op=dist.ReduceOp.SUM)
        counts = counts.cpu()
    model.train(was_training)
    if counts[3].item() > 0:
        return None
    return {"acc": counts[0].item() / counts[2].item(), "acc_norm": counts[1].item() / counts[2].item(),
            "examples": int(counts[2].item())}
