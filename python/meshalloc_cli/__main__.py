"""`python -m meshalloc_cli` is the `meshalloc` command."""

import sys

from .cli import main

sys.exit(main())
