"""`python -m rollout_audit.dev generate` (see `rollout_audit.dev.generate`),
`python -m rollout_audit.dev fixtures --check` (see `rollout_audit.dev.fixtures`) and
`python -m rollout_audit.dev house` (see `rollout_audit.dev.house`)."""

import sys

if sys.argv[1:2] == ["fixtures"]:
    from .fixtures import main as fixtures

    sys.exit(fixtures(sys.argv[2:]))
if sys.argv[1:2] == ["house"]:
    from .house import main as house

    sys.exit(house(sys.argv[2:]))
from .generate import main

sys.exit(main())
