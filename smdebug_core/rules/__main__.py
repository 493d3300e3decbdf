"""``python -m smdebug.rules``: the ``smdebug-rules`` command of earlier releases."""
import sys

from ..analysis.rules.cli import main

sys.exit(main())
