"""`python -m rollout_audit.cli`: the command line, as the `rollout-audit` script runs it."""

from .main import main

main()
