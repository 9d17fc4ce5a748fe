"""TensorBoard's tags: every one in a section, the losses' first; a run begun with the former flat tags keeps them
when resumed; a resumed run's events start where its checkpoint was. (What TensorBoard shows of a run: tests/integration/test_tensorboard_runs.py.)"""
import json

from gpt.train.metrics import HPARAM_METRICS, TAGS, MetricsLogger, events_dir


def written_order(path):
    """An events file's place among those one process wrote: events.out.tfevents.<second>.<host>.<pid>.<count>, the
    count numeric (by name alone, a count of 10 would sort before 9 within one second)."""
    fields = path.name.split(".")
    return int(fields[3]), int(fields[-1])


def scalar_tags(events):
    """The scalar tags in the events files of a directory, in the order written."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    return [value.tag for path in sorted(events.glob("events.out.tfevents.*"), key=written_order)
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


def test_a_resumed_runs_events_start_where_its_checkpoint_was(tmp_path):
    """A run killed at step 5, after its checkpoint of step 3, resumed at step 4: TensorBoard's own reader returned
    loss/train at steps 0..5, 4, 5, 6, 7 (both launches' events, the steps taken again twice and out of order)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    killed = MetricsLogger(tmp_path, enabled=True)
    killed.continue_from(0)
    for step in range(6):
        killed.log(step, {"loss": 10.0 - step})
    killed.close()
    first = next(events_dir(tmp_path).glob("events.out.tfevents.*"))  # named as an earlier second's launch names it
    first.rename(first.with_name("events.out.tfevents.0000000001.host.1.0"))  # (the same second: ordered by a count)
    resumed = MetricsLogger(tmp_path, enabled=True)
    resumed.continue_from(4)
    for step in range(4, 8):
        resumed.log(step, {"loss": 20.0 + step})
    resumed.close()
    scalars = EventAccumulator(str(events_dir(tmp_path))).Reload().Scalars("loss/train")
    assert [(scalar.step, scalar.value) for scalar in scalars] == [
        (0, 10.0), (1, 9.0), (2, 8.0), (3, 7.0), (4, 24.0), (5, 25.0), (6, 26.0), (7, 27.0)]
