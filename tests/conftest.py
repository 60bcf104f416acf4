import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # lets tests import the shared `contract` cases
