"""tests/scaling/test_forecast.py's refits of the Table 1 curves as their evals arrive, in the suite's background
lane (tests/conftest.py): prints them as one JSON line. Argument: the directory to write the runs in."""

import json
import sys

from test_forecast import narrowing_refits  # this file's folder is on sys.path when run as a script

print(json.dumps(narrowing_refits(sys.argv[1])))
