"""The process's first step: silence other packages' deprecation warnings, then run the CLI.

A dependency's new release (cryptography deprecating DSA, which asyncssh touches at import)
must not write to a user's terminal or into `--json` output. Only deprecation-class and
import-time warnings raised from modules outside `tui` are ignored: specconsole's own warnings
and every other category still show. `SPECCONSOLE_DEPENDENCY_WARNINGS=1` shows them all again.
"""

from __future__ import annotations

import os
import warnings

# Categories that say "this will change", never "this went wrong".
QUIET_CATEGORIES: tuple[type[Warning], ...] = (
    DeprecationWarning, PendingDeprecationWarning, FutureWarning, ImportWarning)
# A module that is not specconsole's own: `tui` and `tui.…` excluded.
NOT_OURS = r"(?!tui(?:\.|$))"
SHOW_ENV = "SPECCONSOLE_DEPENDENCY_WARNINGS"


def quiet_dependency_warnings() -> None:
    """Ignore other packages' deprecation warnings, and cryptography's own deprecation class
    (a UserWarning subclass), ahead of any -W or PYTHONWARNINGS option."""
    if os.environ.get(SHOW_ENV) == "1":
        return
    categories: list[type[Warning]] = list(QUIET_CATEGORIES)
    try:  # cryptography is asyncssh's dependency; its own class is checked by name only
        from cryptography.utils import CryptographyDeprecationWarning
    except ImportError:
        pass
    else:
        categories.append(CryptographyDeprecationWarning)
    for category in categories:
        warnings.filterwarnings("ignore", category=category, module=NOT_OURS)


def main() -> int:
    quiet_dependency_warnings()
    from tui.cli.main import main as run_cli

    return run_cli()
