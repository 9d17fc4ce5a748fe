"""TensorBoard's tags: every one in a section, the losses' first; a run begun with the former flat tags keeps them
when resumed. (What TensorBoard shows of a run: tests/integration/test_tensorboard_runs.py.)"""
import json

from gpt.train.metrics import HPARAM_METRICS, TAGS, MetricsLogger, events_dir


def scalar_tags(events):
    """The scalar tags in the events files of a directory, in the order written."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    return [value.tag for path in sorted(events.glob("events.out.tfevents.*"))
            for event in EventFileLoader(str(path)).Load() for value in event.summary.value
            if value.HasField("simple_value") or value.metadata.plugin_data.plugin_name == "scalars"]


def test_a_run_begun_with_flat_tags_keeps_them_when_resumed_and_a_new_run_has_sections(tmp_path):
    """Tags in sections from 2026-11-26 on; a run whose events already hold the flat `loss` (logged before) goes on
    under the flat tags, so its charts continue instead of starting again under new names. metrics.jsonl keeps its
    keys either way."""
    from torch.utils.tensorboard import SummaryWriter
    old = tmp_path / "old_run"
    with SummaryWriter(log_dir=str(events_dir(old))) as writer:  # as the trainer wrote them before
        writer.add_scalar("loss", 10.9, 0)
        writer.add_scalar("lr", 1e-4, 0)
    new = tmp_path / "new_run"
    for out in (old, new):
        logger = MetricsLogger(out, enabled=True)
        logger.log(1, {"loss": 10.5, "lr": 2e-4, "val_loss": 10.6})
        logger.close()
    assert scalar_tags(events_dir(old)) == ["loss", "lr", "loss", "lr", "val_loss"]
    assert scalar_tags(events_dir(new)) == ["loss/train", "optim/lr", "loss/val"]
    for out in (old, new):
        assert json.loads((out / "metrics.jsonl").read_text()) == {"step": 1, "loss": 10.5, "lr": 2e-4, "val_loss": 10.6}


def test_every_tag_is_in_a_section_and_the_losses_section_sorts_first():
    """The dashboards order sections by name: no section may sort before the losses'; the hparams' metrics are
    logged tags."""
    sections = sorted({tag.split("/")[0] for tag in TAGS.values()})
    assert sections[0] == "loss" and all(tag.count("/") == 1 for tag in TAGS.values())
    assert set(HPARAM_METRICS) <= set(TAGS)
