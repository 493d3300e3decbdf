"""``python -m smdebug``: the ``smdebug`` command."""
import sys

from .cli import main

sys.exit(main())
