"""Bad input to the console scripts, table-driven: each case is one line on stderr naming the thing and the
problem, exit status 1, no traceback, and nothing on disk changed (the inputs, the checkpoint, the shards
and the output directory). Each runs the script's main() in this process: fast, and an exception that
escapes fails the case. (The trainer's own table is tests/integration/test_bad_input.py.)"""
import gzip
import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from gpt.commands import plan, prepare
from gpt.commands.eval import main as evaluate_main
from gpt.commands.export import main as export_main
from gpt.train import checkpoint
from gpt.commands.sample import main as sample_main
from gpt.data.shards import write_shard

SCRIPTS = {"gpt-prepare": prepare.main, "gpt-plan": plan.main, "gpt-eval": evaluate_main,
           "gpt-sample": sample_main, "gpt-export": export_main}
HELLASWAG = {"ctx": "A man sits down.", "endings": ["He eats.", "He runs.", "He sings.", "He sleeps."], "label": 1}
HF_CONFIG = {"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 64, "n_positions": 256, "vocab_size": 50257}


def jsonl(*rows):
    return "".join(json.dumps(row) + "\n" for row in rows)


# name -> file contents (str or bytes); a name ending in / is a directory holding the files named after it
BAD_FILES = {
    "empty.txt": "", "spaces.txt": "  \n\n", "binary.txt": bytes(range(128, 256)) * 8, "good.txt": "Some words. " * 50,
    "empty.jsonl": "", "blank.jsonl": "\n\n", "null.jsonl": jsonl({"text": None}), "number.jsonl": jsonl({"text": 5}),
    "broken.jsonl": '{"text": "a"}\n{"text": \n', "array_rows.jsonl": "[1, 2]\n", "body.jsonl": jsonl({"body": "x"}),
    "strings.json": '["a", "b"]', "cut.json": '[{"text": "a"},', "table.csv": "a,b\n", "plain.jsonl.gz": jsonl({"text": "a"}),
    "random.parquet": bytes(range(256)), "few_docs.jsonl": jsonl(*[{"text": "Hello there. " * 40}] * 30),
    "hs_string_endings.jsonl": jsonl({**HELLASWAG, "endings": "abcd"}),
    "hs_three_endings.jsonl": jsonl({**HELLASWAG, "endings": HELLASWAG["endings"][:3]}),
    "hs_label_7.jsonl": jsonl({**HELLASWAG, "label": 7}), "hs_null_ctx.jsonl": jsonl({**HELLASWAG, "ctx": None}),
    "hs_no_label.jsonl": jsonl({k: v for k, v in HELLASWAG.items() if k != "label"}),
    "hs_broken.jsonl": "{nope\n", "hs_empty.jsonl": "", "hs_short.bin": bytes(300), "a_file": "x",
    "hf_bad_json/config.json": "{bad", "hf_no_shape/config.json": json.dumps({"model_type": "gpt2"}),
    "hf_bert/config.json": json.dumps({**HF_CONFIG, "model_type": "bert"}),
    "hf_no_weights/config.json": json.dumps(HF_CONFIG),
    "hf_bad_weights/config.json": json.dumps(HF_CONFIG), "hf_bad_weights/model.safetensors": b"garbage" * 10,
    "no_shards/readme.txt": "nothing here", "llmc_shards/shakespeare_train_000001.bin": bytes(1024 + 64),
    "ds_twice.json": '{"zero_optimization": {"stage": 1, "stage": 2}}', "ds_latin1.json": b'{"x": "caf\xe9"}',
    "ds_bucket.json": json.dumps({"zero_optimization": {"stage": 2, "reduce_bucket_size": -1}}),
    "hs_empty_ctx.jsonl": jsonl({**HELLASWAG, "ctx": ""}),
    "hs_empty_ending.jsonl": jsonl({**HELLASWAG, "endings": ["He eats.", "He runs.", " ", "He sleeps."]}),
    "hf_bad_heads/config.json": json.dumps({**HF_CONFIG, "n_head": 3}),
    "hf_huge_positions/config.json": json.dumps({**HF_CONFIG, "n_positions": 2**40}),
    # gpt-prepare's progress file, damaged: cut short, not an object, not UTF-8, a key missing
    "prep_cut/corpus_prepare.json": '{"settings": {"source": "files"}, "shards": [',
    "prep_array/corpus_prepare.json": "[]", "prep_latin1/corpus_prepare.json": b'{"settings": "\xe9"}',
    "prep_no_carry/corpus_prepare.json": json.dumps({"settings": {}, "shards": [], "documents": 0, "complete": False}),
}


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, trained_checkpoint):
    root = tmp_path_factory.mktemp("bad_files")
    for name, content in BAD_FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    with gzip.open(root / "good.jsonl.gz", "wt") as f:
        f.write(jsonl({"text": "x " * 100}))
    (root / "cut.jsonl.gz").write_bytes((root / "good.jsonl.gz").read_bytes()[:30])
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"body": ["a", "b"]}), root / "body.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), root / "numbers.parquet")
    pq.write_table(pa.table({"text": ["a", None]}), root / "null.parquet")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), root / "no_rows.parquet")
    (root / "wide_tokens").mkdir()
    write_shard(root / "wide_tokens" / "x_val_000000.bin", np.full(5000, 60000))  # ids beyond the vocabulary
    (root / "short_val").mkdir()
    write_shard(root / "short_val" / "x_val_000000.bin", np.arange(100))
    for name, make in (("fifo_val", os.mkfifo), ("dir_val", Path.mkdir), ("empty_val", Path.touch)):
        (root / name).mkdir()
        make(root / name / "x_val_000000.bin")  # a FIFO used to block gpt-eval forever
    os.mkfifo(root / "pipe.txt")
    (root / "lock_link").mkdir()  # a user's file linked where a lock file goes: the lock's record overwrote it
    for name in ("prepare.lock", "export.lock"):
        (root / "lock_link" / name).symlink_to(root / "good.txt")
    # llm.c's eval format (conftest.hellaswag_files): one example, label 0, 4 endings, the second empty
    lists = [[10, 11], [12], [], [13], [14]]
    fields = [0, 0, 4] + [x for tokens in lists for x in (len(tokens), *tokens)]
    (root / "hs_empty_ending.bin").write_bytes(struct.pack("<256i", 20240522, 1, 1, *[0] * 253) + struct.pack(
        f"<{len(fields) + 2}H", 65535, 2 * (len(fields) + 2), *fields))
    step = "step_00000002"  # trained_checkpoint's only checkpoint

    def damaged_copy(name, file, damage, sealed=True):
        """trained_checkpoint copied to `name` with its step's `file` changed by damage(path); complete.json's
        recorded size and checksums follow a regular file's new bytes (so that the reader behind the check of the
        checkpoint's bytes is what meets the change), unless not `sealed` (bit rot: found by that check)."""
        shutil.copytree(trained_checkpoint, root / name)
        path = root / name / step / file
        marker = json.loads((root / name / step / "complete.json").read_text())  # before: it may become a FIFO
        damage(path)
        if path.is_file() and file in marker["files"] and sealed:
            marker["files"][file] = path.stat().st_size
            marker["crc32"][file] = checkpoint.checksums(path.parent, [file])[file]
            (root / name / step / "complete.json").write_text(json.dumps(marker))

    def garble(path):  # bit rot that keeps the size
        path.write_bytes(np.random.default_rng(0).integers(0, 256, path.stat().st_size, dtype=np.uint8).tobytes())

    def replace_with(make):
        return lambda path: path.unlink() or make(path)

    def edit_run_config(change):
        return lambda path: path.write_text(json.dumps(change(json.loads(path.read_text()))))
    damaged_copy("garbled_model", "mp_rank_00_model_states.pt", garble, sealed=False)
    damaged_copy("garbled_optim", "zero_pp_rank_0_mp_rank_00_optim_states.pt", garble, sealed=False)
    damaged_copy("cut_model", "mp_rank_00_model_states.pt",
                 lambda p: p.write_bytes(p.read_bytes()[:1000] + bytes(p.stat().st_size - 1000)))
    damaged_copy("rc_array", "run_config.json", lambda p: p.write_text("[]"))
    damaged_copy("rc_layers_string", "run_config.json", edit_run_config(
        lambda run: {**run, "model": {**run["model"], "n_layer": str(run["model"]["n_layer"])}}))
    damaged_copy("rc_no_model", "run_config.json", edit_run_config(lambda run: {**run, "model": {}}))
    damaged_copy("rc_fifo", "run_config.json", replace_with(os.mkfifo))
    damaged_copy("files_list", "complete.json", lambda p: p.write_text('{"step": 2, "files": [1, 2]}'))
    damaged_copy("complete_fifo", "complete.json", replace_with(os.mkfifo))
    (root / "hf_config_dir" / "config.json").mkdir(parents=True)
    for name, key, value in (("edited_layers", "n_layer", 3), ("edited_heads", "n_head", 3)):
        # a run_config.json edited to other numbers (and its checksum with it): the reader's check of the weights
        damaged_copy(name, "run_config.json", edit_run_config(lambda run: {**run, "model": {**run["model"], key: value}}))
    return root


