"""tests/test_presets.py's runs of every variant, in the suite's background lane (tests/conftest.py): prints each
variant's step count and metrics rows as one JSON line. Argument: the directory to write in."""

import json
import sys

from tests.test_presets import variant_runs

print(json.dumps(variant_runs(sys.argv[1])))
