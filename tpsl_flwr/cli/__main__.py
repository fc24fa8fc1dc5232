"""``python -m tpsl_flwr.cli``: the ``tpsl-flwr`` command."""

import sys

from tpsl_flwr.cli.main import main

sys.exit(main())