# (script, its arguments, the line expected on stderr). In both: {in} the bad files, {out} a fresh output
# path, {ckpt} a trained checkpoints/ directory, {data} the Shakespeare shards. A line ending in "..." is a prefix.
CASES = [
    # gpt-prepare: sources
    ("gpt-prepare", "files {in}/missing.txt --out_dir {out}", "error: {in}/missing.txt: file not found"),
    ("gpt-prepare", "files {in}/good.txt {in}/missing.txt --out_dir {out}", "error: {in}/missing.txt: file not found"),
    ("gpt-prepare", "files {in}/empty.txt --out_dir {out}", "error: {in}/empty.txt: empty file"),
    ("gpt-prepare", "files {in}/good.txt --out_dir {in}/lock_link",
     "error: {in}/lock_link/prepare.lock: a symbolic link to {in}/good.txt (gpt-prepare's lock file): it is written in "
     "place, never through a link, which would overwrite the file the link leads to: remove the link, or use another "
     "--out_dir"),
    ("gpt-prepare", "files {in}/spaces.txt --out_dir {out}", "error: {in}/spaces.txt: only whitespace"),
    ("gpt-prepare", "files {in}/binary.txt --out_dir {out}",
     "error: {in}/binary.txt: not UTF-8 text (byte 0x80 at offset 0)"),
    ("gpt-prepare", "files {in}/empty.jsonl --out_dir {out}", "error: {in}/empty.jsonl: empty file"),
    ("gpt-prepare", "files {in}/blank.jsonl --out_dir {out}", "error: {in}/blank.jsonl: no records"),
    ("gpt-prepare", "files {in}/null.jsonl --out_dir {out}", "error: {in}/null.jsonl:1: 'text' is null, not a string"),
    ("gpt-prepare", "files {in}/number.jsonl --out_dir {out}",
     "error: {in}/number.jsonl:1: 'text' is a number, not a string"),
    ("gpt-prepare", "files {in}/broken.jsonl --out_dir {out}",
     "error: {in}/broken.jsonl:2: invalid JSON (Expecting value at column 1)"),
    ("gpt-prepare", "files {in}/array_rows.jsonl --out_dir {out}",
     "error: {in}/array_rows.jsonl: record 1: expected a JSON object with a 'text' field, got a number"),
    ("gpt-prepare", "files {in}/body.jsonl --out_dir {out}",
     "error: {in}/body.jsonl:1: no 'text' field (fields: body); choose one with --text_field"),
    ("gpt-prepare", "files {in}/strings.json --out_dir {out}",
     "error: {in}/strings.json: record 1: expected a JSON object with a 'text' field, got a string"),
    ("gpt-prepare", "files {in}/cut.json --out_dir {out}", "error: {in}/cut.json: invalid JSON (..."),
    ("gpt-prepare", "files {in}/plain.jsonl.gz --out_dir {out}",
     "error: {in}/plain.jsonl.gz: damaged gzip file (Not a gzipped file (b'{{\"'))"),
    ("gpt-prepare", "files {in}/cut.jsonl.gz --out_dir {out}",
     "error: {in}/cut.jsonl.gz: damaged gzip file (Compressed file ended before the end-of-stream marker was reached)"),
    ("gpt-prepare", "files {in}/random.parquet --out_dir {out}", "error: {in}/random.parquet: not a Parquet file (..."),
    ("gpt-prepare", "files {in}/body.parquet --out_dir {out}",
     "error: {in}/body.parquet: no 'text' column (columns: body); choose one with --text_field"),
    ("gpt-prepare", "files {in}/numbers.parquet --out_dir {out}",
     "error: {in}/numbers.parquet: column 'text' holds int64, not strings"),
    ("gpt-prepare", "files {in}/null.parquet --out_dir {out}", "error: {in}/null.parquet: row 2: 'text' is null, not a string"),
    ("gpt-prepare", "files {in}/no_rows.parquet --out_dir {out}", "error: {in}/no_rows.parquet: no records"),
    ("gpt-prepare", "files {in}/table.csv --out_dir {out}",
     "error: {in}/table.csv: unsupported file type (use .txt, .jsonl, .json or .parquet)"),
    ("gpt-prepare", "files {in}/good.txt {in}/few_docs.jsonl --out_dir {out}",
     "error: mixed file types (json, text); prepare each kind separately"),
    ("gpt-prepare", "files {in} --out_dir {out}", "error: {in}: a directory; give its files, e.g. '{in}/*.jsonl'"),
    ("gpt-prepare", "files {in}/zz*.txt --out_dir {out}", "error: no files match {in}/zz*.txt"),
    ("gpt-prepare", "files {in}/few_docs.jsonl --out_dir {out}",
     "error: {in}/few_docs.jsonl: all 30 document(s) (3,660 tokens) went to the validation split, which takes whole "
     "documents up to --val_tokens 100,000,000: nothing is left to train on; give more documents or a lower --val_tokens"),
    ("gpt-prepare", "hub {in}/no_such_dataset --out_dir {out}", "error: dataset '{in}/no_such_dataset' not found: ..."),
    ("gpt-prepare", "files {in}/pipe.txt --out_dir {out}", "error: {in}/pipe.txt: a FIFO (named pipe), not a regular file"),
    ("gpt-prepare", "files {in}/good.txt --out_dir {in}/prep_cut",
     "error: {in}/prep_cut/corpus_prepare.json: damaged progress file (invalid JSON: Expecting value at line 1 column "
     "46): prepare into another --out_dir, or delete the shards beside it and this file"),
    ("gpt-prepare", "files {in}/good.txt --out_dir {in}/prep_array",
     "error: {in}/prep_array/corpus_prepare.json: damaged progress file (an array, not an object): prepare into "
     "another --out_dir, or delete the shards beside it and this file"),
    ("gpt-prepare", "files {in}/good.txt --out_dir {in}/prep_latin1",
     "error: {in}/prep_latin1/corpus_prepare.json: damaged progress file (not UTF-8 text: byte 0xe9 at offset 14): "
     "prepare into another --out_dir, or delete the shards beside it and this file"),
    ("gpt-prepare", "files {in}/good.txt --out_dir {in}/prep_no_carry",
     "error: {in}/prep_no_carry/corpus_prepare.json: damaged progress file (no 'carry'): prepare into another "
     "--out_dir, or delete the shards beside it and this file"),
    # gpt-prepare: flags and the output directory
    ("gpt-prepare", "files {in}/good.txt --out_dir {out} --shard_tokens 0", "error: --shard_tokens 0 must be a finite number >= 1"),
    ("gpt-prepare", "files {in}/good.txt --out_dir {out} --shard_tokens 1",
     "error: --shard_tokens 1 must be at least 1,000: smaller shards are a file for every few tokens (the default is "
     "100,000,000)"),
    ("gpt-prepare", "files {in}/good.txt --out_dir {out} --shard_tokens 99999999999",
     "error: --shard_tokens 99999999999 must be at most 2147483647 (llm.c's shard header holds the token count as an int32)"),
    ("gpt-prepare", "files {in}/good.txt --out_dir {out} --val_tokens -1", "error: --val_tokens -1 must be a finite number >= 1"),
    ("gpt-prepare", "files {in}/good.txt --out_dir {out} --workers 0", "error: --workers 0 must be a finite number >= 1"),
    ("gpt-prepare", "files {in}/good.txt --out_dir {out} --workers 1000000",  # it used to fork until stopped
     f"error: --workers 1000000 must be at most {prepare.max_workers()} (4 per CPU of this machine's "
     f"{os.cpu_count()})"),
    ("gpt-prepare", "files {in}/good.txt --out_dir {out} --val_tokens 99999999999",
     "error: --val_tokens 99999999999 must be at most 2147483647 (llm.c's shard header holds the token count as an int32)"),
    ("gpt-prepare", "files {in}/good.txt --out_dir {out} --shard_tokens lots",
     "error: argument --shard_tokens: invalid int value: 'lots'"),
    ("gpt-prepare", "files {in}/good.txt --out_dir {out} --name ../x", "error: --name '../x' must be a plain file-name prefix"),
    ("gpt-prepare", "files {in}/good.txt --out_dir {out} --name .hidden",
     "error: --name '.hidden' must be a plain file-name prefix"),
    ("gpt-prepare", "files {in}/good.txt --out_dir {in}/a_file", "error: --out_dir {in}/a_file is a file, not a directory"),
    ("gpt-prepare", "files {in}/good.txt --out_dir {in}/a_file/shards",
     "error: --out_dir {in}/a_file/shards: {in}/a_file is a file, not a directory"),
    ("gpt-prepare", "files {in}/good.txt --out_dir {data}",
     "error: {data} already holds shards of another corpus (shakespeare_train_000001.bin, shakespeare_val_000000.bin): "
     "a training run would read both; use another --out_dir"),
    ("gpt-prepare", "files {in}/good.txt --out_dir=", "error: --out_dir is empty: name a directory"),
    ("gpt-prepare", "wikipedia --out_dir {out}",
     "error: argument source: invalid choice: 'wikipedia' (choose from 'shakespeare', 'files', 'hub')"),
    ("gpt-prepare", "", "error: the following arguments are required: source"),
    # gpt-plan
    ("gpt-plan", "--gpu h100-80gb --world_size 0", "error: --world_size 0 must be a finite number >= 1"),
    ("gpt-plan", "--gpu h100-80gb --world_size -8", "error: --world_size -8 must be a finite number >= 1"),
    ("gpt-plan", "--gpu h100-80gb --seq_len 0", "error: --seq_len 0 must be a finite number >= 1"),
    ("gpt-plan", "--gpu_mem -40", "error: --gpu_mem -40.0 must be a finite number > 0"),
    ("gpt-plan", "--gpu_mem nan", "error: --gpu_mem nan must be a finite number > 0"),
    ("gpt-plan", "--gpu h100-80gb --total_batch_tokens 0", "error: --total_batch_tokens 0 must be a finite number >= 1"),
    ("gpt-plan", "--gpu h100-80gb --total_batch_tokens 1267650600228229401496703205376",
     "error: --total_batch_tokens 1267650600228229401496703205376 must be at most 4294967296 (2**32, hours a step on "
     "any hardware)"),
    ("gpt-plan", "--gpu h100-80gb --total_batch_tokens 1000",
     "error: --total_batch_tokens 1000 is not divisible by seq_len x world = 1024 x 8 = 8192, so by no micro_batch x "
     "seq_len x world"),
    ("gpt-plan", "", "error: give --gpu (one of a100-40gb, a100-80gb, a800-80gb, h100-80gb, h200-141gb, h800-80gb, "
                     "rtx3090-24gb, rtx4090-24gb, v100-16gb, v100-32gb) or --gpu_mem GiB"),
    ("gpt-plan", "--gpu h100-80gb --gpu_mem 80", "error: give --gpu (one of a100-40gb, a100-80gb, a800-80gb, h100-80gb, "
     "h200-141gb, h800-80gb, rtx3090-24gb, rtx4090-24gb, v100-16gb, v100-32gb) or --gpu_mem GiB, not both"),
    ("gpt-plan", "--gpu tpu-v9", "error: argument --gpu: invalid choice: 'tpu-v9' (..."),
    ("gpt-plan", "--gpu h100-80gb --seq_len 2048", "error: --seq_len 2048 exceeds the model's block_size 1024 (d12)"),
    ("gpt-plan", "--gpu h100-80gb --n_head 5", "error: n_embd 768 is not divisible by n_head 5"),
    ("gpt-plan", "--gpu h100-80gb --n_layer 0", "error: --n_layer 0 must be a finite number >= 1"),
    ("gpt-plan", "--gpu h100-80gb --model d99", "error: argument --model: invalid choice: 'd99' (..."),
    ("gpt-plan", "--gpu v100-32gb --ds_config ds_configs/zero1_bf16.json", "error: ds_configs/zero1_bf16.json: bf16 on "
     "a v100-32gb, which has no bf16 (a V100, compute capability 7.0; bf16 needs 8.0): plan ds_configs/zero2_fp16.json, "
     "the V100's config"),
    ("gpt-plan", "--gpu h100-80gb --ds_config {in}/missing.json", "error: {in}/missing.json: DeepSpeed config not found"),
    ("gpt-plan", "--gpu h100-80gb --ds_config {in}", "error: {in}: a directory, not a DeepSpeed JSON file"),
    ("gpt-plan", "--gpu h100-80gb --ds_config=", "error: --ds_config is empty: name a DeepSpeed JSON file"),
    ("gpt-plan", "--gpu h100-80gb --ds_config {in}/good.txt", "error: {in}/good.txt: invalid JSON (..."),
    ("gpt-plan", "--gpu h100-80gb --ds_config {in}/ds_twice.json",
     "error: {in}/ds_twice.json: duplicate key 'zero_optimization.stage' (DeepSpeed would use the last one, silently)"),
    ("gpt-plan", "--gpu h100-80gb --ds_config {in}/ds_latin1.json",
     "error: {in}/ds_latin1.json: not UTF-8 text (byte 0xe9 at offset 10)"),
    ("gpt-plan", "--gpu h100-80gb --ds_config {in}/ds_bucket.json",
     "error: {in}/ds_bucket.json: zero_optimization.reduce_bucket_size: Input should be greater than 0 (got -1)"),
    ("gpt-plan", "--gpu h100-80gb --wrold_size 8", "error: unrecognized arguments: --wrold_size 8"),
    ("gpt-plan", "--gpu h100-80gb --n_embd 1000000000 --n_head 1",  # used to build it: "Storage size ... overflowed"
     "error: the model states alone (1.44e+20 parameters: weights, gradients, optimizer states) need "
     "1,005,828,740,211.4 GiB per GPU, more than its 79.2 GiB: choose a smaller model, or more GPUs with ZeRO 1 or 2"),
    ("gpt-plan", "--gpu_mem 1e308", "error: --gpu_mem 1e+308 GiB is beyond any GPU: at most 1024 GiB"),  # planned inf
    ("gpt-plan", "--measure --gpu h100-80gb",
     "error: --measure measures the GPU it runs on: drop --gpu (--gpu_mem GiB stands in for a smaller card)"),
    ("gpt-plan", "--measure --world_size 8", "error: --measure runs one rank on this GPU: --world_size 8 cannot be "
                                             "measured here (plan it without --measure)"),
    ("gpt-plan", "--all --gpu h100-80gb", "error: --all applies to --measure (the GPU it runs on decides which precisions)"),
    ("gpt-plan", "--measure --all --ds_config ds_configs/zero1_bf16.json", "error: give --ds_config or --all, not both"),
    ("gpt-plan", "--measure --gpu_mem 0", "error: --gpu_mem 0.0 must be a finite number > 0"),
    ("gpt-plan", "--measure --ds_config ds_configs/zero1_bf16.json {in}/missing.json",
     "error: {in}/missing.json: DeepSpeed config not found"),
    ("gpt-plan", "--measure --model tiny --seq_len 64",
     "error: --measure trains on a CUDA GPU, and this machine has none (torch.cuda.is_available() is False); without "
     "--measure, gpt-plan plans for the GPU you name"),
    # gpt-eval
    ("gpt-eval", "--checkpoint {ckpt} --data {data} --batch 0", "error: --batch 0 must be a finite number >= 1"),
    ("gpt-eval", "--checkpoint {ckpt} --data {data} --batch 1000000000000",  # it used to swap until killed
     "error: --batch 1000000000000 must be at most 1024 (the logits alone outgrow memory)"),
    ("gpt-eval", "--checkpoint {ckpt} --hellaswag {in}/hs_label_7.jsonl --limit -1",
     "error: --limit -1 must be a finite number >= 1"),
    ("gpt-eval", "--checkpoint {ckpt} --data {data} --seq_len 4096",
     "error: --seq_len 4096 exceeds the model's block_size 256"),
    ("gpt-eval", "--checkpoint {ckpt} --data {data} --seq_len 0", "error: --seq_len 0 must be a finite number >= 1"),
    ("gpt-eval", "--checkpoint {ckpt} --data {data} --val_tokens 0", "error: --val_tokens 0 must be a finite number >= 1"),
    ("gpt-eval", "--checkpoint {ckpt} --data {data} --val_tokens 10",
     "error: --val_tokens 10 is less than one sequence (--seq_len 256)"),
    ("gpt-eval", "--checkpoint {ckpt}", "error: nothing to evaluate: give --data and/or --hellaswag"),
    ("gpt-eval", "--checkpoint {ckpt} --data {data} --limit 3", "error: --limit applies to --hellaswag, which is not given"),
    ("gpt-eval", "--checkpoint {in}/missing --data {data}", "error: --checkpoint {in}/missing: not found"),
    ("gpt-eval", "--checkpoint {ckpt} --data {data} --device cuda",
     "error: --device cuda: torch sees no CUDA GPU here; use --device auto or cpu"),
    ("gpt-eval", "--checkpoint {ckpt} --data {data} --device tpu", "error: argument --device: invalid choice: 'tpu' (..."),
    ("gpt-eval", "--checkpoint {in} --data {data}", "error: {in}: no complete checkpoint found"),
    ("gpt-eval", "--checkpoint {ckpt} --hf {in} --data {data}", "error: argument --hf: not allowed with argument --checkpoint"),
    ("gpt-eval", "--data {data}", "error: one of the arguments --checkpoint --hf is required"),
    ("gpt-eval", "--checkpoint {ckpt} --data {in}/missing",
     "error: {in}/missing: data directory not found (make one with: python -m gpt.commands.prepare shakespeare --out_dir {in}/missing)"),
    ("gpt-eval", "--checkpoint {ckpt} --data {in}/good.txt", "error: {in}/good.txt: a file, not a directory of shards"),
    ("gpt-eval", "--checkpoint {ckpt} --data {in}/no_shards", "error: {in}/no_shards: no 'val' shards (*_val_*.bin or .npy)"),
    ("gpt-eval", "--checkpoint {ckpt} --data {in}/short_val --seq_len 128",
     "error: {in}/short_val/x_val_000000.bin: ..."),
    ("gpt-eval", "--checkpoint {ckpt} --data {in}/wide_tokens --seq_len 64",
     "error: {in}/wide_tokens/x_val_000000.bin: token 60000 at position 0 is >= the vocabulary size 50257"),
    ("gpt-eval", "--checkpoint {ckpt} --data {in}/fifo_val --seq_len 64",
     "error: {in}/fifo_val/x_val_000000.bin: a FIFO (named pipe) named like a shard, not a shard file"),
    ("gpt-eval", "--checkpoint {ckpt} --data {in}/dir_val --seq_len 64",
     "error: {in}/dir_val/x_val_000000.bin: a directory named like a shard, not a shard file"),
    ("gpt-eval", "--checkpoint {ckpt} --data {in}/empty_val --seq_len 64",
     "error: {in}/empty_val/x_val_000000.bin: an empty file (0 bytes), not a token shard"),
    ("gpt-eval", "--checkpoint {in}/edited_layers --data {data} --seq_len 64",
     "error: {in}/edited_layers/step_00000002: the weights do not fit its run_config.json (n_layer 3, n_embd 64, "
     "block_size 256, vocab_size 50304; missing, extra or misshapen: transformer.h.2.attn.c_attn.bias, "
     "transformer.h.2.attn.c_attn.weight, transformer.h.2.attn.c_proj.bias, ...)"),
    ("gpt-eval", "--checkpoint {ckpt} --hellaswag {in}/hs_empty_ctx.jsonl",
     "error: {in}/hs_empty_ctx.jsonl:1: the context is empty: an ending is scored on the context before it"),
    ("gpt-eval", "--checkpoint {ckpt} --hellaswag {in}/hs_empty_ending.bin",
     "error: {in}/hs_empty_ending.bin: example 0: ending 1 is empty: there is nothing to score"),
    ("gpt-eval", "--checkpoint {ckpt} --hellaswag {in}/pipe.txt", "error: {in}/pipe.txt: a FIFO (named pipe), not a regular file"),
    ("gpt-eval", "--checkpoint {ckpt} --hellaswag {in}/hs_empty_ending.jsonl",
     "error: {in}/hs_empty_ending.jsonl:1: ending 2 is empty: there is nothing to score"),
    ("gpt-eval", "--hf {in}/hf_bad_heads --data {data}",
     "error: {in}/hf_bad_heads/config.json: n_embd 64 is not divisible by n_head 3"),
    ("gpt-eval", "--hf {in}/hf_huge_positions --data {data}",
     "error: {in}/hf_huge_positions/config.json: n_positions 1099511627776 is beyond any GPT-2 (at most 1048576 "
     "here; GPT-2's is 1024)"),
    ("gpt-eval", "--checkpoint {ckpt} --hellaswag {in}/missing.jsonl", "error: {in}/missing.jsonl: file not found"),
    ("gpt-eval", "--checkpoint {ckpt} --hellaswag {in}", "error: {in}: a directory, not a file"),
    ("gpt-eval", "--checkpoint {ckpt} --hellaswag {in}/hs_string_endings.jsonl",
     "error: {in}/hs_string_endings.jsonl:1: 'endings' must be a list of 4 strings, got \"abcd\""),
    ("gpt-eval", "--checkpoint {ckpt} --hellaswag {in}/hs_three_endings.jsonl",
     "error: {in}/hs_three_endings.jsonl:1: 'endings' must be a list of 4 strings, got [\"He eats.\", \"He runs.\", \"He..."),
    ("gpt-eval", "--checkpoint {ckpt} --hellaswag {in}/hs_label_7.jsonl",
     "error: {in}/hs_label_7.jsonl:1: 'label' must be 0, 1, 2 or 3, got 7"),
    ("gpt-eval", "--checkpoint {ckpt} --hellaswag {in}/hs_null_ctx.jsonl",
     "error: {in}/hs_null_ctx.jsonl:1: 'ctx' must be a string, got null"),
    ("gpt-eval", "--checkpoint {ckpt} --hellaswag {in}/hs_no_label.jsonl", "error: {in}/hs_no_label.jsonl:1: no 'label' field"),
    ("gpt-eval", "--checkpoint {ckpt} --hellaswag {in}/hs_broken.jsonl",
     "error: {in}/hs_broken.jsonl:1: invalid JSON (Expecting property name enclosed in double quotes at column 2)"),
    ("gpt-eval", "--checkpoint {ckpt} --hellaswag {in}/hs_empty.jsonl", "error: {in}/hs_empty.jsonl: no examples"),
    ("gpt-eval", "--checkpoint {ckpt} --hellaswag {in}/hs_short.bin", "error: {in}/hs_short.bin: shorter than the ..."),
    ("gpt-eval", "--hf {in}/missing --data {data}", "error: --hf {in}/missing: not found"),
    ("gpt-eval", "--hf {in}/no_shards --data {data}", "error: {in}/no_shards: no config.json (not a Hugging Face model directory)"),
    ("gpt-eval", "--hf {in}/hf_bad_json --data {data}", "error: {in}/hf_bad_json/config.json: invalid JSON (..."),
    ("gpt-eval", "--hf {in}/hf_bert --data {data}", "error: {in}/hf_bert/config.json: model_type 'bert', expected 'gpt2'"),
    ("gpt-eval", "--hf {in}/hf_no_shape --data {data}",
     "error: {in}/hf_no_shape/config.json: n_layer, n_head, n_embd, n_positions, vocab_size must be positive whole "
     "numbers (got null, null, null, null, null)"),
    ("gpt-eval", "--hf {in}/hf_no_weights --data {data} --seq_len 64",
     "error: {in}/hf_no_weights: no model.safetensors or pytorch_model.bin"),
    ("gpt-eval", "--hf {in}/hf_bad_weights --data {data} --seq_len 64",
     "error: {in}/hf_bad_weights/model.safetensors: unreadable GPT-2 weights (SafetensorError: ..."),
    # gpt-sample
    ("gpt-sample", "--checkpoint {ckpt} --max_new_tokens -5", "error: --max_new_tokens -5 must be a finite number >= 1"),
    ("gpt-sample", "--checkpoint {ckpt} --max_new_tokens 0", "error: --max_new_tokens 0 must be a finite number >= 1"),
    ("gpt-sample", "--checkpoint {ckpt} --temperature 0", "error: --temperature 0.0 must be a finite number > 0"),
    ("gpt-sample", "--checkpoint {ckpt} --temperature nan", "error: --temperature nan must be a finite number > 0"),
    ("gpt-sample", "--checkpoint {ckpt} --top_k 0", "error: --top_k 0 must be a finite number >= 1"),
    ("gpt-sample", "--checkpoint {ckpt} --num_samples 0", "error: --num_samples 0 must be a finite number >= 1"),
    ("gpt-sample", "--checkpoint {in}/missing", "error: --checkpoint {in}/missing: not found"),
    ("gpt-sample", "--checkpoint {ckpt} --device cuda",
     "error: --device cuda: torch sees no CUDA GPU here; use --device auto or cpu"),
    ("gpt-sample", "--checkpoint {in}", "error: {in}: no complete checkpoint found"),
    ("gpt-sample", "--hf {in}/hf_bert", "error: {in}/hf_bert/config.json: model_type 'bert', expected 'gpt2'"),
    ("gpt-sample", "--checkpoint {ckpt} --seed x", "error: argument --seed: invalid int value: 'x'"),
    ("gpt-sample", "--checkpoint {ckpt} --seed -1", "error: --seed -1 must lie in [0, 2**63)"),
    ("gpt-sample", "--checkpoint {ckpt} --seed 1180591620717411303424",  # it used to overflow in torch
     "error: --seed 1180591620717411303424 must lie in [0, 2**63)"),
    ("gpt-sample", "--checkpoint {ckpt} --num_samples 1000000000000",  # it used to print samples for days
     "error: --num_samples 1000000000000 must be at most 10000 (more is a job for a script)"),
    ("gpt-sample", "--checkpoint {ckpt} --max_new_tokens 100000000000000000000",
     "error: --max_new_tokens 100000000000000000000 must be at most 65536 (64 x GPT-2's context)"),
    ("gpt-sample", "--checkpoint {ckpt} --prompt \udcff\udcfe",  # bytes that are not UTF-8 became U+FFFD silently
     "error: --prompt: not UTF-8 text (byte 0xff at offset 0)"),
    # gpt-export
    ("gpt-export", "{in}/missing --out_dir {out}", "error: {in}/missing: checkpoint not found"),
    ("gpt-export", "{in} --out_dir {out}", "error: {in}: no complete checkpoint found"),
    ("gpt-export", "{ckpt} --out_dir {in}/a_file", "error: --out_dir {in}/a_file is a file, not a directory"),
    ("gpt-export", "{ckpt} --out_dir {in}/lock_link",
     "error: {in}/lock_link/export.lock: a symbolic link to {in}/good.txt (gpt-export's lock file): it is written in "
     "place, never through a link, which would overwrite the file the link leads to: remove the link, or use another "
     "--out_dir"),
    ("gpt-export", "{ckpt} --out_dir {ckpt}",
     "error: --out_dir {ckpt} holds dsgpt checkpoints: export into a directory of its own"),
    ("gpt-export", "{ckpt} --out_dir {in}/hf_bad_weights",
     "error: --out_dir {in}/hf_bad_weights already holds config.json, model.safetensors: give --overwrite to replace "
     "them, or another --out_dir"),
    ("gpt-export", "{in}/edited_layers --out_dir {out}",
     "error: {in}/edited_layers/step_00000002: the weights do not fit its run_config.json (n_layer 3, n_embd 64, "
     "block_size 256, vocab_size 50304; missing, extra or misshapen: transformer.h.2.attn.c_attn.bias, "
     "transformer.h.2.attn.c_attn.weight, transformer.h.2.attn.c_proj.bias, ...)"),
    ("gpt-export", "{in}/edited_heads --out_dir {out}",
     "error: {in}/edited_heads/step_00000002: its run_config.json says n_head 3, which does not divide its "
     "n_embd 64"),
    ("gpt-sample", "--checkpoint {in}/edited_heads",
     "error: {in}/edited_heads/step_00000002: its run_config.json says n_head 3, which does not divide its "
     "n_embd 64"),
    # checkpoint files garbled (bit rot: found by the checksums) or cut (named, not zero_to_fp32's traceback), of
    # another structure, or not regular
    # files (a FIFO complete.json used to block every command forever)
    ("gpt-export", "{in}/garbled_model --out_dir {out}",
     "error: {in}/garbled_model: every complete checkpoint is damaged (the oldest, step_00000002: mp_rank_00_model_states.pt does not hold the bytes it was saved with (the CRC-32 of its bytes from 0 on: ..."),
    ("gpt-eval", "--checkpoint {in}/garbled_model --data {data} --seq_len 64",
     "error: {in}/garbled_model: every complete checkpoint is damaged (the oldest, step_00000002: mp_rank_00_model_states.pt does not hold the bytes it was saved with (the CRC-32 of its bytes from 0 on: ..."),
    ("gpt-sample", "--checkpoint {in}/garbled_model",
     "error: {in}/garbled_model: every complete checkpoint is damaged (the oldest, step_00000002: mp_rank_00_model_states.pt does not hold the bytes it was saved with (the CRC-32 of its bytes from 0 on: ..."),
    ("gpt-export", "{in}/garbled_optim --out_dir {out}",
     "error: {in}/garbled_optim: every complete checkpoint is damaged (the oldest, step_00000002: "
     "zero_pp_rank_0_mp_rank_00_optim_states.pt does not hold the bytes it was saved with (the CRC-32 of ..."),
    ("gpt-export", "{in}/cut_model/step_00000002 --out_dir {out}",
     "error: {in}/cut_model/step_00000002/mp_rank_00_model_states.pt: unreadable (RuntimeError: PytorchStreamReader "
     "failed reading zip archive: failed finding central directory)"),
    ("gpt-export", "{in}/rc_array --out_dir {out}",
     "error: {in}/rc_array/step_00000002/run_config.json: an array, not a JSON object"),
    ("gpt-eval", "--checkpoint {in}/rc_array --data {data}",
     "error: {in}/rc_array/step_00000002/run_config.json: an array, not a JSON object"),
    ("gpt-eval", "--checkpoint {in}/rc_layers_string/step_00000002 --data {data} --seq_len 64",
     'error: {in}/rc_layers_string/step_00000002/run_config.json: model.n_layer must be a positive whole number, '
     'got "2"'),
    ("gpt-export", "{in}/rc_no_model --out_dir {out}",
     "error: {in}/rc_no_model/step_00000002/run_config.json: model.n_layer must be a positive whole number, got null"),
    ("gpt-export", "{in}/rc_fifo/step_00000002 --out_dir {out}",
     "error: {in}/rc_fifo/step_00000002: damaged checkpoint (run_config.json is a FIFO (named pipe), not a regular "
     "file); give its parent directory to take the newest intact one"),
    ("gpt-sample", "--checkpoint {in}/files_list/step_00000002",
     "error: {in}/files_list/step_00000002: damaged checkpoint (unreadable complete.json ('files' is not an object of "
     "file sizes)); give its parent directory to take the newest intact one"),
    ("gpt-eval", "--checkpoint {in}/complete_fifo --data {data} --seq_len 64",
     "error: {in}/complete_fifo: every complete checkpoint is damaged (the oldest, step_00000002: unreadable "
     "complete.json (a FIFO (named pipe), not a regular file))"),
    ("gpt-export", "{in}/complete_fifo/step_00000002 --out_dir {out}",
     "error: {in}/complete_fifo/step_00000002: damaged checkpoint (unreadable complete.json (a FIFO (named pipe), not "
     "a regular file)); give its parent directory to take the newest intact one"),
    ("gpt-export", "{ckpt} --out_dir {in}/hf_config_dir --overwrite",
     "error: {in}/hf_config_dir/config.json: a directory, not a regular file: --overwrite could not replace it"),
    ("gpt-export", "{ckpt}", "error: the following arguments are required: --out_dir"),
    ("gpt-export", "{ckpt} --out_dir=", "error: --out_dir is empty: name a directory"),
    # shards of the corpus's own name that no preparation of ours recorded (llm.c's): they were overwritten
    ("gpt-prepare", "shakespeare --out_dir {in}/llmc_shards",
     "error: {in}/llmc_shards holds shards that gpt-prepare did not write (shakespeare_train_000001.bin; no "
     "shakespeare_prepare.json): they would be overwritten; use another --out_dir, or move them away"),
    # a path component longer than file systems take, in every tool's path flags: one line (OSError: File name too
    # long, from the checks' own look at it, before)
    *((script, arguments.replace("LONG", "x" * 256), f"error: argument {flag}: a path component of 256 bytes, longer "
       f"than file systems take (255): " + "x" * 150 + "..." + "x" * 20 + " (256 characters)")
      for script, arguments, flag in [
          ("gpt-prepare", "shakespeare --out_dir LONG", "--out_dir"),
          ("gpt-prepare", "files LONG --out_dir {out}", "paths"),
          ("gpt-prepare", "shakespeare --out_dir {out} --cache_dir LONG", "--cache_dir"),
          ("gpt-prepare", "hub LONG --out_dir {out}", "dataset"),
          ("gpt-plan", "--ds_config LONG", "--ds_config"),
          ("gpt-eval", "--checkpoint LONG --data {data}", "--checkpoint"),
          ("gpt-eval", "--checkpoint {ckpt} --data LONG", "--data"),
          ("gpt-eval", "--checkpoint {ckpt} --hellaswag LONG", "--hellaswag"),
          ("gpt-sample", "--hf LONG", "--hf"),
          ("gpt-export", "LONG --out_dir {out}", "checkpoint"),
          ("gpt-export", "{ckpt} --out_dir LONG", "--out_dir")]),
]


