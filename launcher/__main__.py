from __future__ import annotations

from dynspec.launcher.cli import main

main()
