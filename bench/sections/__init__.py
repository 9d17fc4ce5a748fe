"""bench/train.py's sections, one module each: COLUMNS (the table), measure(...) (its rows), and for those that
relaunch bench/train.py, worker(args). Imported as a sibling of the scripts (bench/ on sys.path)."""
