from __future__ import annotations

from dynspec.router.cli import main

if __name__ == "__main__":
    main()
