"""Corpus -> shards: every source, whole-document validation split, fixed-size train shards, workers,
resume after an interruption, and clear errors (gpt-prepare as a process: tests/integration/test_prepare_runs.py)."""
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpt.commands.prepare import main
from gpt.console import BadInput
from gpt.data.shard_writer import ShardWriter
from gpt.data.shards import find_shards, load_shard
from gpt.data.prepare import Corpus, prepare
from gpt.data.tokenizer import EOT_TOKEN, gpt2_tokenizer

DOCUMENTS = [f"Document {i}: " + "word " * (i % 37) + "end." for i in range(300)]
SETTINGS = {"source": "test"}


def all_tokens(out_dir, name="corpus"):
    return [load_shard(p).tolist() for split in ("val", "train") for p in find_shards(out_dir, split)]


def expected_tokens(documents):
    return [t for doc in documents for t in [EOT_TOKEN] + gpt2_tokenizer().encode_ordinary(doc)]


def test_files_become_fixed_size_shards_after_a_whole_document_val_split(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(DOCUMENTS)))
    main(["files", str(path), "--out_dir", str(tmp_path / "out"), "--shard_tokens", "1000", "--val_tokens", "300"])
    shards = all_tokens(tmp_path / "out")
    flat = [t for shard in shards for t in shard]
    assert flat == expected_tokens(DOCUMENTS)  # round trip, in order, EOT before every document
    val, *train = shards
    assert val[0] == EOT_TOKEN and flat[len(val)] == EOT_TOKEN  # val ends on a document boundary
    assert 300 <= len(val) < 300 + 60
    assert [len(s) for s in train[:-1]] == [1000] * (len(train) - 1) and 0 < len(train[-1]) <= 1000
    decoded = gpt2_tokenizer().decode(flat)
    assert decoded == "".join(gpt2_tokenizer().decode([EOT_TOKEN]) + d for d in DOCUMENTS)


@pytest.mark.parametrize("kind", ["txt", "parquet"])
def test_text_and_parquet_files(tmp_path, kind):
    docs = DOCUMENTS[:20]
    if kind == "txt":
        for i, doc in enumerate(docs):
            (tmp_path / f"doc{i:03d}.txt").write_text(doc)
        pattern = str(tmp_path / "doc*.txt")
    else:
        pq.write_table(pa.table({"content": docs}), tmp_path / "part.parquet")
        pattern = str(tmp_path / "*.parquet")
    extra = [] if kind == "txt" else ["--text_field", "content"]
    main(["files", pattern, "--out_dir", str(tmp_path / "out"), "--val_tokens", "50", *extra])
    assert [t for s in all_tokens(tmp_path / "out") for t in s] == expected_tokens(docs)


def test_workers_write_the_same_shards(tmp_path):
    for workers in (1, 2):
        prepare(Corpus(iter(DOCUMENTS)), tmp_path / f"w{workers}", "c", 700, 200, workers, SETTINGS)
    for a, b in zip(sorted((tmp_path / "w1").glob("*.bin")), sorted((tmp_path / "w2").glob("*.bin"))):
        assert a.read_bytes() == b.read_bytes()


def test_an_interrupted_prepare_resumes_where_it_stopped(tmp_path, monkeypatch):
    prepare(Corpus(iter(DOCUMENTS)), tmp_path / "whole", "c", 700, 200, 1, SETTINGS)

    def crashing(documents, after):
        for i, doc in enumerate(documents):
            if i == after:
                raise KeyboardInterrupt
            yield doc

    monkeypatch.setattr("gpt.data.prepare.DOCUMENTS_PER_TASK", 16)  # several tasks, so shards complete before the crash
    with pytest.raises(KeyboardInterrupt):
        prepare(Corpus(crashing(DOCUMENTS, 170)), tmp_path / "resumed", "c", 700, 200, 1, SETTINGS)
    written = sorted(p.name for p in (tmp_path / "resumed").glob("*.bin"))
    assert 1 < len(written) < len(list((tmp_path / "whole").glob("*.bin")))  # some shards done, not all
    prepare(Corpus(iter(DOCUMENTS)), tmp_path / "resumed", "c", 700, 200, 1, SETTINGS)
    for whole in sorted((tmp_path / "whole").glob("*.bin")):
        assert (tmp_path / "resumed" / whole.name).read_bytes() == whole.read_bytes(), whole.name
    assert not list((tmp_path / "resumed").glob("*.tmp"))
    # a third run finds everything complete and writes nothing
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "resumed").glob("*.bin")}
    prepare(Corpus(iter(DOCUMENTS)), tmp_path / "resumed", "c", 700, 200, 1, SETTINGS)
    assert before == {p: p.stat().st_mtime_ns for p in (tmp_path / "resumed").glob("*.bin")}


