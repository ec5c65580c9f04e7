"""`python -m rollout_audit.dev generate` (see `rollout_audit.dev.generate`) and
`python -m rollout_audit.dev fixtures --check` (see `rollout_audit.dev.fixtures`)."""

import sys

if sys.argv[1:2] == ["fixtures"]:
    from .fixtures import main as fixtures

    sys.exit(fixtures(sys.argv[2:]))
from .generate import main

sys.exit(main())
