"""``python -m smdebug.rules``: the ``smdebug-rules`` command."""
import sys

from .cli import main

sys.exit(main())
