"""The calibration fits of tests/scaling/test_scaling_bayes.py, run in the suite's background lane (a minute of one
process): prints what the tests read of the 100 posteriors as one JSON line."""

import json

from test_scaling_bayes import calibration_fits  # this file's folder is on sys.path when run as a script

print(json.dumps(calibration_fits()))
