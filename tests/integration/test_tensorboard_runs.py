"""What TensorBoard shows of a run, asked through its HTTP API (the routes of the installed plugins:
tensorboard/plugins/*/*_plugin.py): the run's name, the scalars in sections with the losses first, the samples
and the whole settings as text, the settings people compare and the final metrics in hparams (the main five
first, no setting named as a metric), the custom-scalars layout. The run is resumed once: both launches' events
are one run. (The tags themselves: tests/unit/test_tensorboard.py.)"""
import ast
import html
import json
import os
import re
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from conftest import GPT2_VOCAB, REPO, TINY, train
from gpt.runtime.ranks import free_port
from gpt.train.metrics import MAIN_HPARAMS, layout, sectioned_tag

ARGS = [*TINY, *GPT2_VOCAB, "--total_batch_tokens", "512", "--lr", "3e-3", "--val_every", "2", "--val_tokens", "512",
        "--sample_every", "2", "--sample_tokens", "8"]
STATUSES = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]


def get(base, route, body=None, **query):
    """The JSON answer of GET route?query, or of a POST of `body` (JSON) when given."""
    route += "?" + urllib.parse.urlencode(query) if query else ""
    request = urllib.request.Request(base + route, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def wait_for(base, route, query, ready, server, timeout_s=90):
    """GET route?query until ready(answer): TensorBoard serves before it has read every events file."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert server.poll() is None, server.communicate()[0]
        try:
            answer = get(base, route, **query)
            if ready(answer):
                return answer
        except OSError:  # not listening yet
            pass
        assert time.monotonic() < deadline, f"TensorBoard did not show {route} in {timeout_s}s"
        time.sleep(0.5)


def samples_of(stdout):
    """step -> the sample text of the console's `sample at step N: '...'` lines."""
    return {int(step): ast.literal_eval(text) for step, text in re.findall(r"sample at step (\d+): (.*)", stdout)}


@pytest.mark.slow
def test_tensorboard_shows_the_runs_scalars_samples_settings_and_layout(tmp_path, shakespeare_dir):
    out = tmp_path / "tiny_run"
    _, first = train(out, shakespeare_dir, *ARGS, "--max_steps", "3")
    records, resumed = train(out, shakespeare_dir, *ARGS, "--max_steps", "5", "--resume", "auto")
    samples = {**samples_of(first.stdout), **samples_of(resumed.stdout)}
    assert sorted(samples) == [0, 2, 4]
    assert len(list((out / "tensorboard" / "tiny_run").glob("events.out.tfevents.*"))) == 2  # one per launch
    losses = [(r["step"], r["loss"]) for r in records if "loss" in r]
    val_losses = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    assert [step for step, _ in losses] == [0, 1, 2, 3, 4] and [step for step, _ in val_losses] == [0, 2, 4]
    assert all(0 < r["mfu"] < 1 for r in records if "loss" in r)  # against the peak the CPU declares

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # as a user starts it, from the directory the run is in, with the path as they would type it there
    server = subprocess.Popen(["bash", str(REPO / "launch" / "tensorboard.sh"), out.name], cwd=tmp_path,
                              env={**os.environ, "PORT": str(port)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    run = "tensorboard/tiny_run"  # not ".": the name says which run it is
    try:
        scalars = wait_for(base, "/data/plugin/scalars/scalars", dict(run=run, tag="loss/train"),
                           lambda answer: len(answer) == len(losses), server)
        assert get(base, "/data/runs") == [run]
        tags = get(base, "/data/plugin/scalars/tags")[run]
        assert {"loss/train", "loss/val", "optim/lr", "optim/grad_norm", "perf/dt", "perf/tokens_per_s", "perf/mfu",
                "memory/peak_rss_gib"} <= set(tags)
        sections = sorted({tag.split("/")[0] for tag in tags})  # the dashboards' order: one section per prefix
        assert sections[0] == "loss" and sorted(t for t in tags if t.startswith("loss/")) == ["loss/train", "loss/val"]
        assert all("/" in tag for tag in tags)  # no flat tag left outside a section
        assert [(step, value) for _, step, value in scalars] == [(s, pytest.approx(v, rel=1e-6)) for s, v in losses]

        sample_tag, settings_tag = "samples/text_summary", "settings/text_summary"  # torch's add_text names them so
        assert sorted(get(base, "/data/plugin/text/tags")[run]) == [sample_tag, settings_tag]
        texts = get(base, "/data/plugin/text/text", run=run, tag=sample_tag)
        shown = {t["step"]: html.unescape(re.search(r"<pre><code>(.*)</code></pre>", t["text"], re.S)[1])
                 for t in texts}
        assert {step: text.strip("\n") for step, text in shown.items()} == {
            step: text.strip("\n") for step, text in samples.items()}
        settings = {t["step"]: json.loads(html.unescape(re.search(r"<pre><code>(.*)</code></pre>", t["text"], re.S)[1]))
                    for t in get(base, "/data/plugin/text/text", run=run, tag=settings_tag)}
        assert sorted(settings) == [0, 3]  # each launch's whole record, at its first step
        assert [settings[step]["args"]["max_steps"] for step in (0, 3)] == [3, 5]
        assert settings[0]["args"]["val_tokens"] == 512 and settings[0]["model"]["n_layer"] == 2

        experiment = get(base, "/data/plugin/hparams/experiment", {"experimentName": ""})
        names = [info["name"] for info in experiment["hparamInfos"]]
        assert names[:5] == list(MAIN_HPARAMS)  # the columns HParams shows without a tick
        assert names[5:] == ["setup/compile", "setup/ds_config", "setup/loss", "setup/lr_schedule", "setup/seed",
                             "setup/total_batch_tokens", "setup/warmup_steps", "setup/zero_stage"]
        metric_tags = [m["name"]["tag"] for m in experiment["metricInfos"]]
        assert metric_tags == ["loss/train", "loss/val", "score/hellaswag_acc_norm"]
        assert not set(names) & (set(tags) | set(metric_tags)), "a setting named as a metric"
        groups = get(base, "/data/plugin/hparams/session_groups", {
            "experimentName": "", "allowedStatuses": STATUSES, "startIndex": 0, "sliceSize": 10,
            "colParams": []})["sessionGroups"]
        assert [g["name"] for g in groups] == [run]
        hparams = groups[0]["hparams"]
        assert {k: hparams[k] for k in names} == {
            "batch": "4 x 2 x 1 rank(s) = 512 tokens", "lr": 3e-3, "model": "tiny: 2 layers x 64, 2 heads",
            "precision": "fp32", "seq_len": 64, "setup/compile": "False", "setup/ds_config": settings[0]["args"]["ds_config"],
            "setup/loss": "fused (chunked PyTorch)", "setup/seed": 1234, "setup/total_batch_tokens": 512,
            "setup/lr_schedule": "cosine: warmup 2 steps, cosine decay to peak x 0.1 at step 3",
            "setup/warmup_steps": settings[0]["args"]["warmup_steps"], "setup/zero_stage": 2}  # the first launch's
        final = {m["name"]["tag"]: (m["trainingStep"], m["value"]) for m in groups[0]["metricValues"]}
        assert final == {"loss/train": (4, pytest.approx(losses[-1][1], rel=1e-6)),
                         "loss/val": (4, pytest.approx(val_losses[-1][1], rel=1e-6))}  # no HellaSwag in this run
        assert groups[0]["sessions"][0]["status"] == "STATUS_SUCCESS"

        answer = get(base, "/data/plugin/custom_scalars/layout")
        charts = {category["title"]: {chart["title"]: chart["multiline"]["tag"] for chart in category["chart"]}
                  for category in answer["category"]}
        assert charts == {category: {title: tags for title, (_, tags) in chart.items()}
                          for category, chart in layout(sectioned_tag).items()}
        assert charts["loss"]["loss and val_loss"] == ["^loss/train$", "^loss/val$"]
        for regex, matched in [("^loss/train$|^loss/val$", ["loss/train", "loss/val"]),
                               (charts["memory"]["peak memory (GiB)"][2], ["memory/peak_rss_gib"])]:  # CPU's memory
            chart = get(base, "/data/plugin/custom_scalars/scalars", run=run, tag=regex)
            assert sorted(chart["tag_to_events"]) == matched
    finally:
        server.kill()
        server.communicate()
