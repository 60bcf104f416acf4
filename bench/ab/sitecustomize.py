"""Run a benchmark against another checkout's code: ``SIMSEARCH_SRC=<worktree>/src
PYTHONPATH=bench/ab python -m bench...`` (child processes inherit both).

An editable install (scikit-build-core) puts a finder ahead of ``sys.path`` that always resolves
``simsearch`` to this checkout, so ``PYTHONPATH=<worktree>/src`` alone silently measures the
current code. This drops that finder and puts the other source first; the compiled ``_simd``
module must have been copied into it (``cp $(python -c 'import simsearch._simd as m;
print(m.__file__)') <worktree>/src/simsearch/``).
"""

import os
import sys

_src = os.environ.get("SIMSEARCH_SRC")
if _src:
    sys.meta_path[:] = [f for f in sys.meta_path if "Redirecting" not in type(f).__name__]
    sys.path.insert(0, os.path.abspath(_src))
