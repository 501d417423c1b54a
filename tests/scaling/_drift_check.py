"""The drifting-policy fits of tests/scaling/test_scaling_bayes.py, run in the suite's background lane (half a minute
of one process): prints both likelihoods' coverage as one JSON line."""

import json

from test_scaling_bayes import drift_fits  # this file's folder is on sys.path when run as a script

print(json.dumps(drift_fits()))
