from __future__ import annotations

from dynspec.launcher.sim.cli import main

if __name__ == "__main__":
    main()
