from __future__ import annotations

import sys
from pathlib import Path

# tests/utils.py is imported as a plain module by every test package.
sys.path.insert(0, str(Path(__file__).parent))
