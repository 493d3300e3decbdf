"""``python -m smdebug``: the ``smdebug`` command."""
import sys

from .analysis.cli import main

sys.exit(main())
