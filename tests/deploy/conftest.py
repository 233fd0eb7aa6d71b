from __future__ import annotations

import sys
from pathlib import Path

# deploy_files.py is imported as a plain module by this folder's tests, whatever pytest's
# import mode (prepend, or importlib, which puts no test folder on sys.path).
sys.path.insert(0, str(Path(__file__).parent))
