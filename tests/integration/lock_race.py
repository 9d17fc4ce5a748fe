"""train_ds.py as if its rank 0 lost the race for the run lock: every rank's look before the process group
(run_lock.check_unlocked) is skipped, so only rank 0's acquire, after the other ranks passed every check, finds
out_dir held. Run on two nodes of one rank each by tests/integration/test_run_lock.py."""
import train_ds
from gpt.train import run_lock

if __name__ == "__main__":
    run_lock.check_unlocked = lambda out_dir: None
    train_ds.main()
