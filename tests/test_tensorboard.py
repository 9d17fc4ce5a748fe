"""What TensorBoard shows of a run, asked through its HTTP API (the routes of the installed plugins:
tensorboard/plugins/*/*_plugin.py): the run's name, the scalars, the samples as text, the settings and final
metrics in hparams, the custom-scalars layout. The run is resumed once: both launches' events are one run."""
import ast
import html
import json
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from conftest import TINY, train
from gpt.dist import free_port
from gpt.metrics import LAYOUT

ARGS = [*TINY, "--total_batch_tokens", "512", "--lr", "3e-3", "--val_every", "2", "--val_tokens", "512",
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

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(out), "--host", "127.0.0.1",
                               "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run = "tensorboard/tiny_run"  # not ".": the name says which run it is
    try:
        scalars = wait_for(base, "/data/plugin/scalars/scalars", dict(run=run, tag="loss"),
                           lambda answer: len(answer) == len(losses), server)
        assert get(base, "/data/runs") == [run]
        tags = get(base, "/data/plugin/scalars/tags")[run]
        assert {"loss", "val_loss", "lr", "grad_norm", "dt", "tokens_per_s", "mfu", "peak_rss_gib"} <= set(tags)
        assert [(step, value) for _, step, value in scalars] == [(s, pytest.approx(v, rel=1e-6)) for s, v in losses]

        text_tag = "samples/text_summary"  # torch's add_text names the tag so
        assert get(base, "/data/plugin/text/tags") == {run: [text_tag]}
        texts = get(base, "/data/plugin/text/text", run=run, tag=text_tag)
        shown = {t["step"]: html.unescape(re.search(r"<pre><code>(.*)</code></pre>", t["text"], re.S)[1])
                 for t in texts}
        assert {step: text.strip("\n") for step, text in shown.items()} == {
            step: text.strip("\n") for step, text in samples.items()}

        experiment = get(base, "/data/plugin/hparams/experiment", {"experimentName": ""})
        names = {info["name"] for info in experiment["hparamInfos"]}
        assert {"model", "lr", "max_steps", "seed", "precision", "zero_stage", "world_size", "grad_accum",
                "model.n_layer", "hellaswag"} <= names
        assert [m["name"]["tag"] for m in experiment["metricInfos"]] == ["loss", "val_loss", "hellaswag/acc_norm"]
        groups = get(base, "/data/plugin/hparams/session_groups", {
            "experimentName": "", "allowedStatuses": STATUSES, "startIndex": 0, "sliceSize": 10,
            "colParams": []})["sessionGroups"]
        assert [g["name"] for g in groups] == [run]
        hparams = groups[0]["hparams"]
        assert {k: hparams[k] for k in ("model", "precision", "zero_stage", "grad_accum", "seed", "lr", "hellaswag",
                                        "deterministic", "max_steps")} == {
            "model": "tiny", "precision": "fp32", "zero_stage": 2, "grad_accum": 2, "seed": 1234, "lr": 3e-3,
            "hellaswag": "None", "deterministic": "False", "max_steps": 3}  # the first launch's settings
        final = {m["name"]["tag"]: (m["trainingStep"], m["value"]) for m in groups[0]["metricValues"]}
        assert final == {"loss": (4, pytest.approx(losses[-1][1], rel=1e-6)),
                         "val_loss": (4, pytest.approx(val_losses[-1][1], rel=1e-6))}  # no HellaSwag in this run
        assert groups[0]["sessions"][0]["status"] == "STATUS_SUCCESS"

        layout = get(base, "/data/plugin/custom_scalars/layout")
        charts = {category["title"]: {chart["title"]: chart["multiline"]["tag"] for chart in category["chart"]}
                  for category in layout["category"]}
        assert charts == {category: {title: tags for title, (_, tags) in chart.items()}
                          for category, chart in LAYOUT.items()}
        assert charts["loss"]["loss and val_loss"] == ["^loss$", "^val_loss$"]
        for regex, matched in [("^loss$|^val_loss$", ["loss", "val_loss"]),
                               (charts["memory"]["peak memory (GiB)"][0], ["peak_rss_gib"])]:  # CPU's memory metric
            chart = get(base, "/data/plugin/custom_scalars/scalars", run=run, tag=regex)
            assert sorted(chart["tag_to_events"]) == matched
    finally:
        server.kill()
        server.communicate()
