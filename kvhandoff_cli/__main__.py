"""`python -m kvhandoff`: the `kvhandoff` command."""

import sys

from kvhandoff.cli.main import main

sys.exit(main())
