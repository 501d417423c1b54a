"""tests/test_loo.py's micro study, run in the suite's background lane (tests/conftest.py): prints each call's exit
status and output, and where the study wrote, as one JSON line. Argument: the directory to write in."""

import json
import sys

from tests.test_loo import micro_study

print(json.dumps(micro_study(sys.argv[1])))
