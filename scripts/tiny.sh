#!/usr/bin/env bash
# Set up .venv and run the whole ScaleRL recipe on the tiny CPU default. Extra args go to experiments.math_8b.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh" ""
exec .venv/bin/python -m experiments.math_8b --preset tiny "$@"
