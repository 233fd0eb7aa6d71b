from __future__ import annotations

from dynspec.bench.cli import main

main()
