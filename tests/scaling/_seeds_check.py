"""The pooled-seed fits of tests/scaling/test_seeds.py, run in the suite's background lane: prints what the tests
read as one JSON line."""

import json

from test_seeds import seeds_fits  # this file's folder is on sys.path when run as a script

print(json.dumps(seeds_fits(), default=float))
