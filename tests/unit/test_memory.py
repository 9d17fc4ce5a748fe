"""What the trainer does about memory outside the planner: the CUDA allocator setting it chooses (and
how the planner reads it back), and the per-step peak it logs."""
import mmap


from gpt.memory.plan import expandable_segments, use_expandable_segments
from gpt.runtime.memory import peak_memory, reset_peak_memory


def test_the_trainer_turns_on_expandable_segments_unless_the_user_chose():
    environ = {}
    assert use_expandable_segments(environ) == ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the trainer's "
                                                "default on CUDA: set the variable to choose otherwise)")
    assert environ == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} and expandable_segments(environ)
    mine = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}
    assert use_expandable_segments(mine) == "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512 (yours, kept)"
    assert mine == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"} and not expandable_segments(mine)
    assert expandable_segments({"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.8,expandable_segments:True"})
    assert not expandable_segments({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})


def test_the_cpu_peak_is_the_resident_peak_since_the_last_reset():
    reset_peak_memory("cpu")
    before = peak_memory("cpu")["peak_rss_gib"]
    # 256 MiB touched and unmapped: mapped directly, since malloc may serve a block from a free hole of its heap,
    # resident already (in-process runs keep freed memory while they train) or kept after the free
    with mmap.mmap(-1, 2**28) as block:
        block.write(b"\1" * 2**28)
    after = peak_memory("cpu")["peak_rss_gib"]
    assert after - before > 0.2  # the block's 0.25 GiB, though it is freed again
    reset_peak_memory("cpu")
    assert peak_memory("cpu")["peak_rss_gib"] < after - 0.2  # a new step starts a new peak
