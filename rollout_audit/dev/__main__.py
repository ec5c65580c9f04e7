"""`python -m rollout_audit.dev generate`: see `rollout_audit.dev.generate`."""

import sys

from .generate import main

sys.exit(main())
