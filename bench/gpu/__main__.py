from __future__ import annotations

from dynspec.bench.gpu.cli import main

main()
