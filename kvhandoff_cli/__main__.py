"""`python -m kvhandoff_cli`: the `kvhandoff` command."""

import sys

from kvhandoff_cli.main import main

sys.exit(main())
