"""Build hook: compiles the audit's native core (rollout_audit/frames/_native.c) with the
machine's C compiler and the running Python's headers, for `pip install -e .` and `pip wheel .`.

Nothing is downloaded: the compiler is the one Python was configured with (`sysconfig`'s CC,
`cc` otherwise). When it is missing or the compile fails, the build goes on without the module
and says so: the package then uses its pure-Python path (`rollout_audit.frames.native`), with
identical results. `ROLLOUT_AUDIT_NO_NATIVE=1` skips the compile.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # imported outside a build (tests/test_native.py compiles with `compile_native`)
    BuildHookInterface = object  # type: ignore[assignment, misc]

SOURCE = Path("rollout_audit") / "frames" / "_native.c"
MODULE = "rollout_audit/frames/_native"


def compile_native(root: Path, out_dir: Path) -> Path:
    """Compile the extension into `out_dir`; returns the shared object's path."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    if not shutil.which(cc[0]):
        raise RuntimeError(f"no C compiler ({cc[0]})")
    target = out_dir / ("_native" + suffix)
    include = sysconfig.get_paths()["include"]
    cmd = [*cc, "-O2", "-ffp-contract=off", "-fPIC", "-shared", "-I", include, str(root / SOURCE), "-o", str(target)]
    if sys.platform == "darwin":
        cmd[1:1] = ["-undefined", "dynamic_lookup"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{shlex.join(cmd)} failed:\n{done.stderr.strip()}")
    return target


class NativeHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if os.environ.get("ROLLOUT_AUDIT_NO_NATIVE") == "1":
            return
        root = Path(self.root)
        started = time.perf_counter()
        try:
            if version == "editable":  # the source tree is what the editable install imports
                built = compile_native(root, root / SOURCE.parent)
            else:
                built = compile_native(root, Path(tempfile.mkdtemp(prefix="rollout-audit-native-")))
                build_data["force_include"][str(built)] = MODULE + built.name[len("_native") :]
        except (RuntimeError, OSError) as exc:
            self.app.display_warning(f"rollout-audit: native core not built, the pure-Python path is used ({exc})")
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        self.app.display_info(f"rollout-audit: native core {built.name} built in {time.perf_counter() - started:.2f} s")
