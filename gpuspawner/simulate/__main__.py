"""``python -m gpuspawner.simulate``: the simulator's command line
(:func:`gpuspawner.simulate.cli.main`)."""

import sys

from gpuspawner.simulate.cli import main

if __name__ == "__main__":
    sys.exit(main())