def test_a_preparation_killed_between_a_shard_and_its_record_resumes(tmp_path, monkeypatch):
    """The shard it wrote last is on disk but not in the progress file: the next shard written, so written again."""
    prepare(Corpus(iter(DOCUMENTS)), tmp_path / "whole", "c", 700, 200, 1, SETTINGS)
    save = ShardWriter._save

    def killed_at_the_third_record(writer):
        if len(writer.progress["shards"]) == 3:
            raise KeyboardInterrupt
        save(writer)
    monkeypatch.setattr(ShardWriter, "_save", killed_at_the_third_record)
    with pytest.raises(KeyboardInterrupt):
        prepare(Corpus(iter(DOCUMENTS)), tmp_path / "resumed", "c", 700, 200, 1, SETTINGS)
    monkeypatch.setattr(ShardWriter, "_save", save)
    assert (tmp_path / "resumed" / "c_train_000002.bin").exists()
    assert json.loads((tmp_path / "resumed" / "c_prepare.json").read_text())["shards"] == ["c_val_000000.bin",
                                                                                          "c_train_000001.bin"]
    prepare(Corpus(iter(DOCUMENTS)), tmp_path / "resumed", "c", 700, 200, 1, SETTINGS)
    assert {p.name: p.read_bytes() for p in (tmp_path / "resumed").glob("*.bin")} == {
        p.name: p.read_bytes() for p in (tmp_path / "whole").glob("*.bin")}


def test_own_named_shards_the_progress_file_does_not_list_are_refused(tmp_path):
    """A shard of this name that gpt-prepare did not write (another tool's, copied in) beside a progress file: it was
    overwritten, or (a finished preparation) trained on with the corpus."""
    out = tmp_path / "out"
    prepare(Corpus(iter(DOCUMENTS)), out, "c", 700, 200, 1, SETTINGS)
    (out / "c_train_000099.bin").write_bytes(bytes(1024 + 64))
    before = {p: p.stat().st_mtime_ns for p in out.iterdir()}
    with pytest.raises(BadInput) as refused:
        prepare(Corpus(iter(DOCUMENTS)), out, "c", 700, 200, 1, SETTINGS)
    assert str(refused.value) == (f"{out} holds shards that gpt-prepare did not write (c_train_000099.bin; not in "
                                  f"c_prepare.json): they would be overwritten, or trained on with this corpus; use "
                                  f"another --out_dir, or move them away")
    assert {p: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_hub_source_reads_a_local_dataset_directory(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "train.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCUMENTS[:30]))
    main(["hub", str(tmp_path / "ds"), "--out_dir", str(tmp_path / "out"), "--val_tokens", "100"])
    assert [t for s in all_tokens(tmp_path / "out") for t in s] == expected_tokens(DOCUMENTS[:30])
    assert find_shards(tmp_path / "out", "train")[0].name == "ds_train_000001.bin"


def test_a_directory_where_a_shard_goes_is_one_line_and_leaves_no_partial_file(tmp_path, capsys):
    """os.replace onto a directory used to print `[Errno 21] Is a directory: '...bin.tmp' -> '...bin'` and leave
    the .tmp shard behind."""
    text = tmp_path / "docs.jsonl"
    text.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCUMENTS[:20]))
    out = tmp_path / "out"
    (out / "corpus_val_000000.bin").mkdir(parents=True)
    with pytest.raises(SystemExit) as exit_info:
        main(["files", str(text), "--out_dir", str(out), "--val_tokens", "50"])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {out}/corpus_val_000000.bin: Is a directory"
    assert sorted(p.name for p in out.iterdir()) == ["corpus_val_000000.bin"]  # no .tmp, no progress file


def test_a_full_disk_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path / "out" / "corpus_val_000000.bin.tmp"))
    monkeypatch.setattr("gpt.data.shard_writer.write_shard", full)
    text = tmp_path / "docs.jsonl"
    text.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCUMENTS[:20]))
    with pytest.raises(SystemExit) as exit_info:
        main(["files", str(text), "--out_dir", str(tmp_path / "out"), "--val_tokens", "50"])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.splitlines()[-1] == \
        f"error: {tmp_path}/out/corpus_val_000000.bin.tmp: no space left on the device"