def snapshot(*directories):
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for d in directories for p in sorted(d.rglob("*"))}


@pytest.mark.parametrize("script, arguments, expected", CASES,
                         ids=[f"{s}:{a.split(' --out_dir')[0][:60]}" for s, a, _ in CASES])
def test_bad_input_is_one_line_exit_1_and_changes_nothing(script, arguments, expected, bad_files, trained_checkpoint,
                                                          small_vocab_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # the scripts' default paths (ds_configs/...) are relative to the repository
    if "--device cuda" in arguments or "--measure" in arguments:  # a machine without CUDA, also on one with a GPU
        monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    out = tmp_path / "out"
    names = {"in": bad_files, "out": out, "ckpt": trained_checkpoint, "data": small_vocab_dir}
    before = snapshot(bad_files, trained_checkpoint.parent, small_vocab_dir)
    with pytest.raises(SystemExit) as exit_info:
        SCRIPTS[script]([a.format(**names) for a in arguments.split()])
    code, err = exit_info.value.code, capsys.readouterr().err
    if isinstance(code, str):  # sys.exit(message): Python prints it on stderr and exits with 1
        code, err = 1, err + code + "\n"
    expected = expected.format(**names)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith(expected[:-3]) if expected.endswith("...") else lines[0] == expected
    assert "Traceback" not in err
    assert snapshot(bad_files, trained_checkpoint.parent, small_vocab_dir) == before and not out.exists()


def test_the_flagged_cases_are_accepted_on_purpose(trained_checkpoint, bad_files, tmp_path, capsys):
    """An empty prompt starts a new document from <|endoftext|> (GPT-2's unconditional samples); gpt-eval's
    --val_tokens beyond the val split takes all of it, and says how much; an export over an earlier one
    replaces it with --overwrite."""
    sample_main(["--checkpoint", str(trained_checkpoint), "--prompt", "", "--max_new_tokens", "4"])
    out = capsys.readouterr().out
    assert "--- sample 0\n" in out and "<|endoftext|>" not in out.split("--- sample 0")[1]
    evaluate_main(["--checkpoint", str(trained_checkpoint), "--data", str(bad_files / "short_val"), "--seq_len",
                       "32", "--val_tokens", str(10**30), "--json"])  # all of its 100 tokens: 3 sequences of 32 + 1
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["val_tokens"] == 96
    exported = tmp_path / "hf"
    export_main([str(trained_checkpoint), "--out_dir", str(exported)])
    first = (exported / "model.safetensors").stat().st_mtime_ns
    export_main([str(trained_checkpoint), "--out_dir", str(exported), "--overwrite"])
    assert (exported / "model.safetensors").stat().st_mtime_ns > first and not list(exported.glob("*.tmp"))


def test_gpt_export_onto_a_full_disk_is_one_line_and_leaves_nothing(trained_checkpoint, tmp_path, monkeypatch, capsys):
    """safetensors' SafetensorError (no OSError) on a full disk used to escape as a traceback, beside a partial
    model.safetensors.tmp. (A real full tmpfs gives the same: tried by hand.)"""
    import safetensors.torch

    def full(tensors, path, metadata=None):
        Path(path).write_bytes(b"x" * 100)
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(SystemExit) as exit_info:
        export_main([str(trained_checkpoint), "--out_dir", str(tmp_path / "hf")])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.splitlines()[-1] == \
        f"error: {tmp_path / 'hf' / 'model.safetensors'}: no space left on the device"
    assert not (tmp_path / "hf").exists()


def test_gpt_export_auto_is_a_path(trained_checkpoint, tmp_path, monkeypatch, capsys):
    """'auto' names the newest checkpoint of a run's out_dir only to the trainer's --resume; gpt-export (like gpt-eval
    and gpt-sample) has no run's out_dir, so there it is a path like any other (it used to raise a TypeError)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "auto").mkdir()
    with pytest.raises(SystemExit) as exit_info:
        export_main(["auto", "--out_dir", "hf"])
    assert exit_info.value.code == 1 and not (tmp_path / "hf").exists()
    assert capsys.readouterr().err.splitlines()[-1] == "error: auto: no complete checkpoint found"
    (tmp_path / "auto").rmdir()
    shutil.copytree(trained_checkpoint, tmp_path / "auto")
    export_main(["auto", "--out_dir", "hf"])
    assert capsys.readouterr().out.startswith("exported auto -> hf") and (tmp_path / "hf" / "config.json").is_file()
