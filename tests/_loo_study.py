"""tests/test_loo.py's studies, in the suite's background lane (tests/conftest.py): the micro study (default) or the
comparison of hand-written seeds (``compare``); prints the result as one JSON line. Argument: the directory to write
in."""

import json
import sys

from tests.test_loo import micro_study, seeds_compared

study = seeds_compared if sys.argv[2:] == ["compare"] else micro_study
print(json.dumps(study(sys.argv[1]), default=float))
