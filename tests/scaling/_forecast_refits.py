"""tests/scaling/test_forecast.py's refits, in the suite's background lane (tests/conftest.py): the Table 1 curves
refitted as their evals arrive (default) or one run against three baselines (``baseline``); prints them as one JSON
line. Argument: the directory to write the runs in."""

import json
import sys

from test_forecast import baseline_refits, narrowing_refits  # this file's folder is on sys.path as a script

study = baseline_refits if sys.argv[2:] == ["baseline"] else narrowing_refits
print(json.dumps(study(sys.argv[1])))
