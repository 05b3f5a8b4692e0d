import sys

from gencraft.cli.main import main

sys.exit(main())
